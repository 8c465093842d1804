"""The learner's score board: trajectories wait for their PRM scores up to a timeout; nothing invented."""

from __future__ import annotations

import pytest

from guirl.messages.types import StepSample, StepScore, Tensor, Trajectory
from guirl.prm.scores import ScoreBoard


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def traj(episode: str, steps: int, *, dropped: tuple[int, ...] = (), reward: float = 1.0) -> Trajectory:
    samples = [
        StepSample(
            step=i,
            prompt_ids=Tensor.from_list([1, 2]),
            response_ids=Tensor.from_list([3]),
            logprobs=Tensor.from_list([-0.5], "float32"),
            prm_score=7.0,  # what a sender claims is ignored: the board sets it
            prm_status="scored",
        )
        for i in range(steps)
    ]
    return Trajectory(
        episode_id=episode,
        task_id="t",
        group_id="t@0",
        sample_index=0,
        status="completed",
        reward=reward,
        steps=samples,
        prm_dropped=list(dropped),
    )


def score(episode: str, step: int, value: float | None, **kw) -> StepScore:
    return StepScore(
        episode_id=episode, step=step, score=value, votes=2, invalid=0 if value is not None else 2, **kw
    )


def statuses(t: Trajectory) -> list[tuple[float | None, str]]:
    return [(s.prm_score, s.prm_status) for s in t.steps]


def test_scores_before_the_trajectory_release_it_at_once() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    assert board.add_score(score("e", 0, 1.0)) is None
    assert board.add_score(score("e", 1, -0.5)) is None
    out = board.add_trajectory(traj("e", 2))
    assert out is not None and statuses(out) == [(1.0, "scored"), (-0.5, "scored")]
    assert not board.is_waiting("e") and "e" not in board.scores


def test_trajectory_waits_for_its_last_score() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    board.add_score(score("e", 0, 1.0))
    assert board.add_trajectory(traj("e", 2)) is None and board.is_waiting("e")
    out = board.add_score(score("e", 1, -1.0))
    assert out is not None and statuses(out) == [(1.0, "scored"), (-1.0, "scored")]


def test_timeout_marks_missing_scores_never_invents_them() -> None:
    clock = Clock()
    board = ScoreBoard(timeout_s=10, clock=clock)
    board.add_score(score("e", 1, 1.0))
    assert board.add_trajectory(traj("e", 3)) is None
    clock.now += 9.9
    assert board.expire() == []
    clock.now += 0.2
    [out] = board.expire()
    assert statuses(out) == [(None, "missing"), (1.0, "scored"), (None, "missing")]
    assert board.counts["trajectories.timed_out"] == 1
    # a score arriving after the release is late: counted, never attached to anything
    assert board.add_score(score("e", 0, 1.0)) is None
    assert board.counts["scores.late"] == 1 and "e" not in board.scores


def test_invalid_and_error_scores_are_kept_apart() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    board.add_score(score("e", 0, None))
    board.add_score(score("e", 1, None, error="judge request failed: peer dead"))
    out = board.add_trajectory(traj("e", 2))
    assert statuses(out) == [(None, "invalid"), (None, "error")]


def test_steps_never_sent_to_the_judge_are_not_waited_for() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    board.add_score(score("e", 0, 1.0))
    out = board.add_trajectory(traj("e", 2, dropped=(1,)))
    assert out is not None and statuses(out) == [(1.0, "scored"), (None, "dropped")]


def test_duplicates_are_counted_and_ignored() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    board.add_score(score("e", 0, 1.0))
    board.add_score(score("e", 0, -1.0))  # a redelivered (or forged) second score: the first stands
    assert board.counts["scores.duplicate"] == 1
    assert board.add_trajectory(traj("e", 2)) is None
    assert board.add_trajectory(traj("e", 2)) is None  # redelivered while waiting
    assert board.counts["trajectories.duplicate"] == 1
    out = board.add_score(score("e", 1, 1.0))
    assert statuses(out)[0] == (1.0, "scored")
    assert board.add_trajectory(traj("e", 2)) is None  # redelivered after release
    assert board.counts["trajectories.duplicate"] == 2


def test_orphan_scores_are_forgotten() -> None:
    clock = Clock()
    board = ScoreBoard(timeout_s=10, orphan_ttl_s=60, clock=clock)
    board.add_score(score("gone", 0, 1.0))  # its episode ended in an environment error: no trajectory
    clock.now += 30
    board.add_score(score("later", 0, 1.0))
    clock.now += 31
    board.expire()
    assert "gone" not in board.scores and "later" in board.scores
    assert board.counts["scores.orphaned"] == 1


def test_judge_stats_since_last_take() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    board.add_score(score("e", 0, 1.0, latency_s=2.0, queue_depth=5, queue_s=1.0))
    board.add_score(score("e", 1, None, latency_s=4.0, queue_depth=1, queue_s=3.0))
    board.add_trajectory(traj("e", 2))
    m = board.take_stats().metrics()
    assert m["prm.invalid_vote_rate"] == pytest.approx(2 / 4)
    assert m["prm.judge_latency_mean_s"] == pytest.approx(3.0)
    assert m["prm.judge_latency_max_s"] == pytest.approx(4.0)
    assert m["prm.queue_depth_max"] == 5 and m["prm.queue_s_mean"] == pytest.approx(2.0)
    assert board.take_stats().metrics()["prm.judge_latency_max_s"] == 0.0


def test_a_long_episode_keeps_its_early_scores() -> None:
    """Forgetting orphans counts from an episode's last score: one still being played keeps its first."""
    clock = Clock()
    board = ScoreBoard(timeout_s=10, orphan_ttl_s=60, clock=clock)
    for step in range(10):  # a step every 40 s: 400 s in all, far past the orphan limit
        board.add_score(score("long", step, 1.0))
        clock.now += 40
        board.expire()
    out = board.add_trajectory(traj("long", 10))
    assert out is not None and all(status == "scored" for _, status in statuses(out))


def test_a_timed_out_trajectory_keeps_the_scores_it_has() -> None:
    clock = Clock()
    board = ScoreBoard(timeout_s=10, orphan_ttl_s=5, clock=clock)
    board.add_score(score("e", 0, 1.0))
    board.add_trajectory(traj("e", 2))
    clock.now += 20  # past both the wait and the orphan limit: released first, with what it has
    [out] = board.expire()
    assert statuses(out) == [(1.0, "scored"), (None, "missing")]
    assert board.waiting_groups() == set()


def test_groups_with_a_waiting_member_are_reported() -> None:
    board = ScoreBoard(timeout_s=10, clock=Clock())
    board.add_trajectory(traj("e", 1))
    assert board.waiting_groups() == {"t@0"}


@pytest.mark.parametrize(
    "bad",
    [
        {"score": float("nan")},
        {"score": float("inf")},
        {"score": 1.5},
        {"score": -7.0},
        {"step": -1},
        {"step": 10**9},
        {"votes": 1, "invalid": 2},
        {"latency_s": float("nan")},
        {"queue_depth": -1},
    ],
)
def test_nonsense_scores_are_refused(bad) -> None:
    from guirl.prm.scores import valid_score

    fields = {"episode_id": "e", "step": 0, "score": 1.0, "votes": 2, "invalid": 0, **bad}
    assert valid_score(StepScore(**fields))
    assert valid_score(StepScore(episode_id="e", step=3, score=-0.5, votes=2, invalid=1)) == ""
