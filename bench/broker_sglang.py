"""Broker dispatch against SGLang stand-ins that batch continuously: barrier (`inference.dispatch = "batch"`,
static batches of `max_batch` 32, one in flight per engine, as a user of the hf-style broker would set it)
vs streaming (`"auto"`: each request alone, up to `max_concurrency` 64 per engine, least-loaded by tokens in
flight), at 8, 32 and 64 concurrent env requests, measured side by side in one run (`python bench/broker.py
--sglang [--quick]`).

The engines are SGLang stand-ins (`guirl.testing.fakes.sglang`: SGLang's own HTTP server, tokenizer manager
and request checks) with the `timing` backend (`guirl.testing.fakes.sglang_timing`: prefill, then decode
steps that slow with the running batch, long-tailed response lengths; its docstring gives the numbers, an
8B VL model on one H100). Both brokers attach to the same stand-ins by URL (`inference.sglang.urls`); the
modes alternate load by load (ABBA over rounds), so the machine's noise hits both alike.

Clients are closed loops (each sends its next request when the last is answered) in this process, beside
the brokers. Each request is token-in (`prompt_ids`): a real step prompt as `bench/broker.py` builds it
(system prompt, instruction, a 1280x800 screenshot) rendered by the tiny checkpoint's chat template, its
screenshot's `<|image_pad|>` run replaced by as many text tokens, so ~1300 tokens reach the server but no
image does (image processing would run on this machine's two cores, where a GPU host has its own). Sampled
with a seed per request and a 512-token budget (the Thinking checkpoint's), `ignore_eos` off: the stand-in
draws each response's length from the seed, so both modes see the same lengths. The seeds travel on the
wire (`inference.sglang.deterministic`), which also keys the stand-in's per-request record to the client's.

Per point (a measurement window after a warm-up): requests/s (each request counted by the share of its
time in flight inside the window; also the plain count of completions in it), the client's p50/p95
latency, the engine's p50 (the stand-in's own time per request: arrival of the HTTP request to the end of
its reply, `/_standin/state`'s `served`), and the broker's added latency, per request client-observed minus
server-side (queueing in the broker, its dispatch, rendering, HTTP client, the actor transport), p50, and as
a fraction of the engine's p50. Diagnostics: CPU cores busy (this process and the stand-ins, of the
machine's), the simulated GPUs' busy share and its part in prefill, the simulation's mean lag. Targets:
streaming >= 1.5x barrier's requests/s at 64 concurrent; streaming's added p50 <= 5 % of the engine's p50
at every concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.config import load_config
from guirl.config.schema import InferenceConfig, SGLangBackendConfig
from guirl.messages import PolicyChannel
from guirl.messages.types import PolicyRequest, PolicyResponse, SamplingParams, Tensor
from guirl.model.tiny import ensure_tiny_checkpoint
from guirl.runtime.base import Actor
from guirl.testing.fakes import FakeSGLangServer

MODES = {"barrier": "batch", "streaming": "auto"}
MAX_BATCH = 32
MAX_CONCURRENCY = 64
MAX_NEW_TOKENS = 512
PROMPTS = 8
"""Distinct step prompts, cycled over the clients (the model has no prefix cache: only lengths matter)."""
SPEEDUP_TARGET, OVERHEAD_TARGET = 1.5, 0.05
SIM_COUNTERS = ("busy_s", "prefill_s", "steps", "prefills", "lag_s_total")
"""What each load reads of the stand-ins' timing backends (`TimingBackend.stats()`), before and after."""


