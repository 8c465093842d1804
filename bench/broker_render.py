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

Then throughput, full-HD requests rendered as the broker renders them with `--engines` SGLang engines: on the
engines' threads (one each, all in the broker's one interpreter) against the broker's render processes
(`inference.sglang.render_processes`, `guirl.inference.render_pool`) with 1 to `--processes` processes, each
with `--inflight` requests outstanding; requests/s and the broker process's own CPU per request (with
processes: handing the request over and taking the ids back). With the tiny checkpoint's image processor:
ids only, the template and the tokenizer are the cost, the same for both processors above.

Prints tables, then one line of JSON.

    python bench/broker_render.py [--repeat 10] [--requests 400] [--engines 2] [--processes 2]
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
from guirl.inference.render_pool import RenderPool  # noqa: E402
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


async def _processes(pool: RenderPool, req: GenRequest, n: int, inflight: int) -> None:
    gate = asyncio.Semaphore(inflight)

    async def one() -> None:
        async with gate:
            await pool.render(req)

    await asyncio.gather(*(one() for _ in range(n)))


def throughput(ckpt: Path, args: argparse.Namespace) -> list[dict]:
    """Requests/s and the broker process's CPU per request: engine threads, then 1..P render processes."""
    renderer = ChatRenderer.load(ckpt)
    req = step_request((1920, 1080), 512 * 512)
    want, _ = render_request(renderer, req)
    inflight = args.inflight
    rows = []

    def measure(label: str, run: Any) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        asyncio.run(run())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        row = {
            "render": label,
            "requests_per_s": round(args.requests / wall, 1),
            "broker_cpu_ms_per_request": round(1000 * cpu / args.requests, 3),
        }
        rows.append(row)
        print(
            f"{label:<34} {row['requests_per_s']:>7} requests/s   broker process CPU "
            f"{row['broker_cpu_ms_per_request']:>6} ms per request",
            flush=True,
        )

    measure(
        f"{args.engines} engine threads",
        lambda: _threads(renderer, req, args.requests, args.engines, inflight),
    )
    for processes in range(1, args.processes + 1):
        pool = RenderPool(ckpt, processes)

        async def warm(pool: RenderPool = pool) -> None:  # the workers spawned and loaded, outside the timing
            await pool.start()
            await asyncio.gather(*(pool.render(req) for _ in range(4 * pool.processes)))

        asyncio.run(warm())
        got = asyncio.run(pool.render(req))
        assert got == want, "the render processes' ids differ from the thread's"
        measure(
            f"{processes} render process{'es' if processes > 1 else ''}",
            lambda pool=pool: _processes(pool, req, args.requests, inflight),
        )
        pool.release()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--requests", type=int, default=400, help="requests per throughput measurement")
    ap.add_argument("--engines", type=int, default=2, help="SGLang engines (render threads) of the broker")
    ap.add_argument("--processes", type=int, default=2, help="the most render processes measured")
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
    pooled = throughput(ckpt, args)
    print(json.dumps({"bench": "broker_render", "repeat": args.repeat, "rows": rows, "throughput": pooled}))
    return 0 if all(r["same_ids"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
