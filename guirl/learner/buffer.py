"""The learner's trajectory buffer: GRPO groups held until complete, stale samples dropped, every
trajectory accounted for.

A group is `n_samples` attempts of one task (one `group_id`). The learner trains on complete groups; a
group that loses members (environment errors that exhausted their retries, a worker that died) waits at
most `group_timeout_s`, then trains on what it has (`partial="train"`, if it still has two members) or is
dropped (`partial="drop"`), and either way it is counted. A trajectory arriving twice (a retried delivery)
is acknowledged and ignored, and so is one for a group already settled (another attempt of a sample it
already has). A step sample more than `max_staleness` versions behind the learner when
its batch is taken is dropped and counted (the coordinator's admission bound keeps that rare).

Pure bookkeeping, no torch and no sockets: the learner actor feeds it and takes batches from it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from guirl.messages.types import Trajectory

Partial = Literal["train", "drop"]


@dataclass
class Group:
    """The trajectories of one GRPO group received so far."""

    group_id: str
    first_seen: float
    members: dict[int, Trajectory] = field(default_factory=dict)  # by sample index

    def complete(self, n_samples: int) -> bool:
        return len(self.members) >= n_samples


@dataclass
class TakenBatch:
    """Groups handed to one update, with the step samples that were too stale to use removed."""

    groups: list[Group]
    stale_steps: int = 0
    ahead_steps: int = 0
    """Steps of a version the learner had not reached (never trained: see `guirl.learner.lineage`)."""
    partial_groups: int = 0

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for _, t in sorted(g.members.items())]


class TrajectoryBuffer:
    """See the module docstring."""

    def __init__(
        self,
        *,
        n_samples: int,
        group_timeout_s: float = 600.0,
        partial: Partial = "train",
        max_staleness: int = 0,
        clock: object = time.monotonic,
    ) -> None:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        self.n_samples = n_samples
        self.group_timeout_s = group_timeout_s
        self.partial = partial
        self.max_staleness = max_staleness
        self.clock = clock
        self.pending: dict[str, Group] = {}
        self.ready: list[Group] = []  # complete (or timed out and kept), in order of readiness
        self.seen: set[str] = set()  # episode ids ever accepted (a redelivery is ignored)
        self.settled: set[str] = set()  # groups handed on or dropped: a late member is not a new group
        self.counts: Counter[str] = Counter()

    def add(self, traj: Trajectory) -> bool:
        """Accept one trajectory; False if it was already accepted (or is not one to train on)."""
        if traj.episode_id in self.seen:
            self.counts["trajectories.duplicate"] += 1
            return False
        if traj.status != "completed" or not traj.steps:
            self.counts["trajectories.unusable"] += 1
            return False
        if not 0 <= traj.sample_index < self.n_samples:
            self.counts["trajectories.bad_sample_index"] += 1
            return False
        if traj.group_id in self.settled:
            # e.g. a worker declared dead whose episode finished anyway, after its retry had filled the
            # group: its sample is a second attempt of one already trained on, so it is not trained on
            self.counts["trajectories.late"] += 1
            return False
        self.seen.add(traj.episode_id)
        self.counts["trajectories.accepted"] += 1
        group = self.pending.get(traj.group_id)
        if group is None:
            group = self.pending[traj.group_id] = Group(traj.group_id, self.clock())
        if traj.sample_index in group.members:  # another attempt of a sample already in (a late retry)
            self.counts["trajectories.superseded"] += 1
            return False
        group.members[traj.sample_index] = traj
        if group.complete(self.n_samples):
            self.ready.append(self.pending.pop(traj.group_id))
            self.settled.add(traj.group_id)
            self.counts["groups.complete"] += 1
        return True

    def expire(self, hold: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Settle the groups that waited longer than the timeout, except those in `hold` (a member is on its
        way: waiting for its PRM scores, which have their own timeout); returns their ids."""
        now = self.clock()
        expired = [
            g
            for g in self.pending.values()
            if now - g.first_seen >= self.group_timeout_s and g.group_id not in hold
        ]
        for g in expired:
            del self.pending[g.group_id]
            self.settled.add(g.group_id)
            if self.partial == "train" and len(g.members) >= 2:
                self.ready.append(g)
                self.counts["groups.partial_trained"] += 1
            else:
                self.counts["groups.partial_dropped"] += 1
                self.counts["trajectories.dropped_with_group"] += len(g.members)
        return [g.group_id for g in expired]

    def retire(self, group_ids: list[str]) -> None:
        """The coordinator handed these groups out again whole under fresh ids (a learner restart): never
        train a member of one, whether it is here already or still on its way."""
        for gid in group_ids:
            group = self.pending.pop(gid, None)
            if group is not None:
                self.counts["trajectories.dropped_with_group"] += len(group.members)
                self.counts["groups.retired_dropped"] += 1
            self.settled.add(gid)

    def take(self, n_groups: int, learner_version: int) -> TakenBatch | None:
        """The oldest `n_groups` ready groups, with step samples older than the staleness bound removed
        (a group left with no trajectory that has steps is dropped); None if fewer are ready."""
        if len(self.ready) < n_groups:
            return None
        groups, self.ready = self.ready[:n_groups], self.ready[n_groups:]
        batch = TakenBatch(groups=[])
        oldest = learner_version - self.max_staleness
        for g in groups:
            kept: dict[int, Trajectory] = {}
            for index, traj in g.members.items():
                # the bound holds both ways: a version the learner has not reached is no policy it had
                ahead = sum(1 for s in traj.steps if s.policy_version > learner_version)
                fresh = [s for s in traj.steps if oldest <= max(s.policy_version, 0) <= learner_version]
                batch.stale_steps += len(traj.steps) - len(fresh) - ahead
                batch.ahead_steps += ahead
                if fresh:
                    kept[index] = traj if len(fresh) == len(traj.steps) else _with_steps(traj, fresh)
            if not kept:
                self.counts["groups.all_stale"] += 1
                continue
            g.members = kept
            batch.partial_groups += int(len(kept) < self.n_samples)
            batch.groups.append(g)
        self.counts["steps.stale_dropped"] += batch.stale_steps
        self.counts["steps.ahead_dropped"] += batch.ahead_steps
        return batch

    def state(self) -> dict[str, int]:
        """Counts for metrics and for checking that nothing went missing."""
        return {
            "pending_groups": len(self.pending),
            "ready_groups": len(self.ready),
            "pending_trajectories": sum(len(g.members) for g in self.pending.values()),
            **self.counts,
        }


def _with_steps(traj: Trajectory, steps: list) -> Trajectory:
    import msgspec

    return msgspec.structs.replace(traj, steps=steps)
