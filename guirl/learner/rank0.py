"""Rank 0 of the learner's data-parallel job, as its actor drives it: the `Trainer` on a thread of its own
(all torch work runs there, so the actor's mailbox keeps answering), and the follower ranks 1..N-1 it
starts itself on a local run (under torchrun they exist already; `followers`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from guirl.cluster.spec import FollowerHost
from guirl.config.schema import TrainConfig
from guirl.learner.followers import Followers
from guirl.runtime.errors import FatalError

log = logging.getLogger(__name__)


class Rank0:
    """See the module docstring. `follower_hosts`: where ranks 1..N-1 run when some are on other cluster
    hosts (see `trainer.spawn_followers`), `master_port` the rendezvous port of rank 0's store then."""

    def __init__(
        self,
        *,
        ckpt: str,
        train: TrainConfig,
        seed: int,
        temperature: float,
        device: str,
        ranks: int = 1,
        follower_hosts: list[FollowerHost | None] | None = None,
        master_port: int = 0,
        name: str = "learner",
    ) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        self.follower_hosts = list(follower_hosts or [])
        if self.follower_hosts and len(self.follower_hosts) != ranks - 1:
            raise ValueError(
                f"follower_hosts places {len(self.follower_hosts)} ranks, not ranks - 1 = {ranks - 1}"
            )
        self.ckpt, self.train, self.seed, self.temperature = ckpt, train, seed, temperature
        self.device, self.ranks, self.master_port = device, ranks, master_port
        self.trainer: Any = None
        self.followers = Followers()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"learner-{name}")

    def start_followers(
        self, resume_from: Path | None, log_dir: Path, on_exit: Callable[[int, int], None]
    ) -> None:
        """Start ranks 1..N-1 unless they exist already (torchrun); `on_exit(rank, code)` when one ends."""
        if self.ranks == 1 or "RANK" in os.environ:
            return
        self.followers = Followers.start(
            ckpt=self.ckpt,
            train=self.train,
            seed=self.seed,
            temperature=self.temperature,
            resume_from=resume_from,
            world=self.ranks,
            log_dir=log_dir,
            remote=self.follower_hosts or None,
            master_port=self.master_port,
        )
        self.followers.watch(on_exit)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the torch thread, after whatever runs there."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def load(self, resume_from: Path | None) -> Any:
        """On the torch thread: the trainer, joined with the ranks and loaded (from `resume_from`, a
        checkpoint directory, when given); FatalError when that is not a checkpoint."""
        from guirl.learner.simulated import SimulatedTrainer
        from guirl.learner.trainer import Trainer

        if self.train.simulated_update_s:  # no model: the control plane measured around a timed update
            self.trainer = SimulatedTrainer(self.train.simulated_update_s)
        else:
            self.trainer = Trainer(
                ckpt=self.ckpt,
                train=self.train,
                seed=self.seed,
                temperature=self.temperature,
                device=self.device,
            )
        try:
            self.trainer.load(resume_from, rendezvous=self.followers.rendezvous, store=self.followers.store)
        except ValueError as exc:  # not a checkpoint directory
            raise FatalError(str(exc)) from exc
        return self.trainer

    async def close(self, first: Callable[[], None], timeout_s: float) -> None:
        """On the torch thread, after whatever runs there (a step, or a load still going: the trainer's
        state is only read once it is done): `first()`, then the trainer releases the followers and leaves
        the process group. A follower not gone `timeout_s` later is killed."""
        self.followers.stop_watching()
        try:
            await self.run(self._stop, first)
            self._executor.shutdown(wait=True, cancel_futures=True)
        finally:
            await self.followers.reap(timeout_s)

    def _stop(self, first: Callable[[], None]) -> None:
        first()
        if self.trainer is not None and self.trainer.info is not None:
            try:  # releases the followers and leaves the process group
                self.trainer.stop()
            except Exception as exc:  # a rank already gone
                log.warning("stopping the learner ranks: %s", exc)
