"""The broker's work per request on the `sglang` path: rendering a step's prompt into the exact token ids
SGLang is sent, with each image processed into pixels (as before) against ids only, each image's token
count from its header and the image processor's own `get_number_of_image_patches` (now: SGLang processes
the images itself). Side by side, interleaved, in one run.

The prompt is a step's as an env worker builds it (`build_prompt`: two history screens and the current
one, desktop-like screenshots already smart-resized by the worker), rendered by the tiny checkpoint's
tokenizer and chat template with two image processors: the tiny model's (at most 512x512 pixels) and one
with Qwen3-VL's own bounds (65,536 to 16,777,216 pixels: a 1920x1088 screen is processed whole). The
engine renders on one thread per engine in the broker process, so `1 / CPU per request` is what one
engine's rendering can feed. Checks the two paths give the same ids.

Then throughput: full-HD requests (Qwen3-VL's bounds: 7,241 prompt tokens) rendered as the broker renders
them, each SGLang engine on a thread of its own in the broker's one process, with 1, 2 and 4 engines
(`--requests` requests, `--inflight` outstanding): requests/s and CPU per request. Hugging Face's tokenizer
encodes without holding Python's GIL, so engine threads render on several cores; what holds the GIL is the
rest (the chat template, the pad expansion, the glue). It is bounded two ways: the whole render minus the
tokenizer's encode, each timed alone, and the wall time per request at the best thread count (the GIL's
parts run one at a time, so they fit in it); the smaller is reported. That part, and the broker's
messaging, bound one broker process whatever cores it has.

Prints tables, then one line of JSON.

    python bench/broker_render.py [--repeat 10] [--requests 400] [--inflight 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from guirl.agent.prompt import PromptConfig, StepRecord, build_prompt, keep_resized  # noqa: E402
from guirl.config.schema import AgentConfig  # noqa: E402
from guirl.fileio import cache_dir  # noqa: E402
from guirl.inference.base import GenRequest  # noqa: E402
from guirl.inference.chat import ChatRenderer  # noqa: E402
from guirl.inference.sglang_api import render_request  # noqa: E402
from guirl.messages.types import SamplingParams  # noqa: E402
from guirl.model.tiny import build_image_processor, ensure_tiny_checkpoint  # noqa: E402
from guirl.testing.recording import desktop_png  # noqa: E402

PROCESSORS = {"tiny (<= 512x512)": 512 * 512, "Qwen3-VL (<= 16.8 M pixels)": 16 * 16 * 4 * 16384}


def step_request(screen: tuple[int, int], max_pixels: int) -> GenRequest:
    """A third step's request: two history screens and the current one, resized as the worker does."""
    cfg = PromptConfig.from_config(AgentConfig(max_pixels=max_pixels))
    history = []
    for i in range(2):
        shot = desktop_png(*screen, seed=i)
        past = StepRecord(shot, "Action: click\n<tool_call>{}</tool_call>", "click")
        keep_resized(past, build_prompt("Do it.", [], shot, screen=screen, cfg=cfg))
        history.append(past)
    prompt = build_prompt(
        "Open the report and sum the column.", history, desktop_png(*screen, 7), screen=screen, cfg=cfg
    )
    return GenRequest(messages=prompt.messages, images=prompt.images, sampling=SamplingParams())


def cpu_per_call(fn, repeat: int) -> float:
    t = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t) / repeat


async def _threads(renderer: ChatRenderer, req: GenRequest, n: int, engines: int, inflight: int) -> None:
    """`n` renders on `engines` single-thread executors (each SGLang engine's), `inflight` at a time."""
    loop = asyncio.get_running_loop()
    pools = [ThreadPoolExecutor(max_workers=1) for _ in range(engines)]
    gate = asyncio.Semaphore(inflight)

    async def one(i: int) -> None:
        async with gate:
            await loop.run_in_executor(pools[i % engines], render_request, renderer, req)

    await asyncio.gather(*(one(i) for i in range(n)))
    for pool in pools:
        pool.shutdown()