def step_prompts(ckpt: str, n: int) -> list[list[int]]:
    """`n` step prompts as token ids (see the module docstring)."""
    from bench.broker import make_request
    from guirl.inference.chat import ChatRenderer

    renderer = ChatRenderer.load(ckpt)
    pad = renderer.image_token_id
    filler = renderer.tokenizer(" screen", add_special_tokens=False)["input_ids"]
    prompts = []
    for i in range(n):
        req = make_request(i)
        ids = renderer.render(list(req.messages), [bytes(img.data.data) for img in req.images]).input_ids
        prompts.append([filler[k % len(filler)] if t == pad else t for k, t in enumerate(ids)])
    return prompts


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds used so far by this process and `pids` (user + system)."""
    t = os.times()
    total = t.user + t.system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


@dataclass
class Load:
    """One closed-loop load on one broker: what the clients and the servers saw (see `run_load`)."""

    rps: float
    completed_rps: float
    client_s: list[float] = field(default_factory=list)
    engine_s: list[float] = field(default_factory=list)
    added_s: list[float] = field(default_factory=list)
    cpu_cores: float = 0.0
    lag_s_mean: float = 0.0
    """How late the simulated GPU's forwards ended on the wall clock, on average (the stand-ins' loops
    behind their simulated clocks: CPU contention)."""
    gpu_busy: float = 0.0
    """Simulated GPU time over the load's whole time (warm-up to last answer), per stand-in."""
    prefill_share: float = 0.0
    """The part of the simulated GPU time spent in prefill."""


async def run_load(
    conn,
    servers: list[FakeSGLangServer],
    prompts: list[list[int]],
    c: int,
    seed0: int,
    warm_s: float,
    window_s: float,
) -> Load:
    """`c` clients sending back to back for `warm_s + window_s`, then waiting for their last answers.

    `rps`: every request counts by the share of its time in flight that lies inside the window, over the
    window's length. In a steady state it is the completion rate, without the whole-batch steps a plain
    count of completions takes when a barrier batch ends just inside or outside the window
    (`completed_rps`). Latencies: of the requests sent inside the window (all answered, long ones too)."""
    states = [await s.state() for s in servers]
    before = [len(st["served"]) for st in states]
    counters0 = {k: sum(st["backend"][k] for st in states) for k in SIM_COUNTERS}
    pids = [s.pid for s in servers if s.pid is not None]
    encoded = [Tensor.from_list(p, "int32") for p in prompts]
    done: list[tuple[int, float, float]] = []  # seed, sent, answered
    loop = asyncio.get_running_loop()
    start = loop.time() + warm_s
    end = start + window_s

    async def client(j: int) -> None:
        k = 0
        while loop.time() < end:
            seed = seed0 + j * 1000 + k
            k += 1
            request = PolicyRequest(
                episode_id=f"bench{j}",
                step=k,
                prompt_ids=encoded[j % len(encoded)],
                sampling=SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=seed),
            )
            sent = loop.time()
            reply = await conn.request(request, timeout=600)
            assert isinstance(reply, PolicyResponse) and reply.finish_reason in ("stop", "length"), reply
            done.append((seed, sent, loop.time()))

    cpu_at: list[float] = []

    async def sample_cpu() -> None:  # over the window only
        await asyncio.sleep(max(0.0, start - loop.time()))
        cpu_at.append(cpu_seconds(pids))
        await asyncio.sleep(max(0.0, end - loop.time()))
        cpu_at.append(cpu_seconds(pids))

    began = loop.time()
    await asyncio.gather(sample_cpu(), *(client(j) for j in range(c)))
    elapsed = loop.time() - began
    served: dict[int, float] = {}
    states = [await s.state() for s in servers]
    for state, n in zip(states, before):
        served.update({e["seed"]: e["latency_s"] for e in state["served"][n:] if e["seed"] is not None})
    sim = {k: sum(st["backend"][k] for st in states) - counters0[k] for k in SIM_COUNTERS}
    busy, forwards = sim["busy_s"], sim["steps"] + sim["prefills"]
    share = sum(
        max(0.0, min(answered, end) - max(sent, start)) / (answered - sent)
        for _, sent, answered in done
        if answered > sent
    )
    counted = [(seed, sent, answered) for seed, sent, answered in done if start <= sent < end]
    out = Load(
        rps=share / window_s,
        completed_rps=sum(1 for _, _, answered in done if start <= answered < end) / window_s,
        client_s=[answered - sent for _, sent, answered in counted],
        cpu_cores=(cpu_at[1] - cpu_at[0]) / window_s,
        lag_s_mean=sim["lag_s_total"] / forwards if forwards else 0.0,
        gpu_busy=busy / elapsed / len(servers),
        prefill_share=sim["prefill_s"] / busy if busy else 0.0,
    )
    for seed, sent, answered in counted:
        if seed in served:
            out.engine_s.append(served[seed])
            out.added_s.append(answered - sent - served[seed])
    return out


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (nearest rank) of `values`; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(loads: list[Load]) -> dict:
    client = [x for ld in loads for x in ld.client_s]
    engine = [x for ld in loads for x in ld.engine_s]
    added = [x for ld in loads for x in ld.added_s]
    engine_p50 = pct(engine, 0.5)
    added_p50 = pct(added, 0.5)
    return {
        "requests_per_s": round(statistics.median(ld.rps for ld in loads), 2),
        "completed_per_s": round(statistics.median(ld.completed_rps for ld in loads), 2),
        "requests": len(client),
        "matched": len(engine),
        "client_p50_s": round(pct(client, 0.5), 3),
        "client_p95_s": round(pct(client, 0.95), 3),
        "engine_p50_s": round(engine_p50, 3),
        "added_p50_ms": round(added_p50 * 1000, 1),
        "added_p50_frac": round(added_p50 / engine_p50, 4) if engine_p50 > 0 else None,
        "cpu_cores_busy": round(statistics.median(ld.cpu_cores for ld in loads), 2),
        "sim_lag_ms_mean": round(1000 * statistics.mean(ld.lag_s_mean for ld in loads), 2),
        "sim_gpu_busy": round(statistics.median(ld.gpu_busy for ld in loads), 2),
        "sim_prefill_share": round(statistics.median(ld.prefill_share for ld in loads), 2),
    }


