"""The Learner actor: trains the policy on trajectories as they arrive, and publishes new weights.

The loop reads like the algorithm (slime's train.py): collect `batch_size` complete GRPO groups →
advantages → one decoupled update → publish the weights (engines load them between batches; the
coordinator hears the new version, which opens its staleness gate) → log metrics. Trajectories keep
arriving while it trains: acting never waits for learning. All torch work runs on one dedicated thread,
so the mailbox keeps answering.

The torch side is a `Trainer` (guirl/learner/trainer.py): with `ranks > 1` this actor is rank 0 of a
data-parallel FSDP2 job and drives ranks 1..N-1, which it starts itself on a local run (under torchrun
they exist already). A rank that dies takes the actor down with it; the supervisor restarts the learner,
which resumes from the latest checkpoint with fresh ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from guirl.config.schema import TrainConfig
from guirl.messages import CoordinatorChannel, LearnerChannel, PolicyChannel
from guirl.messages.types import (
    Ack,
    EpisodeRejected,
    ErrorReply,
    GroupsRetired,
    LearnerResumed,
    Message,
    StatsRequest,
    StepScore,
    Trajectory,
    WeightsPublished,
)
from guirl.net import free_port, host_address
from guirl.runtime.base import Actor, Request
from guirl.runtime.errors import ActorError, FatalError
from guirl.runtime.retry import retry_idempotent

log = logging.getLogger(__name__)

TRAINED_LEDGER = "trained.jsonl"
REPUBLISH_MAX_S = 60.0
REPUBLISH_INTERVAL_S = 5.0
"""At most this often the learner publishes its weights again to engines that may not hold them."""


class Learner(Actor):
    """See the module docstring."""

    role = "learner"
    channel = LearnerChannel

    def __init__(
        self,
        name: str,
        *,
        train: dict | TrainConfig | None = None,
        ckpt: str,
        run_dir: str,
        n_samples: int,
        batch_size: int,
        temperature: float = 1.0,
        broker: str = "",
        coordinator: str = "",
        device: str = "cpu",
        seed: int = 0,
        engines: int = 1,
        resume_from: str = "",
        ranks: int = 1,
        prm_timeout_s: float = 300.0,
        weight_layout: str = "guirl",
        weight_flattened: bool = True,
        weight_backend: str = "gloo",
        weight_dtype: str = "",
        follower_hosts: list[dict[str, Any] | None] | None = None,
        master_port: int = 0,
        **kwargs: Any,
    ) -> None:
        """`follower_hosts`: where ranks 1..N-1 run when some are on other cluster hosts (see
        `spawn_followers`), `master_port` the rendezvous port of rank 0's store then."""
        super().__init__(name, **kwargs)
        self.cfg = train if isinstance(train, TrainConfig) else msgspec.convert(train or {}, TrainConfig)
        self.ckpt = ckpt
        self.run_dir = Path(run_dir)
        self.n_samples, self.batch_size = n_samples, batch_size
        self.temperature = temperature
        self.broker_ep, self.coordinator_ep = broker, coordinator
        self.device = device
        self.seed = seed
        self.engines = engines  # broker engines that join the weight group
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        self.ranks = ranks
        self.follower_hosts = list(follower_hosts or [])
        if self.follower_hosts and len(self.follower_hosts) != ranks - 1:
            raise ValueError(
                f"follower_hosts places {len(self.follower_hosts)} ranks, not ranks - 1 = {ranks - 1}"
            )
        self.master_port = master_port
        self._followers: list[Any] = []
        self._rendezvous: dict[str, str] | None = None  # rank 0's torchrun variables, for ranks it starts
        self._store: Any = None  # and its rendezvous store
        self._watchers: list[asyncio.Task] = []
        self.trainer: Any = None
        self._group: Any = None  # the open WeightGroupSpec, once the first broadcast has set it up
        self._sender: Any = None
        self.weight_layout = weight_layout
        self.weight_flattened = weight_flattened
        self.weight_backend = weight_backend
        self.weight_dtype = weight_dtype
        self._publishing: asyncio.Task | None = None  # the delivery of the last version, while it runs
        self._weights_executor: ThreadPoolExecutor | None = None
        self.last_publish: dict[str, Any] = {}
        self.version = 0
        self.resume_from = Path(resume_from) if resume_from else None
        self.trained_groups: set[str] = set()
        self.trained_episodes: set[str] = set()
        self.updates_done = asyncio.Event()
        self._arrived = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.prm_timeout_s = prm_timeout_s
        self.board: Any = None  # step-wise: trajectories wait here for their PRM scores
        self.lineage: Any = None  # guirl.learner.lineage.Lineage, once restored
        self._republish = False  # the engines may not hold this learner's weights: publish them again
        self._republish_at = 0.0
        self._republish_backoff = 0.0
        self._republish_gen = 0  # bumped by each cause to publish again; a delivery clears only its own
        self._rejections: set[asyncio.Task] = set()

    # -- lifecycle -----------------------------------------------------------------------------------

    async def setup(self) -> None:
        from guirl.learner.buffer import TrajectoryBuffer

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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"learner-{self.name}")
        latest = latest_checkpoint(self.run_dir)
        if latest is not None and (self.resume_from is None or _version(latest) > _version(self.resume_from)):
            # restarted by the supervisor mid-run: carry on from the run's latest checkpoint, never from
            # the starting weights or the one the run was resumed from (the engines are ahead of those)
            self.resume_from = latest
        if self.ranks > 1 and "RANK" not in os.environ:
            self._start_followers()
        with self.busy("load"):
            await self._torch(self._load)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        from guirl.learner.lineage import Lineage

        try:
            self.lineage = Lineage.begin(self.run_dir, self.version)
        except ValueError as exc:
            raise FatalError(f"the run's learner lineage: {exc}") from exc
        if self.lineage.epoch > 0 or self.version > 0:
            # A restart (or a resumed run): the engines may hold other weights, the starting ones or versions
            # the previous learner made after its checkpoint. They go back (or forward) to exactly the
            # restored ones, under the new epoch, before anything else; until they have, samples they
            # play are not this learner's and are rejected.
            if self.lineage.epoch > 0 and not (latest or self.resume_from):
                log.warning(
                    "the learner restarted with no checkpoint in %s: it starts again from the starting "
                    "weights at version 0 (train.checkpoint_every keeps progress across restarts)",
                    self.run_dir,
                )
            await self._publish(wait=True)
        if self.coord is not None:
            # whatever the previous learner received after its checkpoint died with it: the coordinator
            # hands those groups out again under fresh ids (a fresh start has nothing admitted: a no-op),
            # and a member of a retired group still on its way is never trained
            resumed = LearnerResumed(
                version=self.version, trained_groups=sorted(self.trained_groups), epoch=self.lineage.epoch
            )
            rt = self.runtime
            try:  # asking again is harmless: the answer is every group retired so far
                reply = await retry_idempotent(
                    lambda: self.coord.request(resumed, timeout=rt.request_timeout_s),
                    attempts=5,
                    initial=rt.reconnect_backoff_initial_s,
                    cap=rt.reconnect_backoff_max_s,
                )
            except ActorError as exc:  # the coordinator is the driver's: it is gone only when the run is
                log.warning("could not tell the coordinator this learner resumed: %s", exc)
                reply = None
            if isinstance(reply, GroupsRetired):
                self.buffer.retire(reply.groups)
                self.counters["groups.retired"] += len(reply.groups)
        log.info("learner ready: %s on %s, version %d", self.ckpt, self.device, self.version)

    async def teardown(self) -> None:
        for w in self._watchers:
            w.cancel()
        try:
            if self._executor is not None:
                # on the torch thread, after whatever runs there (a step, or a load still going: the
                # trainer's state is only read once it is done)
                if self._publishing is not None:
                    self._publishing.cancel()
                await self._torch(self._shutdown_torch)
                self._executor.shutdown(wait=True, cancel_futures=True)
                if self._weights_executor is not None:
                    self._weights_executor.shutdown(wait=False, cancel_futures=True)
        finally:
            for proc in self._followers:  # released by the stop; killed if not gone in time
                try:
                    await asyncio.wait_for(_exited(proc), self.runtime.shutdown_timeout_s)
                except TimeoutError:
                    proc.kill()
                    await _exited(proc)

    def _shutdown_torch(self) -> None:
        if self._sender is not None:  # a delivery blocked in a collective fails now, not at its timeout
            self._sender.close()
        if self.trainer is not None and self.trainer.info is not None:
            try:  # releases the followers and leaves the process group
                self.trainer.stop()
            except Exception as exc:  # a rank already gone
                log.warning("stopping the learner ranks: %s", exc)

    def _start_followers(self) -> None:
        from guirl.learner.trainer import spawn_followers

        options = {
            "ckpt": self.ckpt,
            "train": msgspec.to_builtins(self.cfg),
            "seed": self.seed,
            "temperature": self.temperature,
            "resume_from": str(self.resume_from or ""),
        }
        self._followers, self._rendezvous, self._store = spawn_followers(
            options,
            world=self.ranks,
            log_dir=self.run_dir / "logs",
            remote=self.follower_hosts or None,
            master_port=self.master_port,
        )
        for rank, proc in enumerate(self._followers, start=1):
            self._watchers.append(asyncio.create_task(self._watch(rank, proc), name=f"rank{rank}"))
        log.info("started learner ranks 1..%d (pids %s)", self.ranks - 1, [p.pid for p in self._followers])

    async def _watch(self, rank: int, proc: Any) -> None:
        code = await _exited(proc)
        if not self.stopping:  # a rank gone mid-run: the job cannot go on without it
            self.crash(
                FatalError(f"learner rank {rank} exited with code {code}; see logs/learner-rank{rank}.log")
            )

    async def _torch(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _load(self) -> None:
        from guirl.learner.trainer import Trainer

        self.trainer = Trainer(
            ckpt=self.ckpt, train=self.cfg, seed=self.seed, temperature=self.temperature, device=self.device
        )
        try:
            self.trainer.load(self.resume_from, rendezvous=self._rendezvous, store=self._store)
        except ValueError as exc:  # not a checkpoint directory
            raise FatalError(str(exc)) from exc
        self.renderer = self.trainer.renderer
        if self.resume_from is not None:
            self._restore(self.resume_from)

    # -- trajectories in -----------------------------------------------------------------------------

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case Trajectory() as traj:
                self.counters["trajectories.received"] += 1
                foreign = self._foreign_policy(traj)
                if foreign:
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
        for s in traj.steps:
            if not self.lineage.holds(s.policy_epoch, s.policy_version, self.version):
                return (
                    f"step {s.step} played by version {s.policy_version} of epoch {s.policy_epoch}; the "
                    f"learner is at version {self.version} of epoch {self.lineage.epoch}, which began from "
                    f"version {self.lineage.forks[-1]}"
                )
        return ""

    def _reject(self, traj: Trajectory, why: str) -> Message:
        """Never train `traj` (its behaviour policy is not one this learner holds): count it, and have the
        coordinator hand its sample out again."""
        self.buffer.seen.add(traj.episode_id)  # a redelivery is not counted twice
        self.counters["trajectories.dropped_version_mismatch"] += 1
        self.counters["samples.dropped_version_mismatch"] += len(traj.steps)
        log.warning("episode %s not trained: %s", traj.episode_id, why)
        if self.coord is not None:
            msg = EpisodeRejected(
                episode_id=traj.episode_id,
                group_id=traj.group_id,
                sample_index=traj.sample_index,
                task_id=traj.task_id,
                reason=why[:300],
            )
            task = asyncio.create_task(self._tell_rejected(msg))
            self._rejections.add(task)
            task.add_done_callback(self._rejections.discard)
        return Ack(ok=True, note=f"not trained: {why}"[:300])

    async def _tell_rejected(self, msg: EpisodeRejected) -> None:
        try:
            await self.coord.request(msg, timeout=self.runtime.request_timeout_s)
        except ActorError as exc:  # the coordinator is the driver's: it is gone only when the run is
            self.counters["rejections.untold"] += 1
            log.warning("could not tell the coordinator to hand %s out again: %s", msg.episode_id, exc)

    def on_peer_restarted(self, name: str) -> None:
        """A restarted broker's engines serve the weights they started from: give them this learner's."""
        if name == "broker" and self.lineage is not None and self.version > 0:
            log.warning("the broker restarted: publishing version %d to it again", self.version)
            self._republish = True
            self._republish_gen += 1
            self._arrived.set()

    async def _republish_if_needed(self) -> None:
        """Publish the current weights again when the engines may not hold them (a failed publish, a
        restarted broker), at most every few seconds and only while the broker answers."""
        if not self._republish or self.broker is None:
            return
        if self._publishing is not None and not self._publishing.done():
            return  # a delivery is under way: it settles the flag
        if time.monotonic() < self._republish_at or self.broker.state != "alive":
            return
        self.counters["publish.again"] += 1
        await self._publish(wait=True)
        if self._republish:  # it failed again: back off (a large model's publish is not free), from its end
            self._republish_backoff = min(
                REPUBLISH_MAX_S, max(REPUBLISH_INTERVAL_S, 2 * self._republish_backoff)
            )
            self._republish_at = time.monotonic() + self._republish_backoff

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
                **self.last_publish,
                learner_idle_frac=round(self.idle_s / max(1e-9, self.idle_s + self.busy_s), 4),
                loop_stall_max_s=round(self.stall_max_s, 3),
                **{f"buffer.{k}": v for k, v in self.buffer.state().items()},
            )
            self._log_metrics(metrics)
            last = bool(cfg.updates) and self.version >= cfg.updates
            if (cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0) or last:
                with self.busy("checkpoint"):
                    await self._torch(self._checkpoint)
        if self._publishing is not None:  # the last version reaches the engines before the run is done
            await self._publishing
            self._publishing = None
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
            await self._republish_if_needed()
            batch = self.buffer.take(self.batch_size, self.version)
            if batch is not None:
                return batch
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(1.0, self.cfg.group_timeout_s))
            except TimeoutError:
                pass

    async def _update(self, batch: Any) -> dict[str, Any] | None:
        from guirl.learner.advantages import trajectory_advantages
        from guirl.learner.samples import samples_from_trajectory

        cfg = self.cfg
        trajs = batch.trajectories
        if cfg.shuffle_rewards:  # the control run: the same updates, with rewards that mean nothing
            trajs = shuffled_rewards(trajs, random.Random(f"{self.seed}:{self.version}"))
        self.trained_groups.update(g.group_id for g in batch.groups)
        self.trained_episodes.update(t.episode_id for t in trajs)
        try:
            adv = trajectory_advantages(
                [t.reward for t in trajs],
                [t.group_id for t in trajs],
                [[s.prm_score for s in t.steps] for t in trajs],
                [[s.step for s in t.steps] for t in trajs],
                estimator=cfg.advantage,
                prm_coef=cfg.prm_step_coef,
            )
        except ValueError as exc:  # a non-finite reward: the batch is dropped and counted, never trained
            self.counters["updates.bad_batches"] += 1
            log.warning("batch of %d trajectories dropped: %s", len(trajs), exc)
            return None
        samples, unusable = [], 0
        for traj, advantages, informative in zip(trajs, adv.advantages, adv.informative, strict=True):
            try:
                made = samples_from_trajectory(traj, advantages)
                vision = self.renderer.vision_token_ids
                bad = next((s for s in made if vision.intersection(s.response_ids)), None)
                if bad is not None:  # the forward would count it as an image slot and fail the batch
                    raise ValueError(f"{bad.name}: the response holds a vision token")
            except ValueError as exc:  # a malformed trajectory is counted, never trained on
                unusable += 1
                log.warning("trajectory %s not trainable: %s", traj.episode_id, exc)
                continue
            if cfg.filter_degenerate:
                made = [m for m, keep in zip(made, informative, strict=True) if keep]
            samples.extend(made)
        self.counters["trajectories.unusable"] += unusable
        if not samples:
            self.counters["updates.skipped_empty"] += 1
            return None
        from guirl.learner.step import BatchRejected

        try:
            with self.busy("update"):
                step = await self._torch(self._step, samples)
        except BatchRejected as exc:  # every rank left the weights as they were: the batch is dropped
            self.counters["updates.rejected_batches"] += 1
            log.warning("batch of %d trajectories dropped: %s", len(trajs), exc)
            return None
        self._log_trained(trajs, samples)
        if cfg.log_advantages:
            self._log_advantages(trajs, samples)
        versions = [s.policy_version for s in samples]
        values = [s.advantage for s in samples]
        mean = sum(values) / len(values)
        rewards = [t.reward for t in trajs]
        metrics = {
            **step,
            "reward_mean": round(sum(rewards) / len(rewards), 4),
            "success_rate": round(sum(1 for t in trajs if (t.score or 0) >= 1.0) / len(trajs), 4),
            "adv_mean": round(mean, 4),
            "adv_std": round((sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5, 4)
            if len(values) > 1
            else 0.0,
            "degenerate_groups": adv.degenerate,
            "groups": len(batch.groups),
            "trajectories": len(trajs),
            "stale_steps_dropped": batch.stale_steps,
            "partial_groups": batch.partial_groups,
            "version_lag_mean": round(sum(self.version - max(v, 0) for v in versions) / len(versions), 3),
            "version_lag_max": max(self.version - max(v, 0) for v in versions),
            "version_lag_min": min(self.version - max(v, 0) for v in versions),
        }
        metrics.update(reward_part_means(trajs))
        if cfg.advantage == "step_wise":
            metrics.update(buckets=adv.buckets, outcome_only_steps=adv.outcome_only_steps)
            metrics.update(prm_metrics(trajs))
            metrics.update(self.board.take_stats().metrics())
        return metrics

    def _log_trained(self, trajs: list[Trajectory], samples: list) -> None:
        """`trained.jsonl`: per update, each episode trained and the (epoch, version) of its trained steps
        (what the chaos suite checks: nothing trained twice, nothing of weights outside the lineage)."""
        used = {s.episode_id for s in samples}
        line = {
            "version": self.version + 1,
            "epoch": self.lineage.epoch if self.lineage is not None else 0,
            "episodes": {
                t.episode_id: [[s.policy_epoch, s.policy_version] for s in t.steps]
                for t in trajs
                if t.episode_id in used
            },
        }
        try:
            with open(self.run_dir / TRAINED_LEDGER, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as exc:  # a full disk must not stop training; it is counted and said once
            self.counters["ledger.unwritten"] += 1
            if self.counters["ledger.unwritten"] == 1:
                log.error("cannot write %s: %s", self.run_dir / TRAINED_LEDGER, exc)

    def _log_advantages(self, trajs: list[Trajectory], samples: list) -> None:
        """What each trained step was credited with (`train.log_advantages`): to study the estimator."""
        by_episode = {t.episode_id: t for t in trajs}
        with open(self.run_dir / "advantages.jsonl", "a") as f:
            for s in samples:
                t = by_episode[s.episode_id]
                step = next(x for x in t.steps if x.step == s.step)
                line = {
                    "version": self.version + 1,
                    "episode_id": s.episode_id,
                    "group_id": s.group_id,
                    "task_id": t.task_id,
                    "step": s.step,
                    "reward": t.reward,
                    "prm_score": step.prm_score,
                    "prm_status": step.prm_status,
                    "advantage": s.advantage,
                }
                f.write(json.dumps(line) + "\n")

    def _step(self, samples: list) -> dict[str, Any]:
        return self.trainer.step(samples)

    # -- checkpoints ---------------------------------------------------------------------------------

    def _checkpoint(self) -> Path:
        """`checkpoints/v<version>/`: the model in Hugging Face format (loadable by transformers, with
        the tokenizer and image processor), the optimizer (keyed by parameter name: any number of ranks
        can resume from it), the RNG states, and `learner.json` (version, groups and episodes trained)
        written last; built in a temporary directory and renamed into place, so a kill mid-write leaves
        the previous checkpoint the latest complete one."""
        root = self.run_dir / "checkpoints"
        final, tmp = root / f"v{self.version:06d}", root / f".v{self.version:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.trainer.save(tmp)
        learner = {
            "version": self.version,
            "trained_groups": sorted(self.trained_groups),
            "trained_episodes": sorted(self.trained_episodes),
            "buffer": self.buffer.state(),
        }
        (tmp / "learner.json").write_text(json.dumps(learner))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in sorted(root.glob("v*"))[:-2]:  # keep the last two
            shutil.rmtree(old, ignore_errors=True)
        self.counters["checkpoints"] += 1
        return final

    def _restore(self, ckpt: Path) -> None:
        """The bookkeeping of `ckpt` (the trainer has restored the model, optimizer and RNG)."""
        state = json.loads((ckpt / "learner.json").read_text())
        self.version = int(state["version"])
        self.trained_groups = set(state["trained_groups"])
        self.trained_episodes = set(state["trained_episodes"])
        # a group trained before the checkpoint is settled: a straggler of it is never trained again
        self.buffer.settled.update(self.trained_groups)
        self.buffer.seen.update(self.trained_episodes)
        log.info("resumed from %s at version %d", ckpt, self.version)

    # -- weights out ---------------------------------------------------------------------------------

    async def _publish(self, *, wait: bool = False) -> float:
        """Make the new weights the engines' and tell the coordinator; returns the seconds the learner was
        held up by it.

        The full state is gathered on the torch thread (every rank takes part). Delivering it runs on a
        thread of its own, overlapped with the next update (`train.overlap_publish`, unless `wait`): one
        delivery at a time, the next publish waits for the previous one. `broadcast`: the broker's
        engines join the learner's weight group and receive the state dict (SGLang's
        update_weights_from_distributed pattern; `weight_layout` "sglang": bucket by bucket, the plan told
        to the engines); if that fails, the disk path serves this version and a fresh group is set up
        next time. `disk`: a safetensors file the engines load. Phase times go in the metrics
        (`publish.gather_s`, `publish.broadcast_s`, `publish.engine_s`: from the last byte sent to the
        broker's answer that every engine serves the version)."""
        started = time.monotonic()
        if self._publishing is not None:
            await self._publishing
            self._publishing = None
        with self.busy("gather"):
            state = await self._torch(self.trainer.full_state)
        timings = {"gather_s": time.monotonic() - started}
        task = asyncio.create_task(
            self._deliver(self.version, state, timings), name=f"publish-v{self.version}"
        )
        if wait or not self.cfg.overlap_publish:
            await task
        else:
            self._publishing = task
        return time.monotonic() - started

    async def _deliver(self, version: int, state: dict[str, Any], timings: dict[str, float]) -> None:
        epoch = self.lineage.epoch
        gen = self._republish_gen
        try:
            done = False
            if self.cfg.weight_sync == "broadcast" and self.broker is not None:
                done = await self._broadcast(version, state, timings)
            if not done:
                with self.busy("save_weights"):
                    path = await self._weights_thread(self._save_weights, version, state)
                if not await self._tell(
                    self.broker, WeightsPublished(version=version, path=str(path), epoch=epoch)
                ):
                    raise ActorError(f"the broker did not take version {version}")
            await self._tell(self.coord, WeightsPublished(version=version, learner_step=version, epoch=epoch))
        except Exception as exc:  # the engines keep the previous version; published again soon
            self.counters["publish.failed"] += 1
            log.error("publishing version %d failed: %r", version, exc)
            self._republish = True
            self._republish_gen += 1
            return
        if version == self.version and gen == self._republish_gen:  # nothing asked for it again meanwhile
            self._republish = False
            self._republish_backoff = 0.0
        self.last_publish = {f"publish.{k}": round(v, 4) for k, v in timings.items()} | {
            "publish.version": version
        }

    async def _weights_thread(self, fn: Any, *args: Any) -> Any:
        if self._weights_executor is None:
            self._weights_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"weights-{self.name}"
            )
        return await asyncio.get_running_loop().run_in_executor(self._weights_executor, fn, *args)

    async def _tell(self, conn: Any, msg: Message) -> bool:
        if conn is None:
            return True
        try:
            await conn.request(msg, timeout=self.runtime.request_timeout_s)
            return True
        except ActorError as exc:  # the broker restarting: it is told again (see `_republish_if_needed`)
            self.counters["tell.failed"] += 1
            log.warning("could not tell %s about version %d: %s", conn.name, msg.version, exc)
            return False

    async def _broadcast(self, version: int, state: dict[str, Any], timings: dict[str, float]) -> bool:
        from guirl.learner.trainer import savable_state, tied_embeddings
        from guirl.weights.broadcast import (
            WeightGroupSpec,
            WeightSender,
            WeightSyncError,
            sglang_buckets,
            unique_group_name,
        )

        ranks = await self._live_ranks()
        if ranks == 0:
            return False  # no engine up to join: the disk path keeps the version for when they are back
        if self._group is not None and self._group.world_size != 1 + ranks:
            # an engine died or came back: a group of the engines that are up now
            await self._weights_thread(self._sender.close)
            self._group = self._sender = None
        if self._group is None:
            self._group = WeightGroupSpec(
                host=host_address(),  # the learner host's cluster address (loopback on one machine)
                port=free_port(host_address()),
                world_size=1 + ranks,
                group_name=unique_group_name(),  # SGLang refuses a name it still holds (a failed group's)
                timeout_s=min(120.0, self.runtime.request_timeout_s),
                join_timeout_s=self.cfg.weight_join_timeout_s,
                backend=self.weight_backend,  # type: ignore[arg-type]
                layout=self.weight_layout,  # type: ignore[arg-type]
            )
            self._sender = WeightSender()
        bucket_bytes = self.cfg.weight_bucket_mb << 20
        tied = tied_embeddings(self.trainer.model)

        def prepare() -> tuple[dict[str, Any], list]:  # off the event loop: copies of the whole model
            ready = _cast(savable_state(state, tied=tied), self.weight_dtype)
            return ready, sglang_buckets(ready, bucket_bytes) if self.weight_layout == "sglang" else []

        with self.busy("gather"):
            state, buckets = await self._weights_thread(prepare)
        msg = WeightsPublished(
            version=version,
            epoch=self.lineage.epoch,
            learner_step=version,
            weight_group=self._group.to_dict(),
            buckets=[b.to_dict() for b in buckets],
        )
        told = asyncio.create_task(self._tell(self.broker, msg))  # the engines join while we send
        sent = time.monotonic()
        try:
            stats = await self._weights_thread(self._send, version, state, buckets, bucket_bytes)
            timings["broadcast_s"] = time.monotonic() - sent
            ok = await told
            timings["engine_s"] = time.monotonic() - sent - timings["broadcast_s"]
        except WeightSyncError as exc:
            told.cancel()
            log.warning(
                "weight broadcast of version %d failed (%s); the engines load it from disk", version, exc
            )
            self.counters["publish.broadcast_failed"] += 1
            await self._weights_thread(self._sender.close)
            self._group = self._sender = None
            return False
        self.counters["publish.broadcast_bytes"] += stats
        self.last_broadcast_s = timings["broadcast_s"]
        if not ok:  # the engines left (the broker abandoned or failed the update): a fresh group next time
            await self._weights_thread(self._sender.close)
            self._group = self._sender = None
        return ok

    async def _live_ranks(self) -> int:
        """The weight-group ranks of the broker's healthy engines now (all of them, if it cannot say)."""
        try:
            reply = await self.broker.request(StatsRequest(), timeout=self.runtime.request_timeout_s)
        except ActorError as exc:
            log.warning("could not ask the broker which engines are up: %s", exc)
            return self.engines
        return int(getattr(reply, "counters", {}).get("weights.live_ranks", self.engines))

    def _send(self, version: int, state: dict[str, Any], buckets: list, bucket_bytes: int) -> int:
        """On the weights thread: join (first time) and send; the bytes sent."""
        if not self._sender.is_open:
            self._sender.open(self._group)
        if not buckets:
            return self._sender.broadcast(state, version, bucket_bytes).nbytes
        return sum(
            self._sender.send_sglang_bucket(state, b, flattened=self.weight_flattened) for b in buckets
        )

    def _save_weights(self, version: int, state: dict[str, Any]) -> Path:
        """The state dict as safetensors under `weights/v<version>/`, written whole then renamed into place;
        older versions are removed (the engines have moved on)."""
        from safetensors.torch import save_file

        from guirl.learner.trainer import savable_state, tied_embeddings

        root = self.run_dir / "weights"
        final, tmp = root / f"v{version:06d}", root / f".v{version:06d}.tmp"
        epoch = str(self.lineage.epoch if self.lineage is not None else 0)
        with contextlib.suppress(OSError):
            if (final / "epoch").read_text() == epoch:  # published again: the same weights, which a broker
                return final  # may be loading right now
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "epoch").write_text(epoch)
        state = savable_state(state, tied=tied_embeddings(self.trainer.model))
        save_file(state, str(tmp / "model.safetensors"))
        shutil.rmtree(final, ignore_errors=True)  # a resumed run publishes its version again
        os.replace(tmp, final)
        for old in root.glob("v*"):
            if old != final and old.name < final.name:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def _log_metrics(self, metrics: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({"time": round(time.time(), 3), **metrics}) + "\n")


