"""The Learner actor: trains the policy on trajectories as they arrive, and publishes new weights.

The loop reads like the algorithm (slime's train.py): collect `batch_size` complete GRPO groups →
advantages → one decoupled update → publish the weights (engines load them between batches; the
coordinator hears the new version, which opens its staleness gate) → log metrics. Trajectories keep
arriving while it trains: acting never waits for learning. All torch work runs on one dedicated thread,
so the mailbox keeps answering.

The torch side is a `Trainer` (guirl/learner/trainer.py): with `ranks > 1` this actor is rank 0 of a
data-parallel FSDP2 job and drives ranks 1..N-1, which it starts itself on a local run (under torchrun
they exist already; `guirl.learner.rank0`). A rank that dies takes the actor down with it; the
supervisor restarts the learner, which resumes from the latest checkpoint (`guirl.learner.checkpoint`)
with fresh ranks. What it checks and records of a batch is `guirl.learner.batch`; how the weights reach
the engines, one publisher per transport, is `guirl.weights`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import Any

import msgspec

from guirl.cluster.spec import FollowerHost
from guirl.config.schema import TrainConfig
from guirl.fileio import append_jsonl
from guirl.learner.batch import (
    advantage_lines,
    batch_advantages,
    batch_metrics,
    foreign_policy,
    shuffled_rewards,
    trainable_samples,
    trained_line,
)
from guirl.learner.checkpoint import LearnerState, load_learner_state, resume_point, save_checkpoint
from guirl.learner.coordinator_link import CoordinatorLink
from guirl.learner.publish import Publishing, WeightTransport
from guirl.learner.rank0 import Rank0
from guirl.messages import CoordinatorChannel, LearnerChannel, PolicyChannel
from guirl.messages.types import (
    Ack,
    ErrorReply,
    Message,
    StepScore,
    Trajectory,
)
from guirl.runtime.base import Actor, Request
from guirl.runtime.errors import FatalError

log = logging.getLogger(__name__)

TRAINED_LEDGER = "trained.jsonl"


class LearnerOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    ckpt: str
    """The policy checkpoint it starts from."""
    run_dir: str
    """The run directory: checkpoints, `metrics.jsonl`, the lineage."""
    n_samples: int
    """Samples per GRPO group (`rollout.n_samples_per_prompt`)."""
    batch_size: int
    """Groups per update (`rollout.batch_size`)."""
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    """The algorithm, the trainer and the weight sync (`[train]`)."""
    temperature: float = 1.0
    """The policy's sampling temperature (its log-probs are of that distribution)."""
    broker: str = ""
    """The broker's endpoint (new weights go there)."""
    coordinator: str = ""
    """The coordinator's endpoint (it hears each version)."""
    device: str = "cpu"
    seed: int = 0
    engines: int = 1
    """Engine ranks that join the weight group."""
    resume_from: str = ""
    """A checkpoint to resume from ("" = the latest of the run, else the starting weights)."""
    ranks: int = 1
    """Data-parallel learner ranks (this actor is rank 0)."""
    prm_timeout_s: float = 300.0
    """Seconds a trajectory waits for its PRM scores (`step_wise`)."""
    weights: WeightTransport = msgspec.field(default_factory=WeightTransport)
    """The weight broadcast's layout, backend and dtype (`guirl.roles.weight_transport`)."""
    follower_hosts: list[FollowerHost | None] | None = None
    """Where ranks 1..N-1 run when the learner spans cluster hosts (None: this machine; see `Rank0`)."""
    master_port: int = 0
    """Rank 0's rendezvous port when ranks span hosts."""