async def run(args: argparse.Namespace) -> dict:
    cfg = load_config(env={}, overrides=["logging.level=WARNING"])
    concurrency = [int(c) for c in args.concurrency.split(",")]
    standin_args = ["--enable-deterministic-inference", "--standin-backend", "timing"]
    standin_args += ["--standin-timing", args.timing, "--standin-keep-requests", "0"]
    with tempfile.TemporaryDirectory(prefix="guirl-bench-") as tmp:
        ckpt = str(ensure_tiny_checkpoint(Path(tmp) / "tiny"))
        prompts = step_prompts(ckpt, PROMPTS)
        servers = [FakeSGLangServer(ckpt, args=standin_args) for _ in range(args.standins)]
        started = time.monotonic()
        try:
            await asyncio.gather(*(s.start() for s in servers))
            startup_s = time.monotonic() - started
            brokers = {}
            for mode, dispatch in MODES.items():
                inference = InferenceConfig(
                    backend="sglang",
                    max_batch=MAX_BATCH,
                    dispatch=dispatch,
                    sglang=SGLangBackendConfig(
                        urls=[s.url for s in servers], max_concurrency=MAX_CONCURRENCY, deterministic=True
                    ),
                )
                broker = InferenceBroker(
                    f"broker-{mode}",
                    BrokerOptions(inference=inference, ckpt=ckpt),
                    runtime=cfg.runtime,
                    bind=["tcp://127.0.0.1:0"],
                )
                brokers[mode] = (broker, await broker.start())
            client = Actor("bench", runtime=cfg.runtime)
            client_task = await client.start()
            conns = {m: client.connect(m, b.endpoints[0], PolicyChannel) for m, (b, _) in brokers.items()}
            try:
                for conn in conns.values():  # warm-up: connections, first-call costs
                    await run_load(conn, servers, prompts, 2, 0, 0.0, args.warm)
                loads: dict[tuple[str, int], list[Load]] = {}
                for r in range(args.rounds):
                    for c in concurrency:
                        order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
                        for mode in order:  # the same seeds (lengths) for both modes
                            seed0 = (r * 100 + c) * 100_000
                            load = await run_load(
                                conns[mode], servers, prompts, c, seed0, args.warm, args.window
                            )
                            loads.setdefault((mode, c), []).append(load)
            finally:
                client.request_shutdown("bench done")
                await client_task
                for broker, task in brokers.values():
                    broker.request_shutdown("bench done")
                    await task
        finally:
            await asyncio.gather(*(s.close() for s in servers))
    points = {mode: {str(c): summarize(loads[(mode, c)]) for c in concurrency} for mode in MODES}
    speedup = {
        str(c): round(
            points["streaming"][str(c)]["requests_per_s"] / points["barrier"][str(c)]["requests_per_s"], 2
        )
        for c in concurrency
    }
    fracs = [points["streaming"][str(c)]["added_p50_frac"] for c in concurrency]
    return {
        "bench": "broker_sglang",
        "setup": {
            "standins": args.standins,
            "rounds": args.rounds,
            "warm_s": args.warm,
            "window_s": args.window,
            "concurrency": concurrency,
            "max_batch_barrier": MAX_BATCH,
            "max_concurrency_streaming": MAX_CONCURRENCY,
            "max_new_tokens": MAX_NEW_TOKENS,
            "prompt_tokens": round(statistics.mean(len(p) for p in prompts)),
            "timing": json.loads(args.timing),
            "cpus": os.cpu_count(),
            "standin_startup_s": round(startup_s, 1),
        },
        "points": points,
        "speedup_streaming_vs_barrier": speedup,
        "target_met": {
            "requests_per_s_1.5x_at_64": speedup["64"] >= SPEEDUP_TARGET if "64" in speedup else None,
            "added_latency_p50_le_5pct": all(f is not None and f <= OVERHEAD_TARGET for f in fracs),
        },
    }


