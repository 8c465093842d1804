"""The Coordinator actor: owns the task set, hands out episodes on request, and tracks each episode id to
exactly one end state.

Workers pull (`WorkRequest` → `EpisodeAssignment` | `NoWork`), so a busy cluster is never pushed more
than it asked for. Every assignment gets a fresh episode id; its end state is `completed` (scored),
`retried` (an environment fault: the task goes back to the head of the queue as a new attempt, until
`max_attempts`, after which it is `aborted`) or `aborted`. An episode whose worker dies is retried the
same way. A late report of an episode that already ended (its worker was declared dead meanwhile) is
refused and counted, and the worker then never delivers its trajectory; a repeated report (a retry whose
first answer was lost) is answered as the first was. A completed training episode is held until its worker
says the learner has its trajectory (`EpisodeDelivered`): if the worker dies first, the same sample goes
out again (the learner ignores the second of two trajectories of one sample).

Eval mode runs every task `n_samples` times, once through. Train mode admits whole GRPO groups (a task
and `n_samples` attempts of it, one `group_id`) from a task order reshuffled each epoch, under AReaL's
staleness bound: at most `(learner_version + max_staleness + 1) x batch_size x n_samples` episodes are
ever admitted, so no episode starts whose sample would reach the learner more than `max_staleness`
versions old in steady state (VM time spent on a sample the learner would throw away is waste). The
learner's version arrives as `WeightsPublished`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guirl.fileio import write_json_atomic
from guirl.messages import CoordinatorChannel
from guirl.messages.types import (
    Ack,
    EpisodeAssignment,
    EpisodeDelivered,
    EpisodeEnded,
    EpisodeRejected,
    GroupsRetired,
    LearnerResumed,
    Message,
    NoWork,
    Register,
    WeightsPublished,
    WorkRequest,
)
from guirl.runtime.base import Actor, Request
from guirl.vmpool.tasks.suite import SuiteTask

log = logging.getLogger(__name__)

EPISODE_LEDGER = "episodes.jsonl"
RESULT_LEDGER = "results.jsonl"
"""Each task's final result (`TaskResult`), a line each as it is decided: what `guirl eval --resume` keeps."""


@dataclass
class _Todo:
    """A task attempt waiting to be assigned."""

    task: SuiteTask
    sample_index: int = 0
    attempt: int = 0
    group_id: str = ""
    eval_version: int = -1  # a periodic evaluation episode of the policy at this version (train mode)
    eval_epoch: int = 0  # ... of this lineage epoch (a restarted learner makes its version numbers again)


@dataclass
class _Running:
    todo: _Todo
    peer: str
    worker: str
    assigned_at: float = field(default_factory=time.monotonic)


@dataclass
class TaskResult:
    """The final word on one (task, sample): its last episode's end state."""

    task_id: str
    domain: str
    status: str
    score: float | None
    outcome: str
    episode_id: str
    attempts: int
    steps: int
    env_errors: list[str]
    seconds: float


