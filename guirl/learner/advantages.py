"""Advantages for GRPO-style training: outcome rewards, group z-scores, step-wise (PRM) scores.

Pure functions of tensors and lists: no model, no I/O. Every formula is unit-tested against
numbers worked out by hand in `tests/unit/test_advantages.py`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from guirl.learner.rewards import outcome_reward  # noqa: F401  (re-exported: the reward's home)

__all__ = [
    "GroupAdvantages",
    "StepAdvantages",
    "broadcast_to_tokens",
    "filter_degenerate",
    "grpo_advantages",
    "outcome_reward",
    "step_wise_advantages",
    "trajectory_advantages",
]


@dataclass(frozen=True)
class GroupAdvantages:
    """Per-sample advantages and how many groups carried no learning signal."""

    advantages: Tensor
    """(N,) one advantage per sample, in input order; exactly 0 in a degenerate group."""
    informative: Tensor
    """(N,) bool: True where the sample's group has rewards that differ (the optional filter's mask)."""
    degenerate_groups: int
    """Groups whose rewards are all equal (size-1 groups included): zero advantage, zero gradient."""
    groups: int
    """Distinct groups in the batch."""


def grpo_advantages(
    rewards: Tensor,
    group_ids: Sequence[Hashable] | Tensor,
    *,
    eps: float = 1e-6,
    std_normalize: bool = True,
) -> GroupAdvantages:
    """GRPO outcome advantages (DeepSeekMath, eq. in sec. 4.1.2): `(r - mean_g) / (std_g + eps)`.

    `group_ids` names each sample's group (the samples drawn for one task), as a list of any
    hashable ids or an integer tensor. With `std_normalize=False` the advantage is `r - mean_g`
    (Dr. GRPO drops the std division to avoid weighting easy/hard groups differently).

    std is the unbiased (n - 1) estimator, as verl's `compute_grpo_outcome_advantage` uses
    `torch.std`; for the groups of 8 of OpenClaw-RL's GUI-RL it scales advantages by sqrt(7/8)
    versus the population std. A group whose rewards are all equal (including a group of one, left
    by environment errors) gets exactly 0 and is counted: it has no baseline to compare against.
    verl instead passes a size-1 group's raw reward through (mean 0, std 1), which would train
    on an un-baselined +-1; we do not.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one per sample), got shape {tuple(rewards.shape)}")
    index, num_groups = _group_index(group_ids, rewards.shape[0], rewards.device)
    return _group_zscore(rewards, index, num_groups, eps=eps, std_normalize=std_normalize)


def filter_degenerate(rewards: Tensor, group_ids: Sequence[Hashable] | Tensor) -> Tensor:
    """(N,) bool mask of samples whose group has differing rewards (DAPO's dynamic sampling filter).

    Degenerate groups already contribute zero gradient; dropping them keeps them from diluting a
    token-mean loss and from costing learner compute.
    """
    return grpo_advantages(rewards, group_ids).informative


def step_wise_advantages(
    prm_scores: Sequence[float],
    outcomes: Sequence[float],
    group_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    *,
    prm_coef: float = 1.0,
    eps: float = 1e-6,
    std_normalize: bool = True,
) -> GroupAdvantages:
    """Step-wise (PRM mode) advantages; one entry per step sample, all four lists aligned.

    For the step sample at step `t` of an episode in group `g`:

        score = outcome + prm_coef * prm_score
        advantage = (score - mean_{g,t}) / (std_{g,t} + eps)

    where mean and std run over the bucket of steps sharing (group, step index): the t-th steps
    of all episodes of one task. `prm_coef` is applied to the step score that is normalised;
    OpenClaw-RL's GUI-RL applied its `prm_step_coef` only to the logged episode score, so its
    advantages ignored the coefficient. A bucket of one (only one episode of the group got that far)
    keeps its score as its advantage: there is no peer to compare it with, and its outcome and judged
    progress are still a signal (as GUI-RL does). A bucket of two or more equal scores gives exactly 0
    and is counted as degenerate. std is unbiased, as in `grpo_advantages`.
    """
    n = len(prm_scores)
    if not (len(outcomes) == len(group_ids) == len(step_indices) == n):
        raise ValueError(
            "step-wise inputs must be aligned: "
            f"prm_scores={n} outcomes={len(outcomes)} group_ids={len(group_ids)} "
            f"step_indices={len(step_indices)}"
        )
    scores = torch.tensor(
        [o + prm_coef * p for o, p in zip(outcomes, prm_scores, strict=True)], dtype=torch.float64
    )
    buckets = [(g, int(t)) for g, t in zip(group_ids, step_indices, strict=True)]
    index, num_buckets = _group_index(buckets, n, scores.device)
    out = _group_zscore(scores, index, num_buckets, eps=eps, std_normalize=std_normalize)
    sizes = torch.zeros(num_buckets, dtype=torch.long).index_add(0, index, torch.ones_like(index))
    alone = sizes[index] == 1
    return GroupAdvantages(
        advantages=torch.where(alone, scores, out.advantages.to(torch.float64)).to(out.advantages.dtype),
        informative=out.informative | alone,
        degenerate_groups=out.degenerate_groups - int((sizes == 1).sum().item()),
        groups=num_buckets,
    )