def shuffled_rewards(trajs: list[Trajectory], rng: random.Random) -> list[Trajectory]:
    """The trajectories with their rewards and reward parts permuted among them (`train.shuffle_rewards`)."""
    order = list(range(len(trajs)))
    rng.shuffle(order)
    return [
        msgspec.structs.replace(t, reward=trajs[j].reward, reward_parts=trajs[j].reward_parts)
        for t, j in zip(trajs, order, strict=True)
    ]


def reward_part_means(trajs: list[Trajectory]) -> dict[str, float]:
    """`reward.<part>`: the mean of each rule-reward component over the trajectories that have it (GUI-R1
    mode: format, type, point, text, accuracy)."""
    sums: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.reward_parts.items():
            sums.setdefault(k, []).append(float(v))
    return {f"reward.{k}": round(sum(v) / len(v), 4) for k, v in sorted(sums.items())}


def prm_metrics(trajs: list[Trajectory]) -> dict[str, float | int]:
    """The PRM scores of a batch: their distribution, and how often their sign agrees with the episode's
    outcome (a step judged +1 in a solved episode, or -1 in a failed one)."""
    scores = [(s.prm_score, t.reward) for t in trajs for s in t.steps if s.prm_score is not None]
    signed = [(p, r) for p, r in scores if p != 0 and r != 0]
    n = len(scores)
    statuses = Counter(s.prm_status for t in trajs for s in t.steps)
    return {
        **{f"prm.steps_{k}": statuses[k] for k in ("scored", "invalid", "error", "missing", "dropped")},
        "prm.score_mean": round(sum(p for p, _ in scores) / n, 4) if n else 0.0,
        "prm.positive_frac": round(sum(p > 0 for p, _ in scores) / n, 4) if n else 0.0,
        "prm.negative_frac": round(sum(p < 0 for p, _ in scores) / n, 4) if n else 0.0,
        "prm.agreement": round(sum((p > 0) == (r > 0) for p, r in signed) / len(signed), 4)
        if signed
        else 0.0,
        "prm.scored_frac": round(n / max(1, sum(len(t.steps) for t in trajs)), 4),
    }


def _exited(proc: Any) -> asyncio.Future:
    """The exit code of a subprocess, awaited on a daemon thread of its own (never the loop's shared
    pool, which a few follower waits would fill; never one that keeps the interpreter alive)."""
    import threading

    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def wait() -> None:
        code = proc.wait()
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(code))

    threading.Thread(target=wait, name=f"wait-{proc.pid}", daemon=True).start()
    return fut


def _cast(state: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Floating-point tensors in `dtype` ("" or "float32": as trained) for the engines."""
    import torch

    if dtype in ("", "float32"):
        return state
    target = getattr(torch, dtype)
    return {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}


def _version(ckpt: Path) -> int:
    return int(json.loads((ckpt / "learner.json").read_text())["version"])


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (a directory renamed into place has its learner.json)."""
    found = sorted(p for p in Path(run_dir, "checkpoints").glob("v*") if (p / "learner.json").is_file())
    return found[-1] if found else None
