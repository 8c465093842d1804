"""Learner ranks 1..N-1 that rank 0 starts itself (a local run, or ranks placed on other cluster hosts;
under torchrun they exist already): their processes, the rendezvous rank 0 joins them by, and a watcher
for each that reports a rank gone mid-run (the job cannot go on without it)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from guirl.cluster.spec import FollowerHost
from guirl.config.schema import TrainConfig

log = logging.getLogger(__name__)


class Followers:
    """The follower ranks' processes (iterating gives them, rank 1 first)."""

    def __init__(
        self, procs: list[Any] | None = None, rendezvous: dict[str, str] | None = None, store: Any = None
    ):
        self.procs = list(procs or [])
        self.rendezvous = rendezvous
        """Rank 0's torchrun variables, for `Trainer.load` (None: none started here)."""
        self.store = store
        """Rank 0's rendezvous store, already listening."""
        self._watchers: list[asyncio.Task] = []

    @classmethod
    def start(
        cls,
        *,
        ckpt: str,
        train: TrainConfig,
        seed: int,
        temperature: float,
        resume_from: Path | None,
        world: int,
        log_dir: Path,
        remote: list[FollowerHost | None] | None = None,
        master_port: int = 0,
    ) -> Followers:
        """Start ranks 1..world-1 of the trainer rank 0 builds from the same options, logging to `log_dir`;
        `remote[rank - 1]`: a rank placed on another cluster host (see `trainer.spawn_followers`)."""
        from guirl.learner.trainer import spawn_followers

        options = {
            "ckpt": ckpt,
            "train": msgspec.to_builtins(train),
            "seed": seed,
            "temperature": temperature,
            "resume_from": str(resume_from or ""),
        }
        procs, rendezvous, store = spawn_followers(
            options, world=world, log_dir=log_dir, remote=remote, master_port=master_port
        )
        log.info("started learner ranks 1..%d (pids %s)", world - 1, [p.pid for p in procs])
        return cls(procs, rendezvous, store)

    def watch(self, on_exit: Callable[[int, int], None]) -> None:
        """Call `on_exit(rank, exit code)` when a rank's process ends (from the running event loop)."""

        async def watch(rank: int, proc: Any) -> None:
            on_exit(rank, await exited(proc))

        for rank, proc in enumerate(self.procs, start=1):
            self._watchers.append(asyncio.create_task(watch(rank, proc), name=f"rank{rank}"))

    def stop_watching(self) -> None:
        for w in self._watchers:
            w.cancel()

    async def reap(self, timeout_s: float) -> None:
        """Wait for every rank to exit (released by the trainer's stop); kill one not gone in `timeout_s`."""
        for proc in self.procs:
            try:
                await asyncio.wait_for(exited(proc), timeout_s)
            except TimeoutError:
                proc.kill()
                await exited(proc)


def exited(proc: Any) -> asyncio.Future:
    """The exit code of a subprocess, awaited on a daemon thread of its own (never the loop's shared
    pool, which a few follower waits would fill; never one that keeps the interpreter alive)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def wait() -> None:
        code = proc.wait()
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(code))

    threading.Thread(target=wait, name=f"wait-{proc.pid}", daemon=True).start()
    return fut