class Coordinator(Actor):
    """Hands out the episodes of a task set; see the module docstring."""

    role = "coordinator"
    channel = CoordinatorChannel

    def __init__(
        self,
        name: str,
        *,
        tasks: list[SuiteTask],
        mode: str = "eval",
        n_samples: int = 1,
        max_attempts: int = 3,
        max_steps: int = 15,
        seed: int = 0,
        batch_size: int = 1,
        max_staleness: int = 0,
        max_groups: int = 0,
        last_version: int = 0,
        state_path: str = "",
        eval_tasks: list[SuiteTask] | None = None,
        eval_every: int = 0,
        eval_log: str = "",
        heartbeat_dir: str = "",
        heartbeat_s: float = 30.0,
        first_seq: int = 0,
        **kwargs: Any,
    ) -> None:
        """`heartbeat_dir`: the run directory, where the run's heartbeat is written every `heartbeat_s` while
        the coordinator runs (the cloud reaper takes a silent run's instances for leaked). `first_seq`: the
        episode ids an earlier session of the run used (a resumed eval's new ones come after).
        `last_version`: the learner's last version (`train.updates`; 0: not known). Once it is published, no
        training sample is handed out: no update would use it (see `updates_made`)."""
        super().__init__(name, **kwargs)
        self.heartbeat_dir = Path(heartbeat_dir) if heartbeat_dir else None
        # every assignment and every end state, a line each (the chaos suite checks one end per episode)
        self.ledger = self.heartbeat_dir / EPISODE_LEDGER if self.heartbeat_dir else None
        self.heartbeat_s = heartbeat_s
        if mode not in ("eval", "train"):
            raise ValueError(f"mode must be 'eval' or 'train', got {mode!r}")
        self.mode = mode
        self.max_attempts = max_attempts
        self.max_steps = max_steps
        self.seed = seed
        self.tasks = list(tasks)
        self.n_samples = n_samples
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.last_version = last_version
        self.last_version_epoch = -1  # the lineage epoch whose learner published the last version (-1: none)
        self.learner_version = 0
        self.admitted = 0  # episodes admitted (first attempts; a retry replaces, it does not add)
        self.groups = 0
        self._order: list[SuiteTask] = []
        self._epoch = 0
        self.todo: collections.deque[_Todo] = collections.deque()
        if mode == "eval":
            self.todo.extend(_Todo(t, s, 0, f"{t.task_id}#g") for t in tasks for s in range(n_samples))
            self.admitted = len(self.todo)
            self.max_groups = len(tasks)
        else:
            self.max_groups = max_groups  # 0: until shut down
        self.total = len(self.todo) if mode == "eval" else max_groups * n_samples
        self.running: dict[str, _Running] = {}
        self.ended: dict[str, EpisodeEnded] = {}
        self.delivering: dict[str, _Running] = {}  # completed training episodes not yet at the learner
        self.handed_back: set[str] = set()  # episodes whose sample went out again (rejected, undelivered)
        self.after_last_update: set[str] = set()  # episodes not taken once the last update was made
        self.retired: list[str] = []  # groups handed out again whole after a learner restart
        self.learner_epoch = 0  # the newest lineage epoch heard of
        self.results: dict[tuple[str, int], TaskResult] = {}  # by (group id, sample index)
        self.env_errors: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
        self.workers: dict[str, Register] = {}
        self.progress = asyncio.Event()  # set at every end state; readers clear it
        self.all_done = asyncio.Event()
        self.started = time.monotonic()
        self.first_registered: float | None = None  # VM time is counted from here (models load before)
        self._seq = first_seq
        self.closing = False  # the run is ending: no more work, and workers leaving is expected
        self.state_path = Path(state_path) if state_path else None
        self.admitted_groups: dict[str, str] = {}  # group id -> task id, in admission order (train mode)
        self.reissued = 0
        self.rejections: collections.Counter[tuple[str, int]] = collections.Counter()
        self.eval_tasks = list(eval_tasks or [])
        self.eval_every = eval_every
        self.eval_log = Path(eval_log) if eval_log else None
        # (lineage epoch, version) -> task id -> result: a restarted learner makes version numbers again, and
        # its version 4 is not the weights its predecessor's version 4 were
        self.eval_rounds: dict[tuple[int, int], dict[str, TaskResult]] = {}
        self.eval_lines: list[dict[str, Any]] = []
        self.evals_printed = 0
        """How many of `eval_lines` the driver has printed (it prints each once, as it comes)."""
        self.no_more_groups = False  # the learner is done: finish the evaluations, admit nothing new

    # -- requests ------------------------------------------------------------------------------------

    async def main(self) -> None:
        beating = asyncio.create_task(self._beat()) if self.heartbeat_dir is not None else None
        try:
            await super().main()
        finally:
            if beating is not None:
                beating.cancel()

    async def _beat(self) -> None:
        from guirl.vmpool.cloud import write_heartbeat

        assert self.heartbeat_dir is not None
        while True:
            try:
                write_heartbeat(self.heartbeat_dir, self.heartbeat_dir.name, self.heartbeat_s)
            except OSError as exc:  # a full disk must not stop the run; the reaper may then take it for dead
                log.warning("could not write the run's heartbeat: %s", exc)
            await asyncio.sleep(self.heartbeat_s)  # the heartbeat's period

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case Register(name=name) as reg:
                self.workers[name] = reg
                if self.first_registered is None:
                    self.first_registered = time.monotonic()
                log.info("worker %s registered (capacity %d)", name, reg.capacity)
                return Ack(note=f"{len(self.workers)} workers")
            case WorkRequest(worker=worker):
                return self._assign(req.peer_name, worker)
            case EpisodeEnded() as ended:
                return self._end(ended)
            case EpisodeRejected() as rejected:
                return self._rejected(rejected)
            case EpisodeDelivered(episode_id=eid):
                self.counters["episodes.delivered"] += 1
                return Ack(ok=self.delivering.pop(eid, None) is not None or eid in self.ended)
            case LearnerResumed(version=version, trained_groups=trained, epoch=epoch):
                retired = self.reissue_lost(set(trained))
                self.learner_version = version  # a restarted learner may be behind what we were told
                self.learner_epoch = max(self.learner_epoch, epoch)  # the dead learner's word is void now
                return GroupsRetired(groups=retired)
            case WeightsPublished(version=version, epoch=epoch):
                if epoch < self.learner_epoch:  # a dead learner's, arriving after its successor's
                    self.counters["weights.stale_epoch"] += 1
                    return Ack(ok=False, note=f"epoch {epoch}: the learner is at epoch {self.learner_epoch}")
                self.learner_epoch = epoch  # a restarted learner's first word, if its LearnerResumed was lost
                if 0 < self.last_version <= version:
                    self.last_version_epoch = epoch
                if version > self.learner_version:
                    self.learner_version = version
                    self.counters["learner.version"] = version
                    self.save_state()
                    if self.mode == "train" and self.eval_every and version % self.eval_every == 0:
                        self._schedule_eval(version, epoch)
                return Ack(note=f"{self.admission_limit()} episodes may be admitted")
        return await super().handle(req)

    # -- the schedule --------------------------------------------------------------------------------

    def admission_limit(self) -> int:
        """Episodes that may have been admitted by now (AReaL's bound; eval mode: all of them)."""
        if self.mode == "eval":
            return self.total
        per_update = self.batch_size * self.n_samples
        return (max(self.learner_version, 0) + self.max_staleness + 1) * per_update

    def _next_task(self) -> SuiteTask:
        if not self._order:  # a new epoch: the same seed gives the same order
            self._order = list(self.tasks)
            random.Random(self.seed * 1_000_003 + self._epoch).shuffle(self._order)
            self._epoch += 1
        return self._order.pop(0)

    def _refill(self) -> str:
        """Admit whole groups while the bound allows; returns why nothing more can be admitted."""
        while not self.todo:
            if (
                self.mode == "eval"
                or self.no_more_groups
                or (self.max_groups and self.groups >= self.max_groups)
            ):
                return "done"
            if self.updates_made():
                return "updates made"
            if self.admitted + self.n_samples > self.admission_limit():
                self.counters["admission.blocked"] += 1
                return "staleness"
            task = self._next_task()
            group = f"{task.task_id}@{self.groups}"
            self.groups += 1
            self.todo.extend(_Todo(task, s, 0, group) for s in range(self.n_samples))
            self.admitted += self.n_samples
            self.admitted_groups[group] = task.task_id
            self.save_state()  # the cursor moved: a resumed run must know this group was handed out
        return ""

    # -- resuming -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to carry on the schedule: the cursor and the groups handed out."""
        return {
            "seq": self._seq,
            "groups": self.groups,
            "epoch": self._epoch,
            "order": [t.task_id for t in self._order],
            "learner_version": self.learner_version,
            "admitted_groups": self.admitted_groups,
        }

    def save_state(self) -> None:
        if self.state_path is None or self.mode != "train":
            return
        write_json_atomic(self.state_path, self.state(), indent=None)

    def restore(self, state: dict[str, Any], trained_groups: set[str], version: int) -> int:
        """Carry on from a saved state and the learner checkpoint it resumes at `version`: every group
        handed out but not trained by that checkpoint is handed out again (its episodes were in flight,
        or their trajectories died with the learner); returns how many groups that is."""
        by_id = {t.task_id: t for t in self.tasks}
        self._seq, self.groups, self._epoch = state["seq"], state["groups"], state["epoch"]
        self._order = [by_id[i] for i in state["order"] if i in by_id]
        self.learner_version = version
        self.admitted_groups = dict(state["admitted_groups"])
        again = [g for g in self.admitted_groups if g not in trained_groups]
        for group in again:
            task = by_id.get(self.admitted_groups[group])
            if task is None:  # the task list changed under a resumed run: say so, do not guess
                raise ValueError(
                    f"group {group}: task {self.admitted_groups[group]!r} is not in the task list"
                )
            self.todo.extend(_Todo(task, s, 0, group) for s in range(self.n_samples))
        # what the bound counts: the trained groups, plus the re-issued ones in the queue
        self.admitted = (len(self.admitted_groups)) * self.n_samples
        self.reissued = len(again)
        self.counters["groups.reissued"] = len(again)
        self.save_state()
        return len(again)

    def reissue_lost(self, trained: set[str]) -> list[str]:
        """A learner restarted from a checkpoint that trained `trained`: hand out again, whole and under a
        fresh id, every admitted group it did not train whose trajectories may have died with the old
        learner — one with a member that completed (and was not handed back), or one with nothing running
        or queued. The retired group's queued samples are dropped (the fresh group plays them); a member
        still running ends as it will, and the learner, which settles every retired id, never trains it.
        Returns every group retired in the run so far (asking again is harmless)."""
        busy = {r.todo.group_id for r in self.running.values()} | {t.group_id for t in self.todo}
        completed = {
            key[0]
            for key, r in self.results.items()
            if r.status == "completed" and r.episode_id not in self.handed_back
        }
        lost = [g for g in self.admitted_groups if g not in trained and (g in completed or g not in busy)]
        by_id = {t.task_id: t for t in self.tasks}
        if lost:
            gone = set(lost)
            self.todo = collections.deque(t for t in self.todo if t.group_id not in gone)
        for group in lost:
            task = by_id[self.admitted_groups[group]]
            self.reissued += 1
            # a fresh id: the new learner must not take its members for stragglers of a settled group
            fresh = f"{group}r{self.reissued}"
            self.todo.extend(_Todo(task, s, 0, fresh) for s in range(self.n_samples))
            self.admitted_groups[fresh] = task.task_id
            del self.admitted_groups[group]
            self.retired.append(group)
        self.counters["groups.reissued"] += len(lost)
        if lost:
            log.warning("the learner restarted: %d group(s) handed out again", len(lost))
            self.save_state()
        return list(self.retired)

    def _rejected(self, rej: EpisodeRejected) -> Ack:
        """An episode will not be trained (the learner refused it: played by weights outside its lineage;
        or its worker could not deliver it): the same sample of its group goes out again, first in line,
        unless the group is no longer the run's (handed out again whole after a learner restart, or the run
        is ending)."""
        if rej.episode_id in self.handed_back:  # a retried request, or handed back by worker and learner
            self.counters["episodes.rejected_again"] += 1
            return Ack(note=f"episode {rej.episode_id!r}: its sample was handed out again already")
        if rej.episode_id in self.after_last_update:
            self.counters["episodes.rejected_again"] += 1
            return Ack(ok=False, note=f"episode {rej.episode_id!r}: taken already, after the last update")
        end = self.ended.get(rej.episode_id)
        if end is None or end.status != "completed":
            self.counters["episodes.rejection_refused"] += 1
            return Ack(ok=False, note=f"episode {rej.episode_id!r} did not end completed: not handed out")
        self.delivering.pop(rej.episode_id, None)
        if self.mode == "train" and not self.closing and (self.no_more_groups or self.updates_made()):
            # the end of a run, not a fault: the learner shuts down after its last update. Not handed out
            # again (a learner restarted from an older checkpoint hands its whole group out again)
            self.after_last_update.add(rej.episode_id)
            self.counters["episodes.after_last_update"] += 1
            log.info(
                "episode %s of %s not trained (%s): the last update is made",
                rej.episode_id,
                rej.task_id,
                rej.reason,
            )
            return Ack(ok=False, note="the learner's last update is made: not handed out again")
        why = "undelivered" if rej.undelivered else "rejected_by_learner"
        self.counters[f"episodes.{why}"] += 1
        task = next((t for t in self.tasks if t.task_id == rej.task_id), None)
        # (a train run whose learner completed took the branch above)
        if self.mode != "train" or self.closing or task is None or not 0 <= rej.sample_index < self.n_samples:
            return Ack(ok=False, note="not handed out again: the run is ending, or no such task or sample")
        if self.admitted_groups.get(rej.group_id) != rej.task_id:
            return Ack(ok=False, note=f"group {rej.group_id!r} is not one in play: not handed out again")
        key = (rej.group_id, rej.sample_index)
        self.rejections[key] += 1
        if self.rejections[key] > self.max_attempts:  # engines that never get the learner's weights
            self.counters["episodes.rejected_not_reissued"] += 1
            log.error(
                "sample %d of %s rejected %d times: not handed out again",
                key[1],
                key[0],
                self.rejections[key],
            )
            return Ack(ok=False, note="rejected too often: not handed out again")
        self.handed_back.add(rej.episode_id)
        self.todo.appendleft(_Todo(task, rej.sample_index, 0, rej.group_id))
        self.counters[f"episodes.reissued_{'undelivered' if rej.undelivered else 'version_mismatch'}"] += 1
        log.warning(
            "episode %s of %s not trained by the learner (%s): sample %d of %s handed out again",
            rej.episode_id,
            rej.task_id,
            rej.reason,
            rej.sample_index,
            rej.group_id,
        )
        return Ack(note="handed out again")

    def _log_episode(self, kind: str, episode_id: str, **fields: Any) -> None:
        if self.ledger is None:
            return
        line = {"time": round(time.time(), 3), "kind": kind, "episode_id": episode_id, **fields}
        self._append(self.ledger, line)

    def _append(self, path: Path, line: dict[str, Any]) -> None:
        try:
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as exc:  # a full disk must not stop the run; it is counted and said once
            self.counters["ledger.unwritten"] += 1
            if self.counters["ledger.unwritten"] == 1:
                log.error("cannot write %s: %s", path, exc)

    def finish(self) -> None:
        """The run is over (train mode: the learner made its updates): hand out nothing more; episodes
        still running end `aborted` ("run ended") when their workers go."""
        self.closing = True
        self.todo.clear()

    def _assign(self, peer: str, worker: str) -> Message:
        if self.closing:
            return NoWork(retry_after_s=0.0, reason="done")
        why = self._refill() if not self.todo else ""
        if self.todo and self.updates_made() and not self._eval_first():
            why = "updates made"  # the training samples queued are held, not handed out
        if why == "updates made":
            # not "done": the learner can still die before its checkpoint and restart from an older one
            return NoWork(retry_after_s=2.0, reason="the last update is made: waiting for the learner")
        if not self.todo:
            if why == "staleness":
                return NoWork(retry_after_s=0.5, reason="staleness: waiting for the learner's next version")
            if self.running:
                return NoWork(retry_after_s=1.0, reason="waiting for running episodes")
            return NoWork(retry_after_s=0.0, reason="done")
        todo = self.todo.popleft()
        self._seq += 1
        episode_id = f"ep{self._seq:05d}"
        self.running[episode_id] = _Running(todo, peer, worker)
        self.counters["episodes.assigned"] += 1
        self._log_episode(
            "assigned",
            episode_id,
            task_id=todo.task.task_id,
            group_id=todo.group_id,
            sample_index=todo.sample_index,
            attempt=todo.attempt,
            worker=worker,
            eval=todo.eval_version >= 0,
        )
        return EpisodeAssignment(
            episode_id=episode_id,
            task_id=todo.task.task_id,
            task=todo.task.task,
            group_id=todo.group_id,
            sample_index=todo.sample_index,
            attempt=todo.attempt,
            max_steps=self.max_steps,
            seed=self.seed + self._seq,
            mode="eval" if todo.eval_version >= 0 else self.mode,  # type: ignore[arg-type]
            domain=todo.task.domain,
            temperature=0.0 if todo.eval_version >= 0 else None,
        )

    def _end(self, ended: EpisodeEnded) -> Ack:
        eid = ended.episode_id
        if eid in self.ended:
            first = self.ended[eid]
            if ended.worker and (first.worker, first.status) == (ended.worker, ended.status):
                self.counters["episodes.repeated_report"] += 1
                return Ack(note=f"episode {eid!r} already ended {first.status} (a repeated report)")
            self.counters["episodes.duplicate_end"] += 1
            # e.g. a worker declared dead (a hung process) whose episode was retried elsewhere: its late
            # end is refused, and the worker does not deliver the trajectory
            return Ack(ok=False, note=f"episode {eid!r} already ended {first.status}")
        run = self.running.pop(eid, None)
        if run is None:
            self.counters["episodes.unknown_end"] += 1
            return Ack(ok=False, note=f"episode {eid!r} was never assigned")
        self.ended[eid] = ended
        self._log_episode(
            "ended", eid, status=ended.status, env_error=ended.env_error, score=ended.score, steps=ended.steps
        )
        self.counters[f"episodes.{ended.status}"] += 1
        todo = run.todo
        key = (todo.group_id, todo.sample_index)
        if ended.env_error:
            self.env_errors[key].append(ended.env_error)
        if ended.status == "retried" and self.no_more_groups and todo.eval_version < 0:
            # the learner made its updates: a training episode cut short now is not played again
            self.counters["episodes.cut_by_end"] += 1
            self._final(key, todo, ended, "aborted", run)
        elif ended.status == "retried":
            if todo.attempt + 1 < self.max_attempts:
                self.todo.appendleft(
                    _Todo(
                        todo.task,
                        todo.sample_index,
                        todo.attempt + 1,
                        todo.group_id,
                        todo.eval_version,
                        todo.eval_epoch,
                    )
                )
                log.warning(
                    "episode %s of %s: environment error, retrying: %s",
                    eid,
                    todo.task.task_id,
                    ended.env_error,
                )
            else:
                log.error(
                    "task %s aborted after %d attempts: %s",
                    todo.task.task_id,
                    self.max_attempts,
                    ended.env_error,
                )
                self._final(key, todo, ended, "aborted", run)
        else:
            self._final(key, todo, ended, ended.status, run)
            if ended.status == "completed" and self.mode == "train" and todo.eval_version < 0:
                self.delivering[eid] = run  # until its worker says the learner has it
        self.progress.set()
        return Ack()

    # -- periodic evaluation (train mode) -----------------------------------------------------------

    def _schedule_eval(self, version: int, epoch: int = 0) -> None:
        """Queue one greedy episode of every eval task for the policy at `version`, ahead of new groups;
        evaluation episodes are not training samples and do not count against the staleness bound."""
        if not self.eval_tasks or (epoch, version) in self.eval_rounds:
            return
        self.eval_rounds[(epoch, version)] = {}
        name = f"{version}" if epoch == 0 else f"{version}e{epoch}"
        self.todo.extend(
            _Todo(t, 0, 0, f"eval@{name}/{t.task_id}", eval_version=version, eval_epoch=epoch)
            for t in self.eval_tasks
        )
        self.counters["eval.rounds"] += 1

    def updates_made(self) -> bool:
        """The learner (of the current lineage epoch) has published its last version: a training sample handed
        out or handed back now would never be trained. Not yet the end of training: until the learner has
        completed it can die and restart from an older checkpoint, a new epoch, and handing out resumes
        (whether the new epoch is first heard of from its `LearnerResumed` or, that lost, its weights)."""
        return (
            self.mode == "train"
            and not self.no_more_groups
            and self.last_version_epoch >= 0
            and self.last_version_epoch == self.learner_epoch
        )

    def _eval_first(self) -> bool:
        """Put the first evaluation sample queued at the head of `todo`; False if there is none."""
        ev = next((t for t in self.todo if t.eval_version >= 0), None)
        if ev is None:
            return False
        if self.todo[0] is not ev:
            self.todo.remove(ev)
            self.todo.appendleft(ev)
        return True

    def end_training(self) -> int:
        """The learner has completed (exited after its last update and checkpoint; not merely published its
        last version, after which it can still die and restart from an older checkpoint): admit no group,
        and drop the training samples not yet handed out (their groups will never be trained), so the
        evaluations still to come do not wait behind them. Returns how many were dropped (counted in
        `episodes.not_started_by_end`)."""
        if self.mode != "train":
            return 0
        self.no_more_groups = True
        kept = [t for t in self.todo if t.eval_version >= 0]
        dropped = len(self.todo) - len(kept)
        if dropped:
            self.todo = collections.deque(kept)
            self.counters["episodes.not_started_by_end"] += dropped
            log.info("the updates are made: %d training sample(s) not handed out", dropped)
        return dropped

    def evals_pending(self) -> bool:
        return any(len(r) < len(self.eval_tasks) for r in self.eval_rounds.values())

    def _eval_result(self, todo: _Todo, result: TaskResult) -> None:
        results = self.eval_rounds[(todo.eval_epoch, todo.eval_version)]
        results[todo.task.task_id] = result
        if len(results) < len(self.eval_tasks):
            return
        scored = [r for r in results.values() if r.status == "completed"]
        domains: dict[str, list[float]] = collections.defaultdict(list)
        for r in scored:
            domains[r.domain].append(r.score or 0.0)
        line = {
            "version": todo.eval_version,
            "epoch": todo.eval_epoch,
            "tasks": len(results),
            "scored": len(scored),
            "accuracy": round(sum(r.score or 0.0 for r in scored) / len(scored), 4) if scored else None,
            "domains": {d: round(sum(v) / len(v), 4) for d, v in sorted(domains.items())},
            "time": round(time.time(), 3),
        }
        self.eval_lines.append(line)
        self.progress.set()
        log.info("evaluation at version %d: accuracy %s", todo.eval_version, line["accuracy"])
        if self.eval_log is not None:
            with open(self.eval_log, "a") as f:
                f.write(json.dumps(line) + "\n")

    def _final(
        self, key: tuple[str, int], todo: _Todo, ended: EpisodeEnded, status: str, run: _Running
    ) -> None:
        result = TaskResult(
            task_id=todo.task.task_id,
            domain=todo.task.domain,
            status=status,
            score=ended.score if status == "completed" else None,
            outcome=ended.outcome,
            episode_id=ended.episode_id,
            attempts=todo.attempt + 1,
            steps=ended.steps,
            env_errors=list(self.env_errors.get(key, [])),
            seconds=ended.seconds,
        )
        if todo.eval_version >= 0:  # an evaluation episode: its own bookkeeping, not the run's total
            self._eval_result(todo, result)
            return
        self.results[key] = result
        if self.heartbeat_dir is not None and self.mode == "eval":
            self._append(self.heartbeat_dir / RESULT_LEDGER, dataclasses.asdict(result))
        if len(self.results) == self.total:
            self.all_done.set()

    def on_peer_left(self, name: str) -> None:
        self.on_peer_dead(name, ConnectionError("left"))

    def on_peer_dead(self, name: str, error: Exception) -> None:
        """A worker vanished (or left) with episodes running: they end `retried` (an environment fault);
        and the completed ones it had not yet delivered to the learner go out again."""
        self._undelivered(name)
        lost = [eid for eid, run in self.running.items() if run.peer == name]
        if self.closing:
            for eid in lost:
                self.counters["episodes.cut_by_end"] += 1
                self.ended[eid] = EpisodeEnded(episode_id=eid, status="aborted", reason="run ended")
                self._log_episode("ended", eid, status="aborted", env_error="", score=None)
                del self.running[eid]
            return
        for eid in lost:
            self.counters["episodes.worker_lost"] += 1
            self._end(
                EpisodeEnded(
                    episode_id=eid, status="retried", env_error=f"worker {name} died", outcome="env_error"
                )
            )

    def _undelivered(self, peer: str) -> None:
        """The worker `peer` died holding completed training episodes the learner may not have: each one's
        sample goes out again, unless its group is no longer the run's (if the learner had it after all, it
        keeps the first of the two)."""
        for eid in [e for e, run in self.delivering.items() if run.peer == peer]:
            run = self.delivering.pop(eid)
            todo = run.todo
            self.counters["episodes.lost_in_delivery"] += 1
            if self.closing or self.no_more_groups or self.updates_made():
                continue
            if self.admitted_groups.get(todo.group_id) != todo.task.task_id:
                continue  # handed out again whole (a learner restart) meanwhile
            self.handed_back.add(eid)
            self.todo.appendleft(_Todo(todo.task, todo.sample_index, 0, todo.group_id))
            self.counters["episodes.reissued_undelivered"] += 1
            log.warning(
                "worker %s died before it delivered episode %s: sample %d of %s handed out again",
                peer,
                eid,
                todo.sample_index,
                todo.group_id,
            )

    # -- reporting -----------------------------------------------------------------------------------

    def heard_ages(self) -> dict[str, float]:
        """Seconds since each actor that talks to the coordinator was last heard (its most recent process)."""
        from guirl.runtime.sockets import peer_label

        now = asyncio.get_running_loop().time()
        heard: dict[str, float] = {}
        if self.mailbox is not None:
            for ident, last in self.mailbox.peers.items():  # routing ids are `<actor>/<random>`
                name = peer_label(ident).split("/", 1)[0]
                heard[name] = min(now - last, heard.get(name, now - last))
        return heard

    def settle_unreported(self, episodes_dir: Path) -> int:
        """At the run's end, with every worker stopped: an episode folder still `unreported` (its worker was
        killed between this coordinator taking the end and writing the answer) takes the ledger's word; one
        the ledger never heard of stays `unreported`. Returns how many were settled."""
        settled = 0
        for path in episodes_dir.glob("*/*/result.json"):
            try:
                result = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            end = self.ended.get(result.get("episode_id", "")) if isinstance(result, dict) else None
            if end is None or result.get("status") != "unreported":
                continue
            result.update(status=end.status, settled="by the coordinator's ledger at the run's end")
            try:
                write_json_atomic(path, result)
            except OSError as exc:
                log.warning("could not settle %s: %s", path, exc)
                continue
            settled += 1
        if settled:
            self.counters["episodes.settled_at_end"] += settled
            log.info("%d episode folder(s) settled from the ledger at the run's end", settled)
        return settled

    def snapshot(self) -> dict[str, Any]:
        """Counts for a progress line: done/total, successes, environment errors, steps."""
        scored = [r for r in self.results.values() if r.status == "completed"]
        now = time.monotonic()
        return {
            "done": len(self.results),
            "total": self.total,
            "running": len(self.running),
            "scored": len(scored),
            "success": sum(1 for r in scored if (r.score or 0.0) >= 1.0),
            "score_sum": sum(r.score or 0.0 for r in scored),
            "aborted": sum(1 for r in self.results.values() if r.status == "aborted"),
            "env_errors": sum(1 for e in self.ended.values() if e.env_error),
            "steps": sum(e.steps for e in self.ended.values()),
            "elapsed_s": time.monotonic() - self.started,
            # VM time in episodes, running ones included, over the VM time there was since workers came
            "episode_s": sum(e.seconds for e in self.ended.values())
            + sum(now - r.assigned_at for r in self.running.values()),
            "vm_elapsed_s": now - self.first_registered if self.first_registered is not None else 0.0,
            "slots": sum(w.capacity for w in self.workers.values()),
        }
