"""Data-parallel training on CPU: `train_step` on the tiny Qwen3-VL sharded with FSDP2 over 2 gloo ranks
(and over 1) gives the same loss, gradient norm and updated weights as the plain model in one process, on
the same global batch: text-only and image samples, several micro-batches per rank with unequal counts,
mini-batches that leave a rank with nothing, clipping, activation checkpointing, SGD and AdamW.

The ranks are real torchrun workers (`torchrun --standalone`, this module as their entry point):
`init_distributed` then reads exactly the environment it reads in production, the rendezvous picks its own
free port (no probe-then-bind race), and torchrun tears every rank down when one fails, so a broken
collective ends the run with an error instead of a hang (and a deadline kills the whole process group).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

import io
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw
from transformers import Qwen3VLForConditionalGeneration

from guirl.inference.chat import ChatRenderer
from guirl.learner.fsdp import split_for_rank
from guirl.learner.samples import TrainSample, pack_microbatches
from guirl.learner.step import train_step
from guirl.messages.types import ChatMessage, ImagePart, TextPart
from tests.helpers import shared_tiny

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 120.0  # torchrun + 2 ranks importing torch/transformers + 3 steps take ~15 s on 2 cores
LOSS_TOL = 1e-5


@dataclass(frozen=True)
class Case:
    """One `train_step` configuration, run on a fresh model from the checkpoint."""

    name: str
    loss_agg: str
    minibatches: int
    max_tokens: int
    max_grad_norm: float
    optimizer: str
    lr: float
    activation_checkpointing: bool = False
    weight_tol: float = 4e-6
    """Largest allowed |weight difference| after the step (the updates are 1e-3 .. 1 in size). The update
    lr * g of the largest (~1) differs between ranks and one process by a few parts in 1e6 of itself: the
    gradient is summed in another order (over ranks, micro-batches, a CPU's vector width)."""


CASES = [
    # Several micro-batches per rank, unequal counts; clip inactive so a scale error shows in the update.
    Case("token-mean", "token-mean", 1, 200, 1e9, "sgd", 5.0),
    # Parts of 2, 2, 1, 1 samples: a rank has nothing in the last two; an active clip; recomputation.
    Case("seq-minibatches-clip", "seq-mean-token-mean", 4, 10_000, 0.05, "sgd", 1.0, True),
    # The first AdamW step is sign-like: it checks the sharded optimizer state, not the gradient's scale.
    # An element whose gradient is within rounding of 0 (|g| ~ Adam's eps) moves by a fraction g / (|g| + eps)
    # of lr, which rounding changes: the tolerance is 2.5 % of lr (a wrong sign would miss by 2 lr).
    Case("adamw", "seq-mean-token-sum", 1, 10_000, 1.0, "adamw", 1e-3, weight_tol=2.5e-5),
]
STEP = {"eps_clip": 0.2, "eps_clip_high": 0.28, "tis_cap": 2.0}


def png(width: int, height: int, seed: int) -> bytes:
    img = Image.new("RGB", (width, height), (40 * seed % 256, 120, 200))
    ImageDraw.Draw(img).rectangle([width // 4, height // 3, width // 2 + seed, height // 2], fill=(250,) * 3)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def fixed_samples(renderer: ChatRenderer) -> list[TrainSample]:
    """Six deterministic samples: prompts rendered by the checkpoint's renderer (0, 1 or 2 images), fixed
    responses, made-up behaviour log-probs around the random model's -log V (so the truncated importance
    weight varies, some capped) and advantages of both signs."""
    prompts = [
        ([TextPart("Open the file menu and pick Save.")], []),
        ([ImagePart(0), TextPart("Click OK.")], [png(64, 48, 1)]),
        ([TextPart("Type hello into the search box, then press enter.")], []),
        (
            [TextPart("Before: "), ImagePart(0), TextPart(" after: "), ImagePart(1)],
            [png(96, 64, 2), png(64, 64, 3)],
        ),
        ([TextPart("Scroll down.")], []),
        ([ImagePart(0), TextPart("Close the dialog.")], [png(128, 96, 4)]),
    ]
    responses = ["Action: click", "Action: type hello", "Done.", "Action: scroll(3)", "ok", "Action: wait"]
    advantages = [1.0, -1.0, 0.5, -0.5, 0.8, -0.3]
    samples = []
    for i, ((parts, images), text, adv) in enumerate(zip(prompts, responses, advantages)):
        messages = [
            ChatMessage(role="system", parts=[TextPart("You are a GUI agent.")]),
            ChatMessage(role="user", parts=parts),
        ]
        prompt = renderer.render(messages, images).input_ids
        response = renderer.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        behaviour = [-6.9 + 0.6 * ((7 * i + 3 * j) % 5 - 2) for j in range(len(response))]
        samples.append(
            TrainSample(
                prompt_ids=prompt,
                response_ids=response,
                behaviour_logprobs=behaviour,
                images=images,
                advantage=adv,
                policy_version=0,
                episode_id=f"ep{i}",
                step=0,
                group_id="g",
            )
        )
    return samples


def load_model(ckpt: Path) -> torch.nn.Module:
    return Qwen3VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32)


def run_case(
    case: Case, model: torch.nn.Module, renderer: ChatRenderer, samples: list, dist_info: Any
) -> dict:
    if case.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=case.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=case.lr, weight_decay=0.0)
    return train_step(
        model,
        optimizer,
        samples,
        renderer,
        loss_agg=case.loss_agg,  # type: ignore[arg-type]
        max_tokens=case.max_tokens,
        minibatches=case.minibatches,
        max_grad_norm=case.max_grad_norm,
        dist_info=dist_info,
        **STEP,
    )


# -- the torchrun worker ---------------------------------------------------------------------------------


def worker(ckpt: Path, out_dir: Path) -> None:
    """One rank: every case on a fresh FSDP2-sharded model; rank 0 writes metrics and full state dicts."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from guirl.learner.fsdp import full_state_dict, init_distributed, shard_model

    info = init_distributed()
    assert info.initialized and info.device.type == "cpu", info
    renderer = ChatRenderer.load(ckpt)
    samples = fixed_samples(renderer)
    results: dict[str, Any] = {}
    for case in CASES:
        model = shard_model(
            load_model(ckpt),
            info,
            mixed_precision=False,
            activation_checkpointing=case.activation_checkpointing,
        )
        blocks = [*model.model.language_model.layers, *model.model.visual.blocks]
        sharded = isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in blocks)
        checkpointed = all(getattr(b, "gradient_checkpointing", False) for b in blocks)
        metrics = run_case(case, model, renderer, samples, info)
        state = full_state_dict(model)  # every rank calls it: it all-gathers
        if info.rank == 0:
            torch.save(state, out_dir / f"{case.name}.pt")
            results[case.name] = {
                "metrics": metrics,
                "sharded": sharded,
                "blocks": len(blocks),
                "checkpointed": checkpointed,
            }
        else:
            assert state == {}
    if info.rank == 0:
        (out_dir / "results.json").write_text(json.dumps({"world": info.world, "cases": results}))
    # every rank leaves together: a rank that tears gloo down while its peer still holds the connection
    # can abort at exit ("terminate called without an active exception", seen once under load)
    dist.barrier()
    dist.destroy_process_group()


def torchrun(nproc: int, ckpt: Path, out_dir: Path) -> dict:
    """Run `worker` on `nproc` ranks; its results, or an AssertionError with the ranks' output."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "tests.integration.test_fsdp",
        str(ckpt),
        str(out_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    # Own process group: on a timeout the ranks are killed with torchrun, not left behind.
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"torchrun ran past {RUN_TIMEOUT_S:g} s:\n{output.decode()[-6000:]}") from None
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{output.decode()[-6000:]}"
    return json.loads((out_dir / "results.json").read_text())


# -- the tests -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def renderer(ckpt: Path) -> ChatRenderer:
    return ChatRenderer.load(ckpt)


@pytest.fixture(scope="module")
def reference(ckpt: Path, renderer: ChatRenderer) -> dict[str, tuple[dict, dict[str, torch.Tensor]]]:
    """Each case on the plain model in this process: metrics and updated weights."""
    samples = fixed_samples(renderer)
    out = {}
    for case in CASES:
        model = load_model(ckpt)
        metrics = run_case(case, model, renderer, samples, None)
        out[case.name] = (metrics, {k: v.detach().clone() for k, v in model.state_dict().items()})
    return out


def test_fixture_covers_the_hard_cases(renderer: ChatRenderer) -> None:
    """On 2 ranks the cases exercise what could desynchronise the collectives: unequal micro-batch
    counts, a micro-batch with images on one rank and none on the other, and a rank with no sample."""
    samples = fixed_samples(renderer)
    assert {len(s.images) for s in samples} == {0, 1, 2}
    unequal = mixed = empty = False
    for case in CASES:
        size, extra = divmod(len(samples), case.minibatches)
        lo = 0
        for i in range(case.minibatches):
            part = samples[lo : lo + size + (i < extra)]
            lo += len(part)
            mbs = [pack_microbatches(share, case.max_tokens) if share else [] for share in _shares(part)]
            unequal |= len(mbs[0]) != len(mbs[1])
            empty |= not all(mbs)
            for a, b in zip(*mbs):
                mixed |= any(s.images for s in a) != any(s.images for s in b)
    assert unequal and mixed and empty


def _shares(part: list[TrainSample]) -> list[list[TrainSample]]:
    return [split_for_rank(part, r, 2) for r in range(2)]


def test_split_for_rank_is_a_balanced_deterministic_partition(renderer: ChatRenderer) -> None:
    samples = fixed_samples(renderer)
    for world in (1, 2, 3, 4, 6):
        shares = [split_for_rank(samples, r, world) for r in range(world)]
        assert sorted(s.episode_id for share in shares for s in share) == sorted(
            s.episode_id for s in samples
        )
        assert all(share for share in shares)  # at least as many samples as ranks: none idle
        for share in shares:  # each share keeps the batch's order
            assert [samples.index(s) for s in share] == sorted(samples.index(s) for s in share)
        loads = [sum(s.n_tokens for s in share) for share in shares]
        assert max(loads) - min(loads) <= max(s.n_tokens for s in samples)
        assert shares == [split_for_rank(samples, r, world) for r in range(world)]
    # fewer samples than ranks: the first ranks get one each, the rest nothing
    assert [len(split_for_rank(samples[:2], r, 3)) for r in range(3)] == [1, 1, 0]
    with pytest.raises(ValueError, match="outside"):
        split_for_rank(samples, 2, 2)


@pytest.mark.parametrize("nproc", [2, 1])
def test_fsdp_ranks_match_one_process(
    nproc: int, ckpt: Path, reference: dict[str, tuple[dict, dict[str, torch.Tensor]]], tmp_path: Path
) -> None:
    before = load_model(ckpt).state_dict()
    results = torchrun(nproc, ckpt, tmp_path)
    assert results["world"] == nproc
    for case in CASES:
        ref_metrics, ref_state = reference[case.name]
        got = results["cases"][case.name]
        metrics, state = got["metrics"], torch.load(tmp_path / f"{case.name}.pt")
        assert got["sharded"] and got["blocks"] == 4  # 2 decoder layers + 2 vision blocks, each its own unit
        assert got["checkpointed"] == case.activation_checkpointing
        assert set(state) == set(ref_state)
        update_diff = max(float((state[k] - ref_state[k]).abs().max()) for k in ref_state)
        update_size = max(float((ref_state[k] - before[k]).abs().max()) for k in ref_state)
        print(
            f"{nproc} rank(s), {case.name}: loss {metrics['loss']:.8f} vs {ref_metrics['loss']:.8f}, "
            f"grad norm {metrics['grad_norm']:.6f} vs {ref_metrics['grad_norm']:.6f}, "
            f"max |update diff| {update_diff:.2e} (largest update {update_size:.2e})"
        )
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], abs=LOSS_TOL)
        assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-5)
        for key in ("tokens", "samples", "microbatches", "optimizer_steps", "skipped_steps"):
            if key != "microbatches" or nproc == 1:
                assert metrics[key] == ref_metrics[key], key
        for key in ("entropy", "clipfrac", "approx_kl", "ratio_mean", "tis_weight_mean", "tis_clipped_frac"):
            assert metrics[key] == pytest.approx(ref_metrics[key], abs=1e-5), key
        # Sensitive: the update is far larger than the tolerance, so a gradient off by any factor fails (a
        # first AdamW step moves each weight by lr at most, whatever the gradient's scale: its tolerance
        # is a fraction of lr, and the step must have moved some weight by about lr).
        if case.optimizer == "adamw":
            assert update_size > 0.5 * case.lr
        else:
            assert update_size > 100 * case.weight_tol
        assert update_diff < case.weight_tol, case.name


if __name__ == "__main__":  # a torchrun rank (see `torchrun`)
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