@dataclass(frozen=True)
class StepAdvantages:
    """Per-step advantages of a batch of trajectories (`advantages[i][j]`: trajectory i, step sample j)."""

    advantages: list[list[float]]
    informative: list[list[bool]]
    """Whether each step carries a learning signal (the optional degenerate filter's mask)."""
    degenerate: int
    """Buckets (step-wise) or groups (grpo) whose scores are all equal: zero advantage."""
    buckets: int
    """(group, step index) buckets (step-wise) or groups (grpo)."""
    outcome_only_steps: int = 0
    """Step-wise: steps without a PRM score, which take their episode's GRPO outcome advantage."""


def trajectory_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    prm_scores: Sequence[Sequence[float | None]],
    step_indices: Sequence[Sequence[int]],
    *,
    estimator: str = "grpo",
    prm_coef: float = 1.0,
    eps: float = 1e-6,
    std_normalize: bool = True,
) -> StepAdvantages:
    """The advantage of every step of every trajectory, by `estimator`.

    `grpo`: every step takes its episode's group z-scored outcome (`grpo_advantages`).
    `step_wise`: the steps with a PRM score take `step_wise_advantages` over their (group, step index)
    buckets; a step without one (the judge missed it, or had no valid vote) is not given an invented
    score: it takes its episode's GRPO outcome advantage, and is counted. So does a scored step whose
    bucket peers all lack a score: it is not a bucket of one (other episodes did reach that step), and its
    raw score would outweigh every normalised advantage of the batch.
    """
    n = len(rewards)
    if not (len(group_ids) == len(prm_scores) == len(step_indices) == n):
        raise ValueError("trajectory inputs must be aligned (one entry per trajectory)")
    if any(len(p) != len(t) for p, t in zip(prm_scores, step_indices, strict=True)):
        raise ValueError("each trajectory needs one PRM score (or None) per step index")
    grpo = grpo_advantages(
        torch.tensor(list(rewards), dtype=torch.float64),
        list(group_ids),
        eps=eps,
        std_normalize=std_normalize,
    )
    episode_adv = grpo.advantages.tolist()
    episode_info = grpo.informative.tolist()
    advantages = [[episode_adv[i]] * len(step_indices[i]) for i in range(n)]
    informative = [[episode_info[i]] * len(step_indices[i]) for i in range(n)]
    if estimator == "grpo":
        return StepAdvantages(advantages, informative, grpo.degenerate_groups, grpo.groups)
    if estimator != "step_wise":
        raise ValueError(f"unknown advantage estimator {estimator!r} (grpo or step_wise)")
    from collections import Counter

    bucket = [[(group_ids[i], int(t)) for t in step_indices[i]] for i in range(n)]
    reached = Counter(b for row in bucket for b in row)
    scored = [(i, j) for i in range(n) for j, p in enumerate(prm_scores[i]) if p is not None]
    judged = Counter(bucket[i][j] for i, j in scored)
    where = [(i, j) for i, j in scored if judged[bucket[i][j]] > 1 or reached[bucket[i][j]] == 1]
    if not where:
        return StepAdvantages(advantages, informative, 0, 0, sum(len(t) for t in step_indices))
    out = step_wise_advantages(
        [prm_scores[i][j] for i, j in where],
        [rewards[i] for i, _ in where],
        [group_ids[i] for i, _ in where],
        [step_indices[i][j] for i, j in where],
        prm_coef=prm_coef,
        eps=eps,
        std_normalize=std_normalize,
    )
    for (i, j), a, inf in zip(where, out.advantages.tolist(), out.informative.tolist(), strict=True):
        advantages[i][j] = a
        informative[i][j] = inf
    total = sum(len(t) for t in step_indices)
    return StepAdvantages(advantages, informative, out.degenerate_groups, out.groups, total - len(where))