COLUMNS = {  # header: (field, format)
    "req/s": ("requests_per_s", "{}"),
    "completed": ("completed_per_s", "{}"),
    "p50 s": ("client_p50_s", "{}"),
    "p95 s": ("client_p95_s", "{}"),
    "engine p50": ("engine_p50_s", "{}"),
    "added p50": ("added_p50_ms", "{}ms"),
    "added/eng": ("added_p50_frac", "{:.1%}"),
    "cpu busy": ("cpu_cores_busy", "{}"),
    "gpu busy": ("sim_gpu_busy", "{:.0%}"),
    "prefill": ("sim_prefill_share", "{:.0%}"),
    "lag ms": ("sim_lag_ms_mean", "{}"),
}


def print_report(result: dict) -> None:
    print(" ".join(f"{h:>10}" for h in ("mode", "conc", *COLUMNS)))
    for mode, by_c in result["points"].items():
        for c, p in by_c.items():
            row = ["-" if p[k] is None else fmt.format(p[k]) for k, fmt in COLUMNS.values()]
            print(" ".join(f"{v:>10}" for v in (mode, c, *row)))
    speedup = result["speedup_streaming_vs_barrier"]
    print("streaming / barrier requests/s: " + ", ".join(f"{c}: {s}x" for c, s in speedup.items()))
    for name, ok in result["target_met"].items():
        print(f"target {name}: {'n/a' if ok is None else 'met' if ok else 'NOT met'}")
    print(json.dumps(result))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--standins", type=int, default=2, help="SGLang stand-ins (default 2)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every point (default 3, quick 1)")
    parser.add_argument("--concurrency", default="8,32,64", help="concurrent requests, comma-separated")
    parser.add_argument(
        "--warm", type=float, default=None, help="warm-up seconds per load (default 8, quick 4)"
    )
    parser.add_argument(
        "--window", type=float, default=None, help="measured seconds per load (default 24, quick 10)"
    )
    parser.add_argument(
        "--timing", default="{}", help="the stand-ins' timing model (JSON; default: its defaults)"
    )


def main(args: argparse.Namespace) -> None:
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warm = args.warm if args.warm is not None else (4.0 if args.quick else 8.0)
    args.window = args.window or (10.0 if args.quick else 24.0)
    import uvloop

    print_report(uvloop.run(run(args)))
