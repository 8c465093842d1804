"""Outcome rewards: the evaluator's score to the training reward (torch-free, so env workers can use it
without importing torch into their event loop)."""

from __future__ import annotations

import math


def outcome_reward(score: float | None, *, success_threshold: float = 1.0) -> float:
    """Evaluator score to GUI-RL's outcome reward: +1 if `score >= success_threshold`, else -1.

    An unscored episode (None, or NaN) raises ValueError: an environment error must never be
    trained on as a policy failure (one of GUI-RL's defects, see NOTES on OpenClaw-RL's GUI-RL).
    """
    if score is None:
        raise ValueError("episode has no evaluator score; an unscored episode cannot become a reward")
    if math.isnan(score):
        raise ValueError("evaluator score is NaN; an unscored episode cannot become a reward")
    return 1.0 if score >= success_threshold else -1.0
