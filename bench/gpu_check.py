"""One run on a one-GPU machine that checks guirl's GPU paths and takes their figures, offline (no hub: the
model is a random Qwen3-VL with 2B-class dimensions, built from a config into a temporary directory with
`write_tiny_checkpoint`, its offline byte-level tokenizer and a real-resolution image processor).

1. learner: guirl's `Trainer` (FSDP2 on a one-rank NCCL group, so the model really is sharded under its
   mixed-precision policy; bf16 compute with fp32 master weights and reduction, activation checkpointing,
   flash_attention_2 when installed, else sdpa: TrainConfig's "auto" defaults) runs `step` on samples of
   one 1280x720 screenshot (880 image tokens after smart_resize) plus a short instruction and a
   256-token response, several micro-batches per step. After one warm-up step: seconds per step,
   tokens/s (prompt + response tokens of the batch over the step's wall time, which includes collating,
   i.e. the images' preprocessing on the CPU), the peak GPU memory of the steps, and the compute dtype seen
   inside a decoder layer.
2. publish, on the trained model: `Trainer.full_state` (fsdp.full_state_dict: the full state on rank 0,
   gathered to CPU), then an in-GPU copy of every parameter into preallocated buffers (synchronised: the
   one-GPU stand-in for the NCCL broadcast to the engines; GB/s is the payload over the time, a copy
   moving twice that through memory), and guirl's bucket planner `sglang_buckets` at 512 MiB.
3. generation: guirl's `HFEngine` in bf16 on the GPU from the same checkpoint; batches of 1 and 8
   requests (one screenshot, a short instruction), greedy with `ignore_eos` so every row generates
   exactly `max_new_tokens` (128); generated tokens/s per batch size (after a warm-up call of each size)
   and the speed-up of batching.

Without CUDA (or with `--smoke`) the same phases run at toy scale (the tiny model of guirl/model/tiny.py,
a small image, short responses, fp32 on a gloo group) in well under 90 s on 2 CPU cores:
tests/integration/test_gpu_check.py runs it that way so the script does not rot. `--require-gpu` makes
a machine without CUDA an error (exit 2) instead. A phase that fails is reported as {"error": ...} and the
others still run (exit 1). Progress goes to stderr; the last line on stdout is one JSON object.

    python bench/gpu_check.py [--smoke] [--require-gpu] [--steps N] [--workdir DIR]

It runs from a checkout (it puts the checkout first on sys.path) on a machine with torch and transformers
(5.x; 5.17 checked) and no network, no SGLang, no torchvision: beyond those it needs only two small wheels,
`msgspec` and `pillow` (`pip install --no-index msgspec-*.whl pillow-*.whl`); aiohttp, msgpack and uvloop
are not needed (checked in a venv of torch, transformers 5.17, msgspec and pillow alone).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
BUCKET_BYTES = 512 * MiB

MODEL_2B = {  # write_tiny_checkpoint's knobs: Qwen3-VL-2B's dimensions, random weights
    "hidden": 2048,
    "layers": 28,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 128,
    "mrope_section": (24, 20, 20),  # sums to head_dim / 2
    "intermediate": 6144,
    "model_vocab": 151936,
    "tie_word_embeddings": True,
    "vision_depth": 24,
    "vision_hidden": 1024,
    "vision_heads": 16,
    "vision_intermediate": 4096,
    "vision_positions": 2304,
    "deepstack_visual_indexes": (5, 11, 17),
    "dtype": "bfloat16",  # as the real checkpoints are stored (the learner loads it in fp32)
    "min_pixels": 65536,  # the real image processor's bounds: a 1280x720 screenshot keeps its size
    "max_pixels": 16777216,
}


@dataclass(frozen=True)
class Plan:
    """The sizes of one mode."""

    image: tuple[int, int]
    response_tokens: int
    samples_per_step: int
    samples_per_microbatch: int
    steps: int
    """Timed train steps, after one warm-up step."""
    gen_batches: tuple[int, ...]
    gen_new_tokens: int
    gen_reps: int
    copy_reps: int


GPU_PLAN = Plan((1280, 720), 256, 12, 4, 4, (1, 8), 128, 2, 5)
SMOKE_PLAN = Plan((320, 192), 16, 4, 2, 1, (1, 4), 8, 1, 3)

_t0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[gpu_check {time.monotonic() - _t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / GiB, 2) if device == "cuda" else None


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def screenshot(size: tuple[int, int], seed: int) -> bytes:
    """A PNG that looks vaguely like a desktop (windows, a bar): its content does not change the cost."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    w, h = size
    img = Image.new("RGB", size, (rng.randrange(256), 90, 160))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, h - h // 20, w, h], fill=(30, 30, 30))
    for _ in range(6):
        x, y = rng.randrange(w // 2), rng.randrange(h // 2)
        draw.rectangle([x, y, x + w // 3, y + h // 3], fill=(240, 240, 240), outline=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def build_checkpoint(out: Path, smoke: bool) -> Path:
    from guirl.model.tiny import write_tiny_checkpoint

    started = time.monotonic()
    write_tiny_checkpoint(out, **({} if smoke else MODEL_2B))
    log(f"checkpoint written to {out} in {time.monotonic() - started:.1f} s")
    return out


def chat(instruction: str) -> list[Any]:
    from guirl.messages.types import ChatMessage, ImagePart, TextPart

    return [
        ChatMessage(role="system", parts=[TextPart("You are a GUI agent. Answer with one action.")]),
        ChatMessage(role="user", parts=[ImagePart(0), TextPart(instruction)]),
    ]


def make_samples(renderer: Any, plan: Plan, vocab: int) -> list[Any]:
    """`plan.samples_per_step` samples: a screenshot prompt each, a response of random ordinary tokens
    ending in <|im_end|>, behaviour log-probs at a random model's -log V, advantages of both signs."""
    from guirl.learner.samples import TrainSample
    from guirl.model.tiny import ADDED_TOKENS, SPECIAL_TOKENS

    tok = renderer.tokenizer
    reserved = set(tok.convert_tokens_to_ids(SPECIAL_TOKENS + ADDED_TOKENS))
    ordinary = [i for i in range(len(tok)) if i not in reserved]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(0)
    samples = []
    for i in range(plan.samples_per_step):
        image = screenshot(plan.image, seed=i)
        prompt = renderer.render(chat(f"Open the settings and turn on option {i}."), [image]).input_ids
        response = [rng.choice(ordinary) for _ in range(plan.response_tokens - 1)] + [im_end]
        samples.append(
            TrainSample(
                prompt_ids=prompt,
                response_ids=response,
                behaviour_logprobs=[-math.log(vocab)] * len(response),
                images=[image],
                advantage=1.0 if i % 2 == 0 else -1.0,
                policy_version=0,
                episode_id=f"ep{i}",
                step=0,
                group_id=f"g{i // 4}",
            )
        )
    return samples


def compute_dtype_probe(model: Any) -> tuple[Any, dict[str, str]]:
    """A forward hook on the first Linear of the first decoder layer that records its output's dtype: the
    compute dtype FSDP's mixed-precision policy really gives (bf16 on GPU, fp32 on CPU)."""
    seen: dict[str, str] = {}
    layer = next(
        m for name, m in model.named_modules() if ".layers.0." in name and isinstance(m, torch.nn.Linear)
    )

    def hook(module: Any, args: Any, output: torch.Tensor) -> None:
        seen["dtype"] = str(output.dtype).removeprefix("torch.")

    return layer.register_forward_hook(hook), seen


def train_and_publish(ckpt: Path, plan: Plan, device: str, steps: int) -> tuple[dict, dict]:
    """Phases 1 and 2 (the publish needs the trained model); the process group is destroyed at the end."""
    from torch.distributed import TCPStore
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from guirl.config.schema import TrainConfig
    from guirl.inference.chat import ChatRenderer
    from guirl.learner.trainer import Trainer
    from guirl.weights.broadcast import sglang_buckets

    # One rank of a real process group (not the no-group shortcut), so `shard_model` runs fully_shard with
    # the mixed-precision policy. The store listens on a port of its own choosing (no probe-then-bind race)
    # and is handed to `load` with torchrun's variables, as `spawn_followers` does for rank 0.
    store = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    rendezvous = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    rendezvous["MASTER_PORT"] = str(store.port)
    vocab = json.loads((ckpt / "config.json").read_text())["text_config"]["vocab_size"]
    samples = make_samples(ChatRenderer.load(ckpt), plan, vocab)
    tokens = sum(s.n_tokens for s in samples)
    # A micro-batch holds `samples_per_microbatch` rows of this batch.
    budget = plan.samples_per_microbatch * max(s.n_tokens for s in samples)
    started = time.monotonic()
    trainer = Trainer(ckpt=str(ckpt), train=TrainConfig(lr=1e-6, micro_batch_tokens=budget), device=device)
    try:
        trainer.load(rendezvous=rendezvous, store=store)
        model = trainer.model
        load_s = time.monotonic() - started
        log(f"learner loaded in {load_s:.1f} s (FSDP2: {isinstance(model, FSDPModule)})")
        handle, probe = compute_dtype_probe(model)
        reset_peak(device)
        t = time.monotonic()
        trainer.step(samples)  # warm-up: allocator, kernels, cuDNN/flash autotuning
        sync(device)
        log(f"warm-up step {time.monotonic() - t:.1f} s, compute dtype {probe.get('dtype')}")
        handle.remove()
        times, metrics = [], {}
        for i in range(steps):
            t = time.monotonic()
            metrics = trainer.step(samples)
            sync(device)
            times.append(time.monotonic() - t)
            log(f"step {i + 1}/{steps}: {times[-1]:.2f} s, {tokens / times[-1]:.0f} tokens/s")
        step_s = statistics.median(times)
        learner = {
            "attn_implementation": model.config._attn_implementation,
            # What TrainConfig's setting gave: bf16 compute over fp32 master weights, or fp32 throughout.
            "mixed_precision": "bf16" if probe.get("dtype") == "bfloat16" else "fp32",
            "mixed_precision_setting": trainer.cfg.mixed_precision,
            "compute_dtype": probe.get("dtype"),
            "master_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "fsdp2": isinstance(model, FSDPModule),
            "activation_checkpointing": bool(getattr(model, "is_activation_checkpointing", False)),
            "world_size": trainer.world,
            "load_s": round(load_s, 2),
            "samples_per_step": len(samples),
            "microbatches": int(metrics.get("microbatches", 0)),
            "tokens_per_step": tokens,
            "prompt_tokens_per_sample": len(samples[0].prompt_ids),
            "response_tokens_per_sample": plan.response_tokens,
            "steps_timed": steps,
            "step_s": round(step_s, 4),
            "tokens_per_s": round(tokens / step_s, 1),
            "peak_gib": peak_gib(device),
            "loss": metrics.get("loss"),
            "grad_norm": metrics.get("grad_norm"),
        }
        log(f"learner: {learner}")

        # -- publish ----------------------------------------------------------------------------------
        t = time.monotonic()
        state = trainer.full_state()
        full_s = time.monotonic() - t
        full_bytes = sum(v.numel() * v.element_size() for v in state.values())
        full_tensors = len(state)
        t = time.monotonic()
        buckets = sglang_buckets(state, BUCKET_BYTES)
        plan_s = time.monotonic() - t
        log(f"full_state_dict {full_bytes / 1e9:.2f} GB in {full_s:.2f} s; {len(buckets)} buckets")
        del state
        params = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
        params = [p.detach() for p in params]
        buffers = [torch.empty_like(p) for p in params]
        copy_bytes = sum(p.numel() * p.element_size() for p in params)
        copies = []
        for _ in range(plan.copy_reps):
            sync(device)
            t = time.monotonic()
            for buf, p in zip(buffers, params):
                buf.copy_(p)
            sync(device)
            copies.append(time.monotonic() - t)
        copy_s = statistics.median(copies)
        del params, buffers
        publish = {
            "full_state_s": round(full_s, 3),
            "full_state_gb": round(full_bytes / 1e9, 3),
            "full_state_gbps": round(full_bytes / full_s / 1e9, 2),
            "full_state_tensors": full_tensors,
            "device_copy_s": round(copy_s, 5),
            "device_copy_gb": round(copy_bytes / 1e9, 3),
            "device_copy_gbps": round(copy_bytes / copy_s / 1e9, 2),
            "device_copy_reps": plan.copy_reps,
            "sglang_buckets_s": round(plan_s, 5),
            "buckets_512mib": len(buckets),
        }
        log(f"publish: {publish}")
        return learner, publish
    finally:
        trainer.stop()  # destroys the process group
        trainer.model = trainer.optimizer = None
        del trainer
        free_memory(device)


def generation(ckpt: Path, plan: Plan, device: str) -> dict:
    """Phase 3: HFEngine throughput at each batch size."""
    from guirl.inference.base import GenRequest
    from guirl.inference.hf import HFEngine
    from guirl.messages.types import SamplingParams

    def requests(n: int, new_tokens: int) -> list[GenRequest]:
        sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
        return [
            GenRequest(
                messages=chat(f"Click the button number {i}."),
                images=[screenshot(plan.image, seed=100 + i)],
                sampling=sampling,
                request_id=f"r{i}",
            )
            for i in range(n)
        ]

    async def scenario() -> dict:
        free_memory(device)  # the learner's model is gone now that its phase has returned
        dtype = "bfloat16" if device == "cuda" else "float32"
        engine = HFEngine("gpu-check", ckpt, device=device, dtype=dtype, max_batch=max(plan.gen_batches))
        t = time.monotonic()
        await engine.start()
        out: dict[str, Any] = {"dtype": dtype, "load_s": round(time.monotonic() - t, 2)}
        out["attn_implementation"] = engine._model.config._attn_implementation
        out["max_new_tokens"] = plan.gen_new_tokens
        reset_peak(device)
        try:
            for b in plan.gen_batches:
                await engine.generate(requests(b, 2))  # warm-up of this batch shape
                batch = requests(b, plan.gen_new_tokens)
                times = []
                calls = engine.generate_calls
                for _ in range(plan.gen_reps):
                    t = time.monotonic()
                    results = await engine.generate(batch)
                    sync(device)
                    times.append(time.monotonic() - t)
                    lengths = {len(r.response_ids or []) for r in results}
                    if lengths != {plan.gen_new_tokens}:
                        want = plan.gen_new_tokens
                        raise RuntimeError(f"batch {b}: response lengths {lengths}, not {want} each")
                seconds = statistics.median(times)
                out[f"batch_{b}"] = {
                    "seconds": round(seconds, 3),
                    "tokens_per_s": round(b * plan.gen_new_tokens / seconds, 1),
                    "prompt_tokens": len(results[0].prompt_ids or []),
                    "generate_calls": (engine.generate_calls - calls) // plan.gen_reps,
                }
                log(f"generation batch {b}: {out[f'batch_{b}']}")
            lo, hi = min(plan.gen_batches), max(plan.gen_batches)
            out["batching_speedup"] = round(
                out[f"batch_{hi}"]["tokens_per_s"] / out[f"batch_{lo}"]["tokens_per_s"], 2
            )
            out["peak_gib"] = peak_gib(device)
            return out
        finally:
            await engine.close()

    try:
        return asyncio.run(scenario())
    finally:
        free_memory(device)


def guarded(name: str, failures: list[str], fn: Any, *args: Any) -> Any:
    """Run one phase; a failure is logged with its traceback and reported, and the next phase still runs."""
    try:
        return fn(*args)
    except Exception as exc:
        traceback.print_exc()
        failures.append(name)
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="toy scale (the default without CUDA)")
    p.add_argument("--require-gpu", action="store_true", help="exit 2 when CUDA is not available")
    p.add_argument("--steps", type=int, default=0, help="timed train steps (default: 4 on GPU, 1 smoke)")
    p.add_argument("--workdir", default="", help="where the checkpoint is built (default: a temp dir)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if args.require_gpu and not cuda:
        print(
            f"gpu_check: --require-gpu, but CUDA is not available (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda}): run it on a GPU machine, or drop --require-gpu for "
            "the CPU smoke mode",
            file=sys.stderr,
        )
        return 2
    smoke = args.smoke or not cuda
    if not cuda and not args.smoke:
        log("no CUDA: running the smoke mode on CPU")
    device = "cuda" if cuda else "cpu"
    plan = SMOKE_PLAN if smoke else GPU_PLAN
    steps = args.steps or plan.steps
    name = torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores, {platform.machine()})"
    log(f"device {name}, mode {'smoke' if smoke else 'gpu'}")
    started = time.monotonic()
    failures: list[str] = []
    result: dict[str, Any] = {"bench": "gpu_check", "device": name, "mode": "smoke" if smoke else "gpu"}
    with tempfile.TemporaryDirectory(prefix="gpu_check.", dir=args.workdir or None) as tmp:
        from guirl.model.tiny import count_parameters

        ckpt = build_checkpoint(Path(tmp) / "model", smoke)
        result["params_m"] = round(count_parameters(ckpt) / 1e6, 2)
        trained = guarded("learner", failures, train_and_publish, ckpt, plan, device, steps)
        learner, publish = trained if isinstance(trained, tuple) else (trained, trained)
        result["learner"] = learner
        result["generation"] = guarded("generation", failures, generation, ckpt, plan, device)
        result["publish"] = publish
    import transformers

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    result["seconds"] = round(time.monotonic() - started, 1)
    result["failed"] = failures
    log(f"done in {result['seconds']} s" + (f"; failed: {failures}" if failures else ""))
    print(json.dumps(result))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
