"""The learner's side of PRM scores: trajectories wait for their steps' scores, up to a timeout.

Scores stream from the PRM while the episode is still being played, so most arrive before their
trajectory; the rest arrive after it. A trajectory is released to the training buffer as soon as every
step has a score (or was never sent to the judge), or `timeout_s` after it arrived, with the steps still
unscored marked `missing` — never invented. Scores of episodes whose trajectory never comes (an
environment error ended it; its retry has a new episode id) are forgotten after `orphan_ttl_s`.

Pure bookkeeping, no sockets: the learner actor feeds it and polls it.
"""

from __future__ import annotations

import collections
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from guirl.messages.types import StepScore, Trajectory

RELEASED_MAX = 100_000
"""Released episodes remembered, to tell a late score from an early one."""
MAX_STEP = 4096
"""Step indices beyond this are refused (no episode is that long; a hostile peer must not grow memory)."""


def valid_score(s: StepScore) -> str:
    """Why a score cannot be taken (a peer sent nonsense), or "" when it can: a score is None or a finite
    mean of votes in [-1, 1]; counts and timings are finite and non-negative."""
    if s.score is not None and not (math.isfinite(s.score) and -1.0 <= s.score <= 1.0):
        return f"score {s.score!r} is not a finite number in [-1, 1]"
    if not 0 <= s.step <= MAX_STEP:
        return f"step {s.step} is outside 0..{MAX_STEP}"
    if s.votes < 0 or not 0 <= s.invalid <= max(s.votes, 0):
        return f"vote counts {s.votes} / {s.invalid} invalid do not add up"
    if not all(math.isfinite(x) and x >= 0 for x in (s.latency_s, s.queue_s)) or s.queue_depth < 0:
        return "latency, queue time and queue depth must be finite and non-negative"
    return ""


@dataclass
class _Waiting:
    traj: Trajectory
    deadline: float


@dataclass
class JudgeStats:
    """What the judge did for the trajectories released since the last `take_stats`."""

    steps: Counter[str] = field(default_factory=Counter)  # by prm_status
    votes: int = 0
    invalid_votes: int = 0
    latency_sum: float = 0.0
    latency_max: float = 0.0
    queue_depth_max: int = 0
    queue_s_sum: float = 0.0
    judged: int = 0

    def add(self, s: StepScore) -> None:
        self.judged += 1
        self.votes += s.votes
        self.invalid_votes += s.invalid
        self.latency_sum += s.latency_s
        self.latency_max = max(self.latency_max, s.latency_s)
        self.queue_depth_max = max(self.queue_depth_max, s.queue_depth)
        self.queue_s_sum += s.queue_s

    def metrics(self) -> dict[str, float | int]:
        """`prm.*` metrics of the judge's work: invalid-vote rate, latency, queue wait and depth."""
        n = max(1, self.judged)
        out: dict[str, float | int] = {
            "prm.invalid_vote_rate": round(self.invalid_votes / self.votes, 4) if self.votes else 0.0,
            "prm.judge_latency_mean_s": round(self.latency_sum / n, 4),
            "prm.judge_latency_max_s": round(self.latency_max, 4),
            "prm.queue_s_mean": round(self.queue_s_sum / n, 4),
            "prm.queue_depth_max": self.queue_depth_max,
        }
        return out


class ScoreBoard:
    """See the module docstring."""

    def __init__(
        self,
        *,
        timeout_s: float,
        orphan_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.orphan_ttl_s = orphan_ttl_s if orphan_ttl_s is not None else max(600.0, 4 * timeout_s)
        self.clock = clock
        self.scores: collections.OrderedDict[str, tuple[float, dict[int, StepScore]]] = (
            collections.OrderedDict()
        )  # by episode, in order of the first score's arrival
        self.waiting: dict[str, _Waiting] = {}
        self.released: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.counts: Counter[str] = Counter()
        self.stats = JudgeStats()

    def add_score(self, s: StepScore) -> Trajectory | None:
        """Take one score; returns the trajectory it completes, if any."""
        if s.episode_id in self.released:
            self.counts["scores.late"] += 1  # its step was already marked missing (or it is a repeat)
            return None
        _, steps = self.scores.pop(s.episode_id, (0.0, {}))
        # kept in order of last activity: an episode still being played is never forgotten as an orphan
        self.scores[s.episode_id] = (self.clock(), steps)
        if s.step in steps:
            self.counts["scores.duplicate"] += 1
            return None
        steps[s.step] = s
        self.counts["scores.received"] += 1
        waiting = self.waiting.get(s.episode_id)
        if waiting is not None and self._complete(waiting.traj):
            del self.waiting[s.episode_id]
            return self._release(waiting.traj)
        return None

    def add_trajectory(self, traj: Trajectory) -> Trajectory | None:
        """Take a trajectory: returned with its scores when all are in, else held (None)."""
        if traj.episode_id in self.waiting or traj.episode_id in self.released:
            self.counts["trajectories.duplicate"] += 1
            return None
        if self._complete(traj):
            return self._release(traj)
        self.waiting[traj.episode_id] = _Waiting(traj, self.clock() + self.timeout_s)
        self.counts["trajectories.waited"] += 1
        return None

    def is_waiting(self, episode_id: str) -> bool:
        return episode_id in self.waiting

    def expire(self) -> list[Trajectory]:
        """Release the trajectories whose wait is over (their unscored steps marked missing), and forget
        the scores of episodes that never came."""
        now = self.clock()
        late = [w for w in self.waiting.values() if now >= w.deadline]
        for w in late:
            del self.waiting[w.traj.episode_id]
            self.counts["trajectories.timed_out"] += 1
        released = [self._release(w.traj) for w in late]  # before the sweep: their scores are theirs
        for episode, (last, _) in list(self.scores.items()):
            if now - last < self.orphan_ttl_s:
                break  # ordered by last activity: the rest are younger
            if episode not in self.waiting:
                del self.scores[episode]
                self.counts["scores.orphaned"] += 1
        return released

    def waiting_groups(self) -> set[str]:
        """Groups with a member held here: the buffer must not time such a group out meanwhile."""
        return {w.traj.group_id for w in self.waiting.values()}

    def take_stats(self) -> JudgeStats:
        """The judge's statistics since the last call."""
        stats, self.stats = self.stats, JudgeStats()
        return stats

    # -- internals -----------------------------------------------------------------------------------

    def _complete(self, traj: Trajectory) -> bool:
        _, steps = self.scores.get(traj.episode_id, (0.0, {}))
        dropped = set(traj.prm_dropped)
        return all(s.step in steps or s.step in dropped for s in traj.steps)

    def _release(self, traj: Trajectory) -> Trajectory:
        _, steps = self.scores.pop(traj.episode_id, (0.0, {}))
        dropped = set(traj.prm_dropped)
        samples = []
        for sample in traj.steps:
            score = steps.get(sample.step)
            if sample.step in dropped:
                status = "dropped"
            elif score is None:
                status = "missing"
            elif score.score is None:
                status = "error" if score.error else "invalid"
            else:
                status = "scored"
            if score is not None:
                self.stats.add(score)
            self.stats.steps[status] += 1
            value = score.score if status == "scored" and score is not None else None
            samples.append(msgspec.structs.replace(sample, prm_score=value, prm_status=status))
        self.released[traj.episode_id] = None
        if len(self.released) > RELEASED_MAX:
            self.released.popitem(last=False)
        return msgspec.structs.replace(traj, steps=samples)