def broadcast_to_tokens(adv_per_sample: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) advantages to (B, T) per-token advantages, zero outside the response mask.

    GRPO gives every token of a response its sample's advantage (DeepSeekMath: outcome
    supervision sets each token's advantage to the normalised reward).
    """
    if (
        adv_per_sample.dim() != 1
        or response_mask.dim() != 2
        or response_mask.shape[0] != adv_per_sample.shape[0]
    ):
        raise ValueError(
            f"expected (B,) advantages and a (B, T) mask, got {tuple(adv_per_sample.shape)} "
            f"and {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    per_token = adv_per_sample.unsqueeze(1).expand(mask.shape)
    return torch.where(mask, per_token, torch.zeros((), dtype=adv_per_sample.dtype, device=mask.device))


def _group_index(group_ids: Sequence[Hashable] | Tensor, n: int, device: torch.device) -> tuple[Tensor, int]:
    """Dense group index (N,) in order of first appearance, and the number of groups."""
    if isinstance(group_ids, Tensor):
        if group_ids.shape != (n,):
            raise ValueError(f"group_ids shape {tuple(group_ids.shape)} does not match {n} samples")
        _, index = torch.unique(group_ids, return_inverse=True)
        num_groups = int(index.max().item()) + 1 if n else 0
        return index.to(device), num_groups
    if len(group_ids) != n:
        raise ValueError(f"{len(group_ids)} group ids for {n} samples")
    dense: dict[Hashable, int] = {}
    index_list = [dense.setdefault(g, len(dense)) for g in group_ids]
    return torch.tensor(index_list, dtype=torch.long, device=device), len(dense)


def _group_zscore(
    values: Tensor, index: Tensor, num_groups: int, *, eps: float, std_normalize: bool
) -> GroupAdvantages:
    """Vectorised per-group z-score (scatter sums rather than a Python loop over groups)."""
    out_dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
    # float64 so that a group of +-1 rewards gives advantages exact to float32 precision.
    v = values.to(torch.float64)
    if not torch.isfinite(v).all():
        raise ValueError("rewards must be finite; a NaN/inf reward would poison its whole group")
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=v.device)
    counts = zeros.index_add(0, index, torch.ones_like(v))
    mean = zeros.index_add(0, index, v) / counts.clamp(min=1)
    deviation = v - mean[index]
    # Unbiased variance, as torch.std (verl); size-1 groups are zeroed below, the clamp only avoids 0/0.
    var = zeros.index_add(0, index, deviation.square()) / (counts - 1).clamp(min=1)
    vmax = zeros.scatter_reduce(0, index, v, reduce="amax", include_self=False)
    vmin = zeros.scatter_reduce(0, index, v, reduce="amin", include_self=False)
    degenerate = vmax == vmin  # all rewards equal, size-1 groups included
    adv = deviation / (var.sqrt()[index] + eps) if std_normalize else deviation
    informative = ~degenerate[index]
    # Exact zero, not (r - mean) rounding to 1e-17: a degenerate group must contribute no gradient.
    adv = torch.where(informative, adv, torch.zeros_like(adv))
    return GroupAdvantages(
        advantages=adv.to(out_dtype),
        informative=informative,
        degenerate_groups=int(degenerate.sum().item()),
        groups=num_groups,
    )
