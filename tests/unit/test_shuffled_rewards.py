"""The control run's rewards (`train.shuffle_rewards`): the batch's rewards and reward parts permuted among
its trajectories, the same permutation for the same seed, everything else (steps, scores) left as played."""

from __future__ import annotations

import random

from guirl.learner.batch import shuffled_rewards
from guirl.messages.types import StepSample, Tensor, Trajectory


def _traj(i: int) -> Trajectory:
    step = StepSample(
        step=0,
        prompt_ids=Tensor.from_list([1, 2]),
        response_ids=Tensor.from_list([3 + i]),
        logprobs=Tensor.from_list([-0.5], "float32"),
    )
    return Trajectory(
        episode_id=f"ep{i}",
        task_id="t",
        group_id=f"t@{i // 4}",
        sample_index=i % 4,
        status="completed",
        reward=float(i),
        reward_parts={"point": float(i)},
        score=1.0 if i % 3 == 0 else 0.0,
        steps=[step],
    )


def test_rewards_are_permuted_with_their_parts_and_nothing_else_moves():
    trajs = [_traj(i) for i in range(16)]
    out = shuffled_rewards(trajs, random.Random("7:3"))
    assert sorted(t.reward for t in out) == [t.reward for t in trajs]
    assert [t.reward for t in out] != [t.reward for t in trajs]  # 16 rewards: never the identity here
    assert all(t.reward_parts == {"point": t.reward} for t in out)  # a reward travels with its parts
    for before, after in zip(trajs, out, strict=True):
        assert (after.episode_id, after.group_id, after.score) == (
            before.episode_id,
            before.group_id,
            before.score,
        )
        assert after.steps == before.steps
    assert [(t.reward, t.reward_parts) for t in trajs] == [(float(i), {"point": float(i)}) for i in range(16)]


def test_the_same_seed_permutes_the_same_way():
    trajs = [_traj(i) for i in range(16)]
    first = [t.reward for t in shuffled_rewards(trajs, random.Random("7:3"))]
    assert first == [t.reward for t in shuffled_rewards(trajs, random.Random("7:3"))]
    assert first != [t.reward for t in shuffled_rewards(trajs, random.Random("7:4"))]
