"""What the learner checks and records around one update, as plain functions of a batch: whether a
trajectory is this learner's to train (`foreign_policy`), its samples (`trainable_samples`), the control
run's shuffled rewards, the batch's metrics, and the lines of the trained and advantage ledgers. (torch is
imported where it is used: the actor's module imports this one.)"""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import msgspec

from guirl.learner.lineage import Lineage
from guirl.messages.types import Trajectory

if TYPE_CHECKING:
    from guirl.learner.samples import TrainSample

log = logging.getLogger(__name__)


def foreign_policy(traj: Trajectory, lineage: Lineage, version: int) -> str:
    """Why `traj` was (partly) played by weights outside the lineage of the learner at `version` ("" if it
    was not): its importance ratios would be against a policy this learner never had."""
    for s in traj.steps:
        if not lineage.holds(s.policy_epoch, s.policy_version, version):
            return (
                f"step {s.step} played by version {s.policy_version} of epoch {s.policy_epoch}; the "
                f"learner is at version {version} of epoch {lineage.epoch}, which began from "
                f"version {lineage.forks[-1]}"
            )
    return ""


def batch_advantages(trajs: list[Trajectory], *, estimator: str, prm_coef: float) -> Any:
    """The advantages of the batch's steps (`guirl.learner.advantages`); ValueError on a non-finite reward."""
    from guirl.learner.advantages import (
        trajectory_advantages,
    )  # torch: imported by the learner's process only

    return trajectory_advantages(
        [t.reward for t in trajs],
        [t.group_id for t in trajs],
        [[s.prm_score for s in t.steps] for t in trajs],
        [[s.step for s in t.steps] for t in trajs],
        estimator=estimator,
        prm_coef=prm_coef,
    )


def trainable_samples(
    trajs: list[Trajectory], adv: Any, vision_token_ids: set[int], *, filter_degenerate: bool
) -> tuple[list[TrainSample], int]:
    """The training samples of the batch's steps, and how many trajectories were not trainable (malformed:
    each is logged, none trained on). With `filter_degenerate`, steps whose advantage carries no signal
    (a group whose members all scored the same) are left out."""
    from guirl.learner.samples import samples_from_trajectory

    samples: list[TrainSample] = []
    unusable = 0
    for traj, advantages, informative in zip(trajs, adv.advantages, adv.informative, strict=True):
        try:
            made = samples_from_trajectory(traj, advantages)
            bad = next((s for s in made if vision_token_ids.intersection(s.response_ids)), None)
            if bad is not None:  # the forward would count it as an image slot and fail the batch
                raise ValueError(f"{bad.name}: the response holds a vision token")
        except ValueError as exc:  # a malformed trajectory is counted, never trained on
            unusable += 1
            log.warning("trajectory %s not trainable: %s", traj.episode_id, exc)
            continue
        if filter_degenerate:
            made = [m for m, keep in zip(made, informative, strict=True) if keep]
        samples.extend(made)
    return samples, unusable


def batch_metrics(
    trajs: list[Trajectory],
    samples: list[TrainSample],
    adv: Any,
    batch: Any,
    version: int,
    *,
    step_wise: bool,
) -> dict[str, Any]:
    """The batch's metrics (rewards, advantages, how stale its samples were against `version`, the
    learner's version before the update); step-wise: the PRM's scores too."""
    versions = [s.policy_version for s in samples]
    values = [s.advantage for s in samples]
    mean = sum(values) / len(values)
    rewards = [t.reward for t in trajs]
    metrics = {
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
        "version_lag_mean": round(sum(version - max(v, 0) for v in versions) / len(versions), 3),
        "version_lag_max": max(version - max(v, 0) for v in versions),
        "version_lag_min": min(version - max(v, 0) for v in versions),
    }
    metrics.update(reward_part_means(trajs))
    if step_wise:
        metrics.update(buckets=adv.buckets, outcome_only_steps=adv.outcome_only_steps)
        metrics.update(prm_metrics(trajs))
    return metrics


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


def trained_line(trajs: list[Trajectory], samples: list[TrainSample], version: int, epoch: int) -> dict:
    """`trained.jsonl`'s line of the update that makes `version`: each episode trained and the (epoch,
    version) of its trained steps (what the chaos suite checks: nothing trained twice, nothing of weights
    outside the lineage)."""
    used = {s.episode_id for s in samples}
    return {
        "version": version,
        "epoch": epoch,
        "episodes": {
            t.episode_id: [[s.policy_epoch, s.policy_version] for s in t.steps]
            for t in trajs
            if t.episode_id in used
        },
    }


def advantage_lines(trajs: list[Trajectory], samples: list[TrainSample], version: int) -> list[dict]:
    """`advantages.jsonl`'s lines of the update that makes `version`: what each trained step was credited
    with (`train.log_advantages`: to study the estimator)."""
    by_episode = {t.episode_id: t for t in trajs}
    lines = []
    for s in samples:
        t = by_episode[s.episode_id]
        step = next(x for x in t.steps if x.step == s.step)
        lines.append(
            {
                "version": version,
                "episode_id": s.episode_id,
                "group_id": s.group_id,
                "task_id": t.task_id,
                "step": s.step,
                "reward": t.reward,
                "prm_score": step.prm_score,
                "prm_status": step.prm_status,
                "advantage": s.advantage,
            }
        )
    return lines
