"""Broker throughput with the `hf` backend: batching on (max_batch 8) vs off (max_batch 1), at 1, 4 and 8
concurrent env workers' requests, measured side by side in one run (interleaved rounds) on the tiny
Qwen3-VL. Each request is a real step prompt (system prompt, instruction, a 1280x800 screenshot resized
as the local config does: ~1300 prompt tokens). Two response lengths: 64 tokens (a bare tool call) and
256 (a short thought before it, as the default Thinking checkpoint of OpenClaw-RL's GUI-RL writes; its
budget is 512).

On a CPU, prefill is compute-bound and costs the same per request batched or not; batching amortises
the decode steps. So the gain grows with the response length; on a GPU prefill batches too. Prints a
table per length, the on/off ratios, and one line of JSON.

    python bench/broker.py [--quick]

`--sglang`: another benchmark, the broker's barrier vs streaming dispatch against SGLang stand-ins that batch
continuously (`bench/broker_sglang.py`, whose docstring says what it measures):

    python bench/broker.py --sglang [--quick] [--standins N] [--rounds R] [--concurrency 8,32,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import uvloop  # noqa: E402

from guirl.actors.broker import BrokerOptions, InferenceBroker  # noqa: E402
from guirl.actors.demo import synthetic_screen  # noqa: E402
from guirl.agent.prompt import PromptConfig, build_prompt  # noqa: E402
from guirl.config import load_config  # noqa: E402
from guirl.config.schema import InferenceConfig  # noqa: E402
from guirl.inference.hf import HFEngine  # noqa: E402
from guirl.messages import Blob, PolicyChannel  # noqa: E402
from guirl.messages.types import Image, PolicyRequest, PolicyResponse, SamplingParams  # noqa: E402
from guirl.model.tiny import ensure_tiny_checkpoint  # noqa: E402
from guirl.runtime.base import Actor  # noqa: E402

CONCURRENCY = (1, 4, 8)
LENGTHS = (64, 256)
TARGET_LENGTH = 256


def make_request(i: int, max_new_tokens: int = 64) -> PolicyRequest:
    cfg = PromptConfig(max_pixels=262144)
    screen = synthetic_screen(1280, 800, i)
    prompt = build_prompt(f"Open the file number {i} in the editor", [], screen, screen=(1280, 800), cfg=cfg)
    return PolicyRequest(
        episode_id=f"bench{i}",
        step=0,
        messages=prompt.messages,
        images=[
            Image(data=Blob(p), width=w, height=h) for p, (w, h) in zip(prompt.images, prompt.image_sizes)
        ],
        # sampled, so requests differ; every response runs to its length (a random model stops at random
        # places, and the comparison would measure those instead), as SGLang's own serving benchmark does
        sampling=SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=i, ignore_eos=True),
    )


async def load(conn, concurrency: int, per_client: int, new_tokens: int) -> tuple[float, int, int]:
    """`concurrency` clients each sending `per_client` requests back to back: (seconds, requests, tokens)."""
    tokens = 0
    # built before the clock starts: an env worker builds its prompt in its own process, not the broker's
    requests = {
        c: [make_request(c * 1000 + k, new_tokens) for k in range(per_client)] for c in range(concurrency)
    }

    async def client(c: int) -> None:
        nonlocal tokens
        for request in requests[c]:
            reply = await conn.request(request, timeout=300)
            assert isinstance(reply, PolicyResponse), reply
            tokens += reply.response_ids.shape[0]

    t = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return time.perf_counter() - t, concurrency * per_client, tokens


async def run(quick: bool) -> dict:
    rounds, per_client = (1, 1) if quick else (2, 2)
    cfg = load_config(env={}, overrides=["logging.level=WARNING"])
    with tempfile.TemporaryDirectory(prefix="guirl-bench-") as tmp:
        ckpt = str(ensure_tiny_checkpoint(Path(tmp) / "tiny"))
        brokers = {}
        for mode, max_batch in (("off", 1), ("on", 8)):
            inf = InferenceConfig(backend="hf", max_batch=max_batch, max_wait_ms=5.0)
            engine = HFEngine(f"hf-{mode}", ckpt, max_batch=max_batch)
            broker = InferenceBroker(
                f"broker-{mode}",
                BrokerOptions(inference=inf),
                engines=[engine],
                runtime=cfg.runtime,
                bind=["tcp://127.0.0.1:0"],
            )
            brokers[mode] = (broker, await broker.start())
        client = Actor("bench", runtime=cfg.runtime)
        client_task = await client.start()
        conns = {m: client.connect(m, b.endpoints[0], PolicyChannel) for m, (b, _) in brokers.items()}
        try:
            for conn in conns.values():  # warm-up: first-call costs out of the measurement
                await load(conn, 2, 1, 8)
            samples: dict[tuple[int, str, int], list[tuple[float, int, int]]] = {}
            for _ in range(rounds):
                for n in LENGTHS:
                    for c in CONCURRENCY:
                        for mode, conn in conns.items():  # interleaved: the machine's noise hits both alike
                            samples.setdefault((n, mode, c), []).append(await load(conn, c, per_client, n))
        finally:
            client.request_shutdown("bench done")
            await client_task
            for broker, task in brokers.values():
                broker.request_shutdown("bench done")
                await task
    out: dict[str, dict] = {}
    for n in LENGTHS:
        figures: dict[str, dict] = {}
        for mode in ("off", "on"):
            for c in CONCURRENCY:
                runs = samples[(n, mode, c)]
                figures.setdefault(mode, {})[str(c)] = {
                    "requests_per_s": round(statistics.median(k / s for s, k, _ in runs), 2),
                    "tokens_per_s": round(statistics.median(t / s for s, _, t in runs), 1),
                }
        ratios = {
            str(c): round(
                figures["on"][str(c)]["requests_per_s"] / figures["off"][str(c)]["requests_per_s"], 2
            )
            for c in CONCURRENCY
        }
        out[str(n)] = {
            "batching_off": figures["off"],
            "batching_on": figures["on"],
            "speedup_on_vs_off": ratios,
        }
    return out


def main() -> None:
    from bench import broker_sglang

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument(
        "--sglang",
        action="store_true",
        help="barrier vs streaming on SGLang stand-ins (bench/broker_sglang.py)",
    )
    broker_sglang.add_arguments(parser.add_argument_group("--sglang mode"))
    args = parser.parse_args()
    if args.sglang:
        broker_sglang.main(args)
        return
    result = uvloop.run(run(args.quick))
    head = ("concurrent", "off req/s", "on req/s", "off tok/s", "on tok/s")
    for n in LENGTHS:
        r = result[str(n)]
        print(f"responses of {n} tokens:")
        print(" ".join(f"{h:>10}" for h in head) + f" {'on/off':>7}")
        for c in CONCURRENCY:
            off, on = r["batching_off"][str(c)], r["batching_on"][str(c)]
            print(
                f"{c:>10} {off['requests_per_s']:>10} {on['requests_per_s']:>10} {off['tokens_per_s']:>10} "
                f"{on['tokens_per_s']:>10} {r['speedup_on_vs_off'][str(c)]:>6}x"
            )
    speedup = result[str(TARGET_LENGTH)]["speedup_on_vs_off"]["8"]
    target = speedup >= 2.5
    print(
        f"target >= 2.5x at 8 concurrent ({TARGET_LENGTH}-token responses): {'met' if target else 'NOT met'}"
    )
    print(json.dumps({"bench": "broker", "by_response_tokens": result, "target_met": target}))


if __name__ == "__main__":
    main()
