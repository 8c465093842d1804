"""The learner's trajectory buffer: groups held until complete, timeouts, duplicates, staleness."""

from __future__ import annotations

import pytest

from guirl.learner.buffer import TrajectoryBuffer
from guirl.messages.types import StepSample, Tensor, Trajectory


def _step(i: int, version: int) -> StepSample:
    return StepSample(
        step=i,
        prompt_ids=Tensor.from_list([1, 2, 3]),
        response_ids=Tensor.from_list([4]),
        logprobs=Tensor.from_list([-0.5], "float32"),
        policy_version=version,
    )


def _traj(ep: str, group: str, index: int, *, versions=(0,), status="completed", reward=1.0) -> Trajectory:
    return Trajectory(
        episode_id=ep,
        task_id="t",
        group_id=group,
        sample_index=index,
        status=status,
        reward=reward,
        steps=[_step(i, v) for i, v in enumerate(versions)],
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_groups_wait_until_complete_and_duplicates_are_ignored():
    buf = TrajectoryBuffer(n_samples=2)
    assert buf.add(_traj("e1", "g", 0))
    assert buf.take(1, 0) is None  # half a group is not trainable yet
    assert not buf.add(_traj("e1", "g", 0))  # a redelivery
    assert buf.add(_traj("e2", "g", 1))
    batch = buf.take(1, 0)
    assert [t.episode_id for t in batch.trajectories] == ["e1", "e2"] and batch.partial_groups == 0
    s = buf.state()
    assert s["trajectories.accepted"] == 2 and s["trajectories.duplicate"] == 1 and s["groups.complete"] == 1
    assert s["pending_groups"] == 0 and s["ready_groups"] == 0


def test_unusable_and_out_of_range_trajectories_are_counted_not_kept():
    buf = TrajectoryBuffer(n_samples=2)
    assert not buf.add(_traj("e1", "g", 0, status="aborted"))
    assert not buf.add(_traj("e2", "g", 5))
    assert not buf.add(_traj("e3", "g", 0, versions=()))
    s = buf.state()
    assert s["trajectories.unusable"] == 2 and s["trajectories.bad_sample_index"] == 1
    assert s["pending_groups"] == 0


@pytest.mark.parametrize("partial, trained", [("train", True), ("drop", False)])
def test_a_group_that_loses_members_times_out(partial, trained):
    clock = Clock()
    buf = TrajectoryBuffer(n_samples=3, group_timeout_s=10, partial=partial, clock=clock)
    buf.add(_traj("e1", "g", 0))
    buf.add(_traj("e2", "g", 2))
    buf.add(_traj("e3", "lonely", 0))
    clock.now = 9.9
    assert buf.expire() == []
    clock.now = 10.0
    assert sorted(buf.expire()) == ["g", "lonely"]
    batch = buf.take(1, 0)
    s = buf.state()
    if trained:  # two members still give an advantage; one alone does not
        assert [t.episode_id for t in batch.trajectories] == ["e1", "e2"] and batch.partial_groups == 1
        assert s["groups.partial_trained"] == 1 and s["groups.partial_dropped"] == 1
    else:
        assert batch is None and s["groups.partial_dropped"] == 2
        assert s["trajectories.dropped_with_group"] == 3
    # a late member of a settled group is refused and counted: never a new group of the same id
    assert not buf.add(_traj("e4", "g", 1))
    assert buf.state()["pending_groups"] == 0 and buf.state()["trajectories.late"] == 1


def test_stale_steps_are_dropped_and_counted():
    buf = TrajectoryBuffer(n_samples=2, max_staleness=1)
    buf.add(_traj("e1", "g", 0, versions=(-1, 2, 3)))  # -1: the starting checkpoint, version 0
    buf.add(_traj("e2", "g", 1, versions=(0, 0)))
    batch = buf.take(1, learner_version=3)  # oldest usable version: 2
    (g,) = batch.groups
    assert [s.policy_version for s in g.members[0].steps] == [2, 3]
    assert 1 not in g.members and batch.stale_steps == 3 and batch.partial_groups == 1
    assert buf.state()["steps.stale_dropped"] == 3


def test_a_group_entirely_stale_is_dropped():
    buf = TrajectoryBuffer(n_samples=1, max_staleness=0)
    buf.add(_traj("e1", "g", 0, versions=(1,)))
    batch = buf.take(1, learner_version=2)
    assert batch.groups == [] and buf.state()["groups.all_stale"] == 1


def test_a_retried_sample_that_arrives_after_its_group_filled_is_not_trained_twice():
    """A worker declared dead finishes its episodes anyway and delivers them; their retries deliver too.
    The group trains once, on the first arrivals, and never becomes a group of four."""
    buf = TrajectoryBuffer(n_samples=2)
    assert buf.add(_traj("ep1", "g@0", 0)) and buf.add(_traj("ep2", "g@0", 1))
    assert not buf.add(_traj("ep3", "g@0", 0)) and not buf.add(_traj("ep4", "g@0", 1))
    batch = buf.take(1, 0)
    assert [t.episode_id for t in batch.trajectories] == ["ep1", "ep2"] and buf.take(1, 0) is None


def test_a_group_with_a_member_held_for_its_scores_is_not_timed_out():
    clock = [0.0]
    buf = TrajectoryBuffer(n_samples=2, group_timeout_s=10, clock=lambda: clock[0])
    buf.add(_traj("e0", "g", 0))
    clock[0] = 11
    assert buf.expire(hold={"g"}) == [] and "g" in buf.pending
    assert buf.expire() == ["g"]


def test_a_retired_group_is_never_trained():
    """Groups the coordinator handed out again whole after a learner restart: a member already here is
    dropped with its group, one arriving later is late; the fresh group trains."""
    buf = TrajectoryBuffer(n_samples=2, group_timeout_s=0.0)
    assert buf.add(_traj("e1", "g", 0))
    buf.retire(["g"])
    assert not buf.add(_traj("e2", "g", 1))
    assert buf.add(_traj("e3", "gr1", 0)) and buf.add(_traj("e4", "gr1", 1))
    batch = buf.take(1, 0)
    assert batch is not None and [g.group_id for g in batch.groups] == ["gr1"] and buf.expire() == []
    assert buf.counts["groups.retired_dropped"] == 1 and buf.counts["trajectories.late"] == 1
