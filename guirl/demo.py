"""`guirl demo`: the transport demo — the richest end-to-end run that exists before the RL loop.

A coordinator (in this process) hands out episodes; `demo.workers` worker processes play them against a
broker process (the echo actor standing in for the inference broker), one synthetic screenshot per
step; every actor records its messages. Midway the broker is SIGKILLed: workers see its requests fail
(`PeerDead`), the supervisor restarts it on the same port, workers reconnect and carry on. At the end
the run directory holds the resolved config, the message logs and `summary.json`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from pathlib import Path

import msgspec

from guirl.actors.demo import DemoCoordinator, DemoWorkerOptions
from guirl.config import GuirlConfig, make_run_dir, save_resolved
from guirl.fileio import write_json_atomic
from guirl.msglog import LogReader, Recorder
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)


async def _run_actors(
    cfg: GuirlConfig, run_dir: Path, coordinator: DemoCoordinator, started: float
) -> tuple[float | None, list[str]]:
    """Broker and workers under a supervisor; the broker is killed midway. Returns (kill time, events)."""
    d, killed_at = cfg.demo, None
    async with Supervisor(cfg, run_dir=str(run_dir)) as sup:
        broker = await sup.start(
            ActorSpec(
                name="broker", target="guirl.actors.echo:EchoActor", bind=[cfg.endpoints.broker], record=True
            )
        )
        options = msgspec.to_builtins(
            DemoWorkerOptions(
                coordinator=coordinator.endpoints[0],
                broker=broker.endpoints[0],
                step_latency_s=d.step_latency_s,
            )
        )
        async with asyncio.TaskGroup() as tg:  # one failed start cancels (and cleans up) the others
            for i in range(d.workers):
                spec = ActorSpec(
                    name=f"worker{i}", target="guirl.actors.demo:DemoWorker", record=True, options=options
                )
                tg.create_task(sup.start(spec))
        if d.kill_one:
            # once a third of the episodes are done, kill the broker the hard way
            while len(coordinator.ended) < max(1, coordinator.total // 3):
                coordinator.progress.clear()
                await asyncio.wait_for(coordinator.progress.wait(), 120)
            killed_at = time.monotonic() - started
            mark = len(sup.history)
            pid = sup.kill("broker")
            print(f"[demo] SIGKILLed the broker (pid {pid}) after {len(coordinator.ended)} episodes")
            ev = await sup.wait_event("restarted", "broker", after=mark, timeout=60)
            print(f"[demo] supervisor restarted the broker as pid {ev.pid} on {broker.endpoints[0]}")
        await asyncio.wait_for(coordinator.all_ended.wait(), 300)
        for i in range(d.workers):
            await sup.wait_event("completed", f"worker{i}", timeout=60)
        return killed_at, [f"{e.kind}:{e.name}" for e in sup.history]


async def run_demo(cfg: GuirlConfig, run_dir: Path | None = None) -> dict:
    """Run the demo; returns (and writes) the summary."""
    run_dir = run_dir or make_run_dir(cfg)
    save_resolved(cfg, run_dir)
    logs = run_dir / "msglogs"
    logs.mkdir(exist_ok=True)
    d = cfg.demo
    started = time.monotonic()
    coordinator = DemoCoordinator(
        "coordinator",
        episodes=d.workers * d.episodes,
        max_steps=d.steps,
        runtime=cfg.runtime,
        codec=cfg.codec,
        bind=[cfg.endpoints.coordinator],
        recorder=Recorder(logs, "coordinator", actor="coordinator", rotate_bytes=cfg.recorder.rotate_bytes),
    )
    coord_task = await coordinator.start()
    try:
        killed_at, events = await _run_actors(cfg, run_dir, coordinator, started)
    finally:
        coordinator.request_shutdown("demo done")
        await coord_task
    elapsed = time.monotonic() - started

    reader = LogReader([logs])
    by_type: Counter = Counter()
    by_actor: Counter = Counter()
    blobs = set()
    for rec in reader:
        by_type[rec.type or "?"] += 1
        by_actor[rec.actor] += 1
        blobs.update(rec.blobs)
    statuses = Counter(e.status for e in coordinator.ended.values())
    summary = {
        "run_dir": str(run_dir),
        "seconds": round(elapsed, 2),
        "episodes": dict(statuses),
        "steps": sum(e.steps for e in coordinator.ended.values()),
        "broker_killed_at_s": round(killed_at, 2) if killed_at is not None else None,
        "supervisor_events": events,
        "recorded_messages": dict(by_type),
        "recorded_by_actor": dict(by_actor),
        "distinct_screenshots_stored": len(blobs),
        "log_warnings": reader.warnings,
    }
    if cfg.demo.desktops:
        from guirl.vmpool.demo import run_desktops

        summary["desktops"] = await run_desktops(run_dir)
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
