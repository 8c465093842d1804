"""The learner actor as a 2-rank FSDP2 job on CPU (gloo): rank 0 is the actor and starts rank 1 itself,
with the environment torchrun would give it. On the same trajectories (with and without images) it makes
the same updates as the 1-rank learner — the same metrics, the same published weights, the same
checkpoint — a checkpoint written by 2 ranks resumes on 1 and the reverse, and a rank that dies takes the
actor down with a clear error instead of hanging it."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from pathlib import Path

import msgspec
import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file

from guirl.actors.learner import Learner, LearnerOptions
from guirl.inference.chat import ChatRenderer
from guirl.messages import LearnerChannel
from guirl.messages.blob import Blob
from guirl.messages.types import ChatMessage, ImagePart, TextPart, Trajectory
from guirl.messages.types import Image as WireImage
from guirl.runtime.errors import FatalError
from tests.helpers import client_actor, fast_config, one_step_trajectory, run, shared_tiny

TRAIN = {"lr": 1e-3, "updates": 2, "checkpoint_every": 1, "weight_sync": "disk", "tis_cap": 2.0}
# Adam's first steps are sign-like: each element moves by ~lr * g / (|g| + eps). Where |g| is within
# rounding of 0 (a few elements in 10^4 here) the summation order of 2 ranks changes that fraction, so the
# weights agree to 1e-6 except at such elements, which stay within a quarter of lr (measured: under 6 % of
# it, the last bits depending on the CPU's kernels; a wrong sign misses by 2 lr, and a rank's gradient
# lost or counted twice moves far more than a few elements in 10^4). The gradient's scale, to which Adam
# is blind, is checked through the gradient norm.
WEIGHT_TOL = 1e-6
RARE_TOL = 0.25 * TRAIN["lr"]
RARE_FRACTION = 1e-3


def _png(seed: int) -> bytes:
    img = Image.new("RGB", (64 + 16 * seed, 48), (30 * seed % 256, 120, 200))
    ImageDraw.Draw(img).rectangle([8, 8, 30 + seed, 30], fill=(250, 250, 250))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _groups(ckpt: Path, n_groups: int, first: int = 0) -> list[list[Trajectory]]:
    """Groups of two deterministic trajectories; one member of each group has a screenshot, so that on
    2 ranks one micro-batch has an image and the other may not (the vision blocks' collectives)."""
    renderer = ChatRenderer.load(ckpt)
    groups = []
    for g in range(first, first + n_groups):
        members = []
        for i in range(2):
            images = [_png(g + i)] if i == 0 else []
            parts = ([ImagePart(0)] if images else []) + [TextPart(f"Task {g}, attempt {i}: open the file.")]
            prompt = renderer.render([ChatMessage(role="user", parts=parts)], images).input_ids
            response = [40 + g, 50 + i, 60, 70 + g, 80 + i]
            reward = 1.0 if (g + i) % 2 == 0 else -1.0
            members.append(
                one_step_trajectory(
                    g, i, prompt, response, reward=reward, policy_version=max(g - 1, -1), images=images
                )
            )
        groups.append(members)
    return groups


def _learner(ckpt: Path, run_dir: Path, ranks: int, cfg, **train) -> Learner:
    return Learner(
        "learner",
        msgspec.convert(
            dict(
                train={**TRAIN, **train},
                ckpt=str(ckpt),
                run_dir=str(run_dir),
                n_samples=2,
                batch_size=1,
                ranks=ranks,
            ),
            LearnerOptions,
        ),
        runtime=cfg.runtime,
        bind=["tcp://127.0.0.1:0"],
    )


def _train(ckpt: Path, run_dir: Path, ranks: int, groups: list[list[Trajectory]], **train) -> list[dict]:
    """Run a learner on `ranks` ranks until its updates are made; its metrics lines."""
    cfg = fast_config()

    async def scenario() -> None:
        learner = _learner(ckpt, run_dir, ranks, cfg, **train)
        task = await learner.start()
        try:
            async with client_actor(cfg) as client:
                conn = client.connect("learner", learner.endpoints[0], LearnerChannel)
                for group in groups:
                    for t in group:
                        assert (await conn.request(t, timeout=60)).note == "accepted"
                done = asyncio.create_task(learner.updates_done.wait())
                await asyncio.wait([done, task], timeout=240, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    task.result()  # the learner's error
                assert done.done(), "the learner made no progress in 240 s"
        finally:
            learner.request_shutdown("test done")
            await asyncio.wait_for(task, 60)

    run(scenario(), timeout=360)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _ckpt_weights(run_dir: Path, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"v{version:06d}" / "model" / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same_update(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    """Equal to WEIGHT_TOL but for a rare element with a gradient of ~0 (see RARE_TOL)."""
    assert set(got) == set(ref)
    off = sum(int(((got[k] - ref[k]).abs() > WEIGHT_TOL).sum()) for k in ref)
    total = sum(v.numel() for v in ref.values())
    assert off <= RARE_FRACTION * total, f"{off} of {total} weights differ by more than {WEIGHT_TOL}"
    assert _max_diff(got, ref) < RARE_TOL


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def one_rank(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    run_dir = tmp_path_factory.mktemp("one")
    return run_dir, _train(tiny, run_dir, 1, _groups(tiny, 2))


def test_two_ranks_make_the_one_rank_updates(tiny: Path, one_rank, tmp_path: Path) -> None:
    ref_dir, ref = one_rank
    metrics = _train(tiny, tmp_path, 2, _groups(tiny, 2))
    assert [m["version"] for m in metrics] == [m["version"] for m in ref] == [1, 2]
    for m, r in zip(metrics, ref):
        assert m["samples"] == r["samples"] == 2 and m["tokens"] == r["tokens"]
        assert m["loss"] == pytest.approx(r["loss"], abs=1e-5)
        assert m["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-5)
        assert m["clipfrac"] == pytest.approx(r["clipfrac"], abs=1e-6)
    before = load_file(str(tiny / "model.safetensors"))
    for v in (1, 2):
        ref_w, got_w = _ckpt_weights(ref_dir, v), _ckpt_weights(tmp_path, v)
        assert _max_diff(ref_w, {k: before[k] for k in ref_w}) > 0.5 * TRAIN["lr"]  # the update is visible
        _assert_same_update(got_w, ref_w)
        published = load_file(str(tmp_path / "weights" / "v000002" / "model.safetensors"))
    assert _max_diff(published, {k: _ckpt_weights(tmp_path, 2)[k] for k in published}) == 0.0
    # the optimizer state is the full one, keyed by parameter name, whatever the number of ranks
    opt_ref = torch.load(ref_dir / "checkpoints" / "v000002" / "optimizer.pt", weights_only=True)
    opt_got = torch.load(tmp_path / "checkpoints" / "v000002" / "optimizer.pt", weights_only=True)
    assert set(opt_got["state"]) == set(opt_ref["state"]) and opt_ref["state"]
    assert all(isinstance(k, str) for k in opt_got["state"])
    assert opt_got["param_groups"] == opt_ref["param_groups"]
    for name, st in opt_ref["state"].items():
        assert float(opt_got["state"][name]["step"]) == float(st["step"]) == 2.0
        for key in ("exp_avg", "exp_avg_sq"):  # to summation-order rounding of the moments' scale
            diff = float((opt_got["state"][name][key] - st[key]).abs().max())
            assert diff <= 1e-4 * float(st[key].abs().max()), (name, key, diff)
    # the checkpoint is a Hugging Face model transformers loads as it is
    config = json.loads((tmp_path / "checkpoints" / "v000002" / "model" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    log = (tmp_path / "logs" / "learner-rank1.log").read_text()
    assert "learner rank 1 of 2 ready" in log and "learner rank 1 stopped" in log


def test_the_control_run_trains_on_rewards_shuffled_within_each_batch(tiny: Path, tmp_path: Path) -> None:
    """`train.shuffle_rewards` (the learning benches' control): each update is made on its batch's rewards
    permuted by the learner's seeded shuffle, as its advantage ledger records them."""
    import random

    from guirl.learner.batch import shuffled_rewards

    groups = _groups(tiny, 2)
    metrics = _train(tiny, tmp_path, 1, groups, shuffle_rewards=True, log_advantages=True)
    assert [m["version"] for m in metrics] == [1, 2]
    ledger = [json.loads(x) for x in (tmp_path / "advantages.jsonl").read_text().splitlines()]
    for version, group in zip((1, 2), groups, strict=True):  # batch_size 1: one group an update
        expected = shuffled_rewards(group, random.Random(f"0:{version - 1}"))  # seed 0, the version before
        assert [t.reward for t in expected] != [t.reward for t in group]  # this seed swaps both batches
        got = {x["episode_id"]: x["reward"] for x in ledger if x["version"] == version}
        assert got == {t.episode_id: t.reward for t in expected}


@pytest.mark.parametrize("first,then", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(
    tiny: Path, one_rank, tmp_path: Path, first: int, then: int
) -> None:
    """Version 1 made on `first` ranks, version 2 on `then` ranks from its checkpoint: the same weights as
    2 updates on one rank."""
    ref_dir, _ = one_rank
    groups = _groups(tiny, 2)
    _train(tiny, tmp_path, first, groups[:1], updates=1)
    metrics = _train(tiny, tmp_path, then, groups[1:], updates=2)  # resumes from the run's checkpoint
    assert [m["version"] for m in metrics] == [1, 2]
    _assert_same_update(_ckpt_weights(tmp_path, 2), _ckpt_weights(ref_dir, 2))


def test_a_dead_rank_stops_the_learner_with_a_clear_error(tiny: Path, tmp_path: Path) -> None:
    cfg = fast_config()

    async def scenario() -> None:
        learner = _learner(tiny, tmp_path, 2, cfg)
        task = await learner.start()
        (rank1,) = learner.rank0.followers.procs
        os.kill(rank1.pid, signal.SIGKILL)
        with pytest.raises(FatalError, match="learner rank 1 exited with code -9"):
            await asyncio.wait_for(task, 60)

    run(scenario(), timeout=120)
    assert not torch.distributed.is_initialized()  # the learner left its process group on the way out


def test_a_batch_one_rank_cannot_prepare_is_rejected_by_all_and_training_goes_on(
    tiny: Path, tmp_path: Path
) -> None:
    """A screenshot that does not decode fails on the rank that holds it; the other rank learns of it
    before any collective, both leave the weights alone, the learner counts the batch and trains on the
    next one."""
    bad, good = _groups(tiny, 2)
    first = bad[0]
    step = first.steps[0]
    broken = msgspec.structs.replace(step, images=[WireImage(data=Blob(b"not a png"))])
    bad = [msgspec.structs.replace(first, steps=[broken]), bad[1]]
    cfg = fast_config()

    async def scenario() -> dict:
        learner = _learner(tiny, tmp_path, 2, cfg, updates=1)
        task = await learner.start()
        try:
            async with client_actor(cfg) as client:
                conn = client.connect("learner", learner.endpoints[0], LearnerChannel)
                for t in [*bad, *good]:
                    assert (await conn.request(t, timeout=60)).note == "accepted"
                done = asyncio.create_task(learner.updates_done.wait())
                await asyncio.wait([done, task], timeout=240, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    task.result()
                assert done.done()
                return learner.counters.snapshot()
        finally:
            learner.request_shutdown("test done")
            await asyncio.wait_for(task, 60)

    counters = run(scenario(), timeout=300)
    assert counters["updates.rejected_batches"] == 1
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    m = json.loads(line)
    assert m["version"] == 1 and m["samples"] == 2 and m["grad_norm"] > 0  # the good group, trained
    assert "batch rejected" in (tmp_path / "logs" / "learner-rank1.log").read_text()


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_foreign_optimizer_state_fails_every_rank_with_one_clear_error(
    tiny: Path, tmp_path: Path, ranks: int
) -> None:
    _train(tiny, tmp_path, 1, _groups(tiny, 1), updates=1)
    ckpt = tmp_path / "checkpoints" / "v000001"
    torch.save(
        {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"params": [0]}]}, ckpt / "optimizer.pt"
    )
    cfg = fast_config()

    async def scenario() -> None:
        learner = _learner(tiny, tmp_path, ranks, cfg, updates=2)
        with pytest.raises(BaseExceptionGroup) as info:  # the actor's task group carries the setup error
            await learner.start()
        (error,) = info.value.exceptions
        assert isinstance(error, FatalError) and "keyed by parameter index" in str(error)
        for proc in learner.rank0.followers.procs:  # rank 1 got the same verdict and left
            assert await asyncio.to_thread(proc.wait, 60) != 0

    run(scenario(), timeout=180)
    if ranks == 2:
        assert "keyed by parameter index" in (tmp_path / "logs" / "learner-rank1.log").read_text()