def throughput(ckpt: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Requests/s and CPU per request with 1, 2 and 4 engine threads; the GIL-held part of a render."""
    bounds = PROCESSORS["Qwen3-VL (<= 16.8 M pixels)"]  # a full-HD screen whole: 7,241 prompt tokens
    renderer = ChatRenderer(ChatRenderer.load(ckpt).tokenizer, build_image_processor(max_pixels=bounds))
    req = step_request((1920, 1080), bounds)
    text = renderer.template_text(req.messages)
    whole = cpu_per_call(lambda: render_request(renderer, req), 10 * args.repeat)
    encode = cpu_per_call(lambda: renderer.tokenizer(text, add_special_tokens=False), 10 * args.repeat)
    rows = []
    for engines in (1, 2, 4):
        wall, cpu = time.perf_counter(), time.process_time()
        asyncio.run(_threads(renderer, req, args.requests, engines, args.inflight))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        row = {
            "engines": engines,
            "requests_per_s": round(args.requests / wall, 1),
            "cpu_ms_per_request": round(1000 * cpu / args.requests, 3),
            "cores_busy": round(cpu / wall, 2),
        }
        rows.append(row)
        print(
            f"{engines} engine thread{'s' if engines > 1 else ' '}  {row['requests_per_s']:>7} requests/s  "
            f"CPU {row['cpu_ms_per_request']:>6} ms per request  {row['cores_busy']} cores busy",
            flush=True,
        )
    best = max(r["requests_per_s"] for r in rows)
    gil_ms = min(1000 * (whole - encode), 1000 / best)
    print(
        f"per request: render {1000 * whole:.2f} ms, of which the tokenizer's encode (no GIL) "
        f"{1000 * encode:.2f} ms; holding the GIL at most {gil_ms:.2f} ms (the render less the encode, "
        f"{1000 * (whole - encode):.2f} ms; the wall time per request at {best} requests/s, "
        f"{1000 / best:.2f} ms)",
        flush=True,
    )
    return {
        "threads": rows,
        "render_ms": round(1000 * whole, 3),
        "encode_ms": round(1000 * encode, 3),
        "gil_ms": round(gil_ms, 3),
        "cores": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--requests", type=int, default=400, help="requests per throughput measurement")
    ap.add_argument("--inflight", type=int, default=64, help="requests outstanding at once")
    args = ap.parse_args(argv)
    ckpt = ensure_tiny_checkpoint(cache_dir("tiny-qwen3vl"))
    base = ChatRenderer.load(ckpt)
    rows = []
    for name, max_pixels in PROCESSORS.items():
        renderer = ChatRenderer(base.tokenizer, build_image_processor(max_pixels=max_pixels))
        for screen in ((1280, 800), (1920, 1080)):
            req = step_request(screen, max_pixels)
            with_pixels = renderer.render(req.messages, req.images).input_ids
            ids_only, _ = render_request(renderer, req)
            same = with_pixels == ids_only
            before = after = 0.0
            for _ in range(2):  # interleaved: drift hits both
                before += (
                    cpu_per_call(lambda r=renderer, q=req: r.render(q.messages, q.images), args.repeat) / 2
                )
                after += cpu_per_call(lambda r=renderer, q=req: render_request(r, q), args.repeat) / 2
            row = {
                "processor": name,
                "screen": f"{screen[0]}x{screen[1]}",
                "prompt_tokens": len(ids_only),
                "pixels_ms": round(1000 * before, 2),
                "ids_only_ms": round(1000 * after, 2),
                "speedup": round(before / after, 1),
                "requests_per_s_per_engine": round(1 / after),
                "same_ids": same,
            }
            rows.append(row)
            print(
                f"{name:<28} {row['screen']:>9}  {row['prompt_tokens']:>6} tokens  with pixels "
                f"{row['pixels_ms']:>7} ms  ids only {row['ids_only_ms']:>6} ms  x{row['speedup']}  "
                f"same {same}",
                flush=True,
            )
    threads = throughput(ckpt, args)
    print(json.dumps({"bench": "broker_render", "repeat": args.repeat, "rows": rows, "throughput": threads}))
    return 0 if all(r["same_ids"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
