"""GRPO, outcome and step-wise advantages against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from guirl.learner.advantages import (
    broadcast_to_tokens,
    filter_degenerate,
    grpo_advantages,
    outcome_reward,
    step_wise_advantages,
    trajectory_advantages,
)

EPS = 1e-6

# Three groups, interleaved as a batch arrives:
#   a: rewards  1, -1, -1   mean -1/3; deviations 4/3, -2/3, -2/3
#      sum of squares 16/9 + 4/9 + 4/9 = 8/3; unbiased var (8/3)/2 = 4/3; std 2/sqrt(3) = 1.1547005
#      advantages (4/3)/1.1547005 = 1.1547005, (-2/3)/1.1547005 = -0.5773503 (twice)
#   b: rewards  1, 1        all equal -> degenerate, advantage exactly 0
#   c: reward  -1           a group of one -> no baseline, advantage 0, counted degenerate
IDS = ["a", "b", "a", "c", "b", "a"]
REWARDS = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
STD_A = 2 / math.sqrt(3)


def test_grpo_two_groups_by_hand() -> None:
    out = grpo_advantages(REWARDS, IDS)
    expected = [
        (4 / 3) / (STD_A + EPS),  # 1.1547005
        0.0,
        (-2 / 3) / (STD_A + EPS),  # -0.5773503
        0.0,
        0.0,
        (-2 / 3) / (STD_A + EPS),
    ]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.advantages.tolist() == pytest.approx([1.1547005, 0, -0.5773503, 0, 0, -0.5773503], abs=1e-6)
    assert out.groups == 3
    assert out.degenerate_groups == 2  # b (all equal) and c (size 1)
    assert out.informative.tolist() == [True, False, True, False, False, True]
    assert out.advantages.dtype == torch.float32


def test_grpo_degenerate_advantage_is_exactly_zero() -> None:
    # In float64, (0.1 + 0.1 + 0.1) / 3 - 0.1 = 1.4e-17, not 0; the advantage must still be exactly 0,
    # not 1.4e-17 / (std + eps) ~ 1e-11.
    out = grpo_advantages(torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64), ["g", "g", "g"])
    assert out.advantages.tolist() == [0.0, 0.0, 0.0]
    assert out.advantages.dtype == torch.float64
    assert out.degenerate_groups == 1


def test_grpo_without_std_normalisation_is_mean_centred() -> None:
    out = grpo_advantages(REWARDS, IDS, std_normalize=False)
    assert out.advantages.tolist() == pytest.approx([4 / 3, 0, -2 / 3, 0, 0, -2 / 3], abs=1e-6)


def test_grpo_uses_unbiased_std_and_eps() -> None:
    # Group of two: 1, -1 -> mean 0, unbiased std sqrt(2/1) = 1.4142136 (population std would be 1).
    out = grpo_advantages(torch.tensor([1.0, -1.0]), ["g", "g"], eps=0.5)
    assert out.advantages.tolist() == pytest.approx([1 / (math.sqrt(2) + 0.5), -1 / (math.sqrt(2) + 0.5)])


def test_grpo_accepts_tensor_group_ids() -> None:
    ids = torch.tensor([7, 3, 7, 9, 3, 7])  # same grouping as IDS
    out = grpo_advantages(REWARDS, ids)
    assert torch.equal(out.advantages, grpo_advantages(REWARDS, IDS).advantages)
    assert (out.groups, out.degenerate_groups) == (3, 2)


def test_filter_degenerate_mask() -> None:
    assert filter_degenerate(REWARDS, IDS).tolist() == [True, False, True, False, False, True]


def test_grpo_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        grpo_advantages(REWARDS, IDS[:-1])
    with pytest.raises(ValueError):
        grpo_advantages(torch.tensor([1.0, float("nan")]), ["g", "g"])
    with pytest.raises(ValueError):
        grpo_advantages(REWARDS.reshape(2, 3), IDS)


def test_grpo_empty_batch() -> None:
    out = grpo_advantages(torch.zeros(0), [])
    assert out.advantages.shape == (0,)
    assert (out.groups, out.degenerate_groups) == (0, 0)


# --- outcome_reward ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "threshold", "reward"),
    [(1.0, 1.0, 1.0), (0.0, 1.0, -1.0), (0.99, 1.0, -1.0), (0.5, 0.5, 1.0), (0.49, 0.5, -1.0)],
)
def test_outcome_reward_maps_score_to_plus_minus_one(score: float, threshold: float, reward: float) -> None:
    assert outcome_reward(score, success_threshold=threshold) == reward


@pytest.mark.parametrize("score", [None, float("nan")])
def test_outcome_reward_refuses_an_unscored_episode(score: float | None) -> None:
    with pytest.raises(ValueError, match="unscored"):
        outcome_reward(score)


# --- step_wise_advantages ---------------------------------------------------------------------------

# One task group g, three episodes; prm_coef 0.5; score = outcome + 0.5 * prm.
#   step 0:  A: outcome +1, prm +1 -> 1.5
#            B: outcome -1, prm +1 -> -0.5
#            C: outcome -1, prm -1 -> -1.5
#     mean -1/6; deviations 5/3, -1/3, -4/3; sum sq 25/9 + 1/9 + 16/9 = 14/3;
#     unbiased var 7/3; std 1.5275252; advantages 1.0910895, -0.2182179, -0.8728716
#   step 1:  only A is still running (prm -1) -> a bucket of one keeps its score: 1 + 0.5 * -1 = 0.5
# With the defect of OpenClaw-RL's GUI-RL (coefficient ignored, i.e. 1.0): scores 2, 0, -2 ->
# advantages 1, 0, -1.
STEP_PRM = [1.0, 1.0, -1.0, -1.0]
STEP_OUTCOME = [1.0, -1.0, -1.0, 1.0]
STEP_GROUP = ["g", "g", "g", "g"]
STEP_INDEX = [0, 0, 0, 1]


def test_step_wise_applies_the_prm_coefficient() -> None:
    out = step_wise_advantages(STEP_PRM, STEP_OUTCOME, STEP_GROUP, STEP_INDEX, prm_coef=0.5)
    std = math.sqrt(7 / 3)
    expected = [(5 / 3) / (std + EPS), (-1 / 3) / (std + EPS), (-4 / 3) / (std + EPS), 0.5]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.advantages.tolist() == pytest.approx([1.0910895, -0.2182179, -0.8728716, 0.5], abs=1e-6)
    # GUI-RL's advantages, which ignored the coefficient, would be (1, 0, -1) here.
    assert out.advantages[1].item() != pytest.approx(0.0, abs=1e-3)
    # two buckets, neither degenerate (a bucket of one is a signal, not a tie)
    assert (out.groups, out.degenerate_groups) == (2, 0)
    assert out.informative.tolist() == [True, True, True, True]


def test_step_wise_coefficient_one_and_zero() -> None:
    one = step_wise_advantages(STEP_PRM, STEP_OUTCOME, STEP_GROUP, STEP_INDEX, prm_coef=1.0)
    # scores 2, 0, -2: mean 0, unbiased std sqrt(8/2) = 2
    assert one.advantages.tolist() == pytest.approx([2 / (2 + EPS), 0.0, -2 / (2 + EPS), 0.0], abs=1e-6)
    # (the lone step-1 score is 1 + 1.0 * -1 = 0 here, kept as it is)
    zero = step_wise_advantages(STEP_PRM, STEP_OUTCOME, STEP_GROUP, STEP_INDEX, prm_coef=0.0)
    # outcome only: 1, -1, -1 -> group a of the GRPO example
    assert zero.advantages.tolist() == pytest.approx([1.1547005, -0.5773503, -0.5773503, 1.0], abs=1e-6)


def test_step_wise_buckets_by_group_and_step() -> None:
    # Same step index in two groups: each group normalises on its own.
    out = step_wise_advantages(
        [0.0, 0.0, 0.0, 0.0], [1.0, -1.0, 1.0, 1.0], ["g", "g", "h", "h"], [0, 0, 0, 0], prm_coef=0.5
    )
    s = 1 / (math.sqrt(2) + EPS)
    assert out.advantages.tolist() == pytest.approx([s, -s, 0.0, 0.0], abs=1e-6)
    assert (out.groups, out.degenerate_groups) == (2, 1)


def test_step_wise_constant_bucket_is_zero_and_counted() -> None:
    # bucket (g, 0): two equal scores 1 + 1 = 2 -> exactly 0, degenerate; bucket (g, 1): one score -> kept
    out = step_wise_advantages([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], ["g", "g", "g"], [0, 0, 1])
    assert out.advantages.tolist() == [0.0, 0.0, 2.0]
    assert out.informative.tolist() == [False, False, True]
    assert (out.groups, out.degenerate_groups) == (2, 1)


# --- trajectory_advantages ---------------------------------------------------------------------------

# Group g: episode A (reward +1, steps 0 and 1, PRM +1 then -1), episode B (reward -1, one step 0, PRM
# missing), episode C (reward -1, steps 0 and 1, PRM -1 and +1); prm_coef 1.
#   GRPO outcome advantages (rewards 1, -1, -1): mean -1/3, unbiased std sqrt(4/3) = 1.1547005:
#     A 1.1547005, B -0.5773503, C -0.5773503
#   bucket (g, 0), scored steps A (1 + 1 = 2) and C (-1 - 1 = -2): mean 0, std sqrt(8) = 2.8284271
#     -> A +0.7071068, C -0.7071068; B's step 0 has no score -> B's outcome advantage -0.5773503
#   bucket (g, 1): A (1 - 1 = 0), C (-1 + 1 = 0): equal -> 0, 0 (degenerate)
TRAJ_REWARDS = [1.0, -1.0, -1.0]
TRAJ_GROUPS = ["g", "g", "g"]
TRAJ_PRM = [[1.0, -1.0], [None], [-1.0, 1.0]]
TRAJ_STEPS = [[0, 1], [0], [0, 1]]


def test_trajectory_advantages_step_wise_by_hand() -> None:
    out = trajectory_advantages(
        TRAJ_REWARDS, TRAJ_GROUPS, TRAJ_PRM, TRAJ_STEPS, estimator="step_wise", prm_coef=1.0
    )
    s8 = 2 / (math.sqrt(8) + EPS)
    assert out.advantages[0] == pytest.approx([s8, 0.0], abs=1e-6)
    assert out.advantages[1] == pytest.approx([-0.5773503], abs=1e-6)
    assert out.advantages[2] == pytest.approx([-s8, 0.0], abs=1e-6)
    assert out.informative == [[True, False], [True], [True, False]]
    assert (out.buckets, out.degenerate, out.outcome_only_steps) == (2, 1, 1)


def test_trajectory_advantages_grpo_gives_every_step_its_episode_advantage() -> None:
    out = trajectory_advantages(TRAJ_REWARDS, TRAJ_GROUPS, TRAJ_PRM, TRAJ_STEPS, estimator="grpo")
    assert out.advantages == [
        pytest.approx([1.1547005] * 2, abs=1e-6),
        pytest.approx([-0.5773503], abs=1e-6),
        pytest.approx([-0.5773503] * 2, abs=1e-6),
    ]
    assert (out.buckets, out.degenerate) == (1, 0)


def test_trajectory_advantages_without_any_score_fall_back_to_outcomes() -> None:
    out = trajectory_advantages([1.0, -1.0], ["g", "g"], [[None], [None]], [[0], [0]], estimator="step_wise")
    assert out.advantages == [pytest.approx([0.7071068], abs=1e-6), pytest.approx([-0.7071068], abs=1e-6)]
    assert out.outcome_only_steps == 2


def test_a_scored_step_whose_peers_have_no_score_takes_its_outcome_advantage() -> None:
    # both episodes reached step 0; only A's was scored: A is not a bucket of one, so it does not keep its
    # raw score 1 + 1 = 2 -- both take their GRPO outcome advantages (+-0.7071068)
    out = trajectory_advantages([1.0, -1.0], ["g", "g"], [[1.0], [None]], [[0], [0]], estimator="step_wise")
    assert out.advantages == [pytest.approx([0.7071068], abs=1e-6), pytest.approx([-0.7071068], abs=1e-6)]
    assert out.outcome_only_steps == 2 and out.buckets == 0


def test_trajectory_advantages_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="aligned"):
        trajectory_advantages([1.0], ["g", "h"], [[1.0]], [[0]], estimator="step_wise")
    with pytest.raises(ValueError, match="one PRM score"):
        trajectory_advantages([1.0], ["g"], [[1.0, 1.0]], [[0]], estimator="step_wise")
    with pytest.raises(ValueError, match="estimator"):
        trajectory_advantages([1.0], ["g"], [[1.0]], [[0]], estimator="ppo")


def test_step_wise_refuses_misaligned_lists() -> None:
    with pytest.raises(ValueError, match="aligned"):
        step_wise_advantages([1.0], [1.0, -1.0], ["g", "g"], [0, 0])


# --- broadcast_to_tokens ----------------------------------------------------------------------------


def test_broadcast_to_tokens_zero_outside_the_response() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, 0.0]]


def test_broadcast_to_tokens_checks_shapes() -> None:
    with pytest.raises(ValueError):
        broadcast_to_tokens(torch.tensor([1.0, 2.0]), torch.ones(3, 4))


def test_env_workers_do_not_import_torch():
    """An env worker maps scores to rewards on its event loop; importing torch there would stall it for
    seconds (heartbeats missed, the worker declared dead)."""
    import subprocess
    import sys

    code = "import sys, guirl.actors.env_worker; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
