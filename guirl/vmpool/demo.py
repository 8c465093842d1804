"""The desktop part of `guirl demo`: two local VMs from a pool, two shipped tasks played with their
reference solutions at once, and their scores."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.pool import VMPool
from guirl.vmpool.runner import load_solution, play
from guirl.vmpool.tasks.model import load_task
from guirl.vmpool.tasks.setup import TaskContext

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "local"
DEMO_TASKS = ("terminal-echo-hello", "terminal-rename")


async def _one(pool: VMPool, task_id: str, run_dir: Path, width: int, height: int) -> dict:
    task = load_task(SUITE / "examples" / "terminal" / f"{task_id}.json")
    actions = load_solution(SUITE / "solutions" / f"{task_id}.jsonl")
    lease = await pool.acquire(timeout=120)
    try:
        async with VMClient(lease.address, timeout_s=120) as client:
            ctx = TaskContext(
                task_id=task_id,
                cache_dir=run_dir / "episodes" / task_id,
                download_cache=run_dir / "downloads",
                width=width,
                height=height,
            )
            ctx.cache_dir.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            episode = await play(task, client, actions, ctx, keep_screenshots=True)
            if episode.screenshots:
                (ctx.cache_dir / "last.png").write_bytes(episode.screenshots[-1])
            return {
                "task": task_id,
                "vm": lease.vm_id,
                "score": episode.score,
                "steps": episode.steps,
                "seconds": round(time.monotonic() - started, 2),
            }
    finally:
        await pool.release(lease.lease_id)


async def run_desktops(run_dir: Path, *, width: int = 1280, height: int = 800) -> dict:
    provider = LocalProvider(run_dir / "vms", width=width, height=height)
    started = time.monotonic()
    async with VMPool(provider, tag="demo", max_envs=2, prewarm=2, health_interval_s=2.0) as pool:
        ready_s = round(time.monotonic() - started, 2)
        results = await asyncio.gather(*(_one(pool, t, run_dir, width, height) for t in DEMO_TASKS))
        metrics = pool.metrics()
    return {"vms_ready_s": ready_s, "episodes": list(results), "pool": metrics}