class Learner(Actor):
    """See the module docstring."""

    role = "learner"
    channel = LearnerChannel
    Options = LearnerOptions

    def __init__(self, name: str, options: LearnerOptions, **runtime: Any) -> None:
        super().__init__(name, **runtime)
        o = options
        self.cfg = o.train
        self.run_dir = Path(o.run_dir)
        self.n_samples, self.batch_size = o.n_samples, o.batch_size
        self.broker_ep, self.coordinator_ep = o.broker, o.coordinator
        self.seed = o.seed
        self.engines = o.engines  # broker engines that join the weight group
        self.rank0 = Rank0(
            ckpt=o.ckpt,
            train=self.cfg,
            seed=o.seed,
            temperature=o.temperature,
            device=o.device,
            ranks=o.ranks,
            follower_hosts=o.follower_hosts,
            master_port=o.master_port,
            name=name,
        )
        self.weights = o.weights
        self.publishing: Publishing | None = None  # once the lineage is known
        self.tied = False  # the LM head shares the input embeddings (read from the loaded model)
        self.version = 0
        self.resume_from = Path(o.resume_from) if o.resume_from else None
        self.trained_groups: set[str] = set()
        self.trained_episodes: set[str] = set()
        self.updates_done = asyncio.Event()
        self._arrived = asyncio.Event()
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.prm_timeout_s = o.prm_timeout_s
        self.board: Any = None  # step-wise: trajectories wait here for their PRM scores
        self.lineage: Any = None  # guirl.learner.lineage.Lineage, once restored

    # -- lifecycle -----------------------------------------------------------------------------------

    async def setup(self) -> None:
        from guirl.learner.buffer import TrajectoryBuffer
        from guirl.learner.lineage import Lineage

        self.buffer = TrajectoryBuffer(
            n_samples=self.n_samples,
            group_timeout_s=self.cfg.group_timeout_s,
            partial=self.cfg.partial_groups,
            max_staleness=self.cfg.max_staleness,
        )
        if self.cfg.advantage == "step_wise":
            from guirl.prm.scores import ScoreBoard

            self.board = ScoreBoard(timeout_s=self.prm_timeout_s)
        self.broker = self.connect("broker", self.broker_ep, PolicyChannel) if self.broker_ep else None
        self.coord = (
            self.connect("coordinator", self.coordinator_ep, CoordinatorChannel)
            if self.coordinator_ep
            else None
        )
        self.told = CoordinatorLink(self.coord, self.runtime, self.counters)
        self.resume_from = resume_point(self.run_dir, self.resume_from)
        self.rank0.start_followers(self.resume_from, self.run_dir / "logs", self._rank_exited)
        with self.busy("load"):
            await self.rank0.run(self._load)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.lineage = Lineage.begin(self.run_dir, self.version)
        except ValueError as exc:
            raise FatalError(f"the run's learner lineage: {exc}") from exc
        self.publishing = Publishing.make(
            self.cfg,
            self.run_dir,
            self.weights,
            epoch=self.lineage.epoch,
            broker=self.broker,
            coord=self.coord,
            engines=self.engines,
            timeout_s=self.runtime.request_timeout_s,
            counters=self.counters,
            busy=self.busy,
            name=self.name,
        )
        if self.lineage.epoch > 0 or self.version > 0:
            # A restart (or a resumed run): the engines may hold other weights, the starting ones or versions
            # the previous learner made after its checkpoint. They go back (or forward) to exactly the
            # restored ones, under the new epoch, before anything else; until they have, samples they
            # play are not this learner's and are rejected.
            if self.lineage.epoch > 0 and not self.resume_from:
                log.warning(
                    "the learner restarted with no checkpoint in %s: it starts again from the starting "
                    "weights at version 0 (train.checkpoint_every keeps progress across restarts)",
                    self.run_dir,
                )
            await self._publish(wait=True)
        if self.coord is not None:
            retired = await self.told.resumed(self.version, self.trained_groups, self.lineage.epoch)
            self.buffer.retire(retired)
            self.counters["groups.retired"] += len(retired)
        log.info("learner ready: %s on %s, version %d", self.rank0.ckpt, self.rank0.device, self.version)

    async def teardown(self) -> None:
        publishing = self.publishing
        if publishing is not None:
            publishing.cancel()
        # first thing on the torch thread: a delivery blocked in a collective fails now, not at its timeout
        leave = publishing.delivery.close if publishing is not None else lambda: None
        await self.rank0.close(leave, self.runtime.shutdown_timeout_s)
        if publishing is not None:
            publishing.delivery.shutdown()

    @property
    def trainer(self) -> Any:
        """Rank 0's `guirl.learner.trainer.Trainer`, once loaded (None before)."""
        return self.rank0.trainer

    def _rank_exited(self, rank: int, code: int) -> None:
        if not self.stopping:  # a rank gone mid-run: the job cannot go on without it
            self.crash(
                FatalError(f"learner rank {rank} exited with code {code}; see logs/learner-rank{rank}.log")
            )

    def _load(self) -> None:
        from guirl.learner.trainer import tied_embeddings

        self.rank0.load(self.resume_from)
        self.renderer = self.trainer.renderer
        self.tied = self.trainer.model is not None and tied_embeddings(self.trainer.model)
        if self.resume_from is not None:
            self._restore(self.resume_from)

    # -- trajectories in -----------------------------------------------------------------------------

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case Trajectory() as traj:
                self.counters["trajectories.received"] += 1
                self.counters["trajectories.bytes"] += req.nbytes  # the intake's bandwidth
                if foreign := self._foreign_policy(traj):
                    return self._reject(traj, foreign)
                if self.board is not None and traj.episode_id not in self.buffer.seen:
                    ready = self.board.add_trajectory(traj)  # held until its steps' scores are in
                    if ready is None:
                        return Ack(ok=True, note="waiting for its PRM scores")
                    traj = ready
                accepted = self.buffer.add(traj)
                self._arrived.set()
                return Ack(ok=True, note="accepted" if accepted else "already had it, or not trainable")
            case StepScore() as score:
                from guirl.prm.scores import valid_score

                self.counters["prm.scores_received"] += 1
                if self.board is None:
                    return Ack(ok=False, note="this learner does not use PRM scores")
                problem = valid_score(score)
                if problem:  # a NaN or out-of-range score must never reach the advantages
                    self.counters["prm.scores_refused"] += 1
                    return ErrorReply(code="schema", message=f"step score refused: {problem}")
                ready = self.board.add_score(score)
                if ready is not None:
                    self.buffer.add(ready)
                    self._arrived.set()
                return Ack(ok=True)
        return await super().handle(req)

    def _foreign_policy(self, traj: Trajectory) -> str:
        """Why `traj` was (partly) played by weights outside this learner's lineage ("" if it was not)."""
        if self.lineage is None or traj.episode_id in self.buffer.seen or traj.status != "completed":
            return ""  # the buffer says what it does with those
        return foreign_policy(traj, self.lineage, self.version)

    def _reject(self, traj: Trajectory, why: str) -> Message:
        """Never train `traj` (its behaviour policy is not one this learner holds): count it, and have the
        coordinator hand its sample out again."""
        self.buffer.seen.add(traj.episode_id)  # a redelivery is not counted twice
        self.counters["trajectories.dropped_version_mismatch"] += 1
        self.counters["samples.dropped_version_mismatch"] += len(traj.steps)
        log.warning("episode %s not trained: %s", traj.episode_id, why)
        if self.coord is not None:
            self.told.rejected(traj, why)
        return Ack(ok=True, note=f"not trained: {why}"[:300])

    def on_peer_restarted(self, name: str) -> None:
        """A restarted broker's engines serve the weights they started from: give them this learner's."""
        if name == "broker" and self.publishing is not None and self.version > 0:
            log.warning("the broker restarted: publishing version %d to it again", self.version)
            self.publishing.again()
            self._arrived.set()

    # -- the loop ------------------------------------------------------------------------------------

    async def main(self) -> None:
        cfg = self.cfg
        while not cfg.updates or self.version < cfg.updates:
            t0 = time.monotonic()
            batch = await self._collect()
            t1 = time.monotonic()
            metrics = await self._update(batch)
            if metrics is None:
                continue
            self.version += 1
            publish_s = await self._publish()
            t2 = time.monotonic()
            self.idle_s += t1 - t0
            self.busy_s += t2 - t1
            metrics.update(
                version=self.version,
                epoch=self.lineage.epoch,
                collect_s=round(t1 - t0, 3),
                update_s=round(t2 - t1 - publish_s, 3),
                publish_s=round(publish_s, 3),
                **self.publishing.last_publish,
                learner_idle_frac=round(self.idle_s / max(1e-9, self.idle_s + self.busy_s), 4),
                trajectories_received=self.counters["trajectories.received"],
                trajectories_bytes=self.counters["trajectories.bytes"],
                loop_stall_max_s=round(self.stall_max_s, 3),
                **{f"buffer.{k}": v for k, v in self.buffer.state().items()},
            )
            append_jsonl(self.metrics_path, {"time": round(time.time(), 3), **metrics})
            last = bool(cfg.updates) and self.version >= cfg.updates
            if (cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0) or last:
                with self.busy("checkpoint"):
                    await self.rank0.run(self._checkpoint)
        await self.publishing.drain()  # the last version reaches the engines before the run is done
        self.updates_done.set()

    async def _collect(self) -> Any:
        """Wait until `batch_size` groups are ready (settling timed-out groups on the way)."""
        while True:
            hold: set[str] = set()
            if self.board is not None:
                for traj in self.board.expire():  # waited long enough: unscored steps marked missing
                    self.buffer.add(traj)
                hold = self.board.waiting_groups()
            self.buffer.expire(hold)
            await self.publishing.again_if_needed(self.version, self._gather, tied=self.tied)
            batch = self.buffer.take(self.batch_size, self.version)
            if batch is not None:
                return batch
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(1.0, self.cfg.group_timeout_s))
            except TimeoutError:
                pass

    async def _update(self, batch: Any) -> dict[str, Any] | None:
        from guirl.learner.step import BatchRejected

        cfg = self.cfg
        trajs = batch.trajectories
        if cfg.shuffle_rewards:  # the control run: the same updates, with rewards that mean nothing
            trajs = shuffled_rewards(trajs, random.Random(f"{self.seed}:{self.version}"))
        self.trained_groups.update(g.group_id for g in batch.groups)
        self.trained_episodes.update(t.episode_id for t in trajs)
        try:
            adv = batch_advantages(trajs, estimator=cfg.advantage, prm_coef=cfg.prm_step_coef)
        except ValueError as exc:  # a non-finite reward: the batch is dropped and counted, never trained
            self.counters["updates.bad_batches"] += 1
            log.warning("batch of %d trajectories dropped: %s", len(trajs), exc)
            return None
        vision = self.renderer.vision_token_ids
        samples, unusable = trainable_samples(trajs, adv, vision, filter_degenerate=cfg.filter_degenerate)
        self.counters["trajectories.unusable"] += unusable
        if not samples:
            self.counters["updates.skipped_empty"] += 1
            return None
        try:
            with self.busy("update"):
                step = await self.rank0.run(self.trainer.step, samples)
        except BatchRejected as exc:  # every rank left the weights as they were: the batch is dropped
            self.counters["updates.rejected_batches"] += 1
            log.warning("batch of %d trajectories dropped: %s", len(trajs), exc)
            return None
        self._log_trained(trained_line(trajs, samples, self.version + 1, self.lineage.epoch))
        if cfg.log_advantages:  # what each trained step was credited with: to study the estimator
            append_jsonl(
                self.run_dir / "advantages.jsonl", *advantage_lines(trajs, samples, self.version + 1)
            )
        step_wise = cfg.advantage == "step_wise"
        metrics = {**step, **batch_metrics(trajs, samples, adv, batch, self.version, step_wise=step_wise)}
        if step_wise:
            metrics.update(self.board.take_stats().metrics())
        return metrics

    def _log_trained(self, line: dict[str, Any]) -> None:
        """`trained.jsonl` (see `batch.trained_line`): a full disk must not stop training; it is counted
        and said once."""
        try:
            append_jsonl(self.run_dir / TRAINED_LEDGER, line)
        except OSError as exc:
            self.counters["ledger.unwritten"] += 1
            if self.counters["ledger.unwritten"] == 1:
                log.error("cannot write %s: %s", self.run_dir / TRAINED_LEDGER, exc)

    # -- checkpoints (guirl.learner.checkpoint) -------------------------------------------------------

    def _checkpoint(self) -> Path:
        """On the torch thread: `checkpoints/v<version>/`, written whole then renamed into place."""
        state = LearnerState(
            version=self.version,
            trained_groups=sorted(self.trained_groups),
            trained_episodes=sorted(self.trained_episodes),
            buffer=self.buffer.state(),
        )
        final = save_checkpoint(self.run_dir, state, self.trainer.save)
        self.counters["checkpoints"] += 1
        return final

    def _restore(self, ckpt: Path) -> None:
        """The bookkeeping of `ckpt` (the trainer has restored the model, optimizer and RNG)."""
        state = load_learner_state(ckpt)
        self.version = state.version
        self.trained_groups = set(state.trained_groups)
        self.trained_episodes = set(state.trained_episodes)
        # a group trained before the checkpoint is settled: a straggler of it is never trained again
        self.buffer.settled.update(self.trained_groups)
        self.buffer.seen.update(self.trained_episodes)
        log.info("resumed from %s at version %d", ckpt, self.version)

    # -- weights out (guirl.learner.publish) --------------------------------------------------------------

    async def _publish(self, *, wait: bool = False) -> float:
        """Make the new weights the engines' and tell the coordinator (`Publishing`); the seconds the loop
        was held up by it."""
        return await self.publishing.publish(
            self.version, self._gather, tied=self.tied, current=lambda: self.version, wait=wait
        )

    async def _gather(self) -> dict[str, Any]:
        """The full state dict, gathered on the torch thread (every rank takes part)."""
        with self.busy("gather"):
            return await self.rank0.run(self.trainer.full_state)
