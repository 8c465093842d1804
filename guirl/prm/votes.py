"""The judge's votes: reading a score out of its text, and combining m votes into one step score.

The judge answers `\\boxed{1}` (the step is relevant, executable, and makes visible progress) or
`\\boxed{-1}` (no effect, or a regression). Its text is only read, never executed. A vote without a
readable score is *invalid*: it is counted, and never turned into a number (a step whose votes are all
invalid has no score, which is not the same as a score of 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["StepVotes", "Vote", "combine", "parse_vote"]

_BOXED = re.compile(r"\\boxed\{([^{}]{0,32})\}")
"""A `\\boxed{...}` whose content is short and flat (a score is a few characters); a longer or nested
content cannot be a score and is not matched, so a hostile text cannot make this scan slow."""
_SCORES = {"1": 1.0, "+1": 1.0, "-1": -1.0, "1.0": 1.0, "+1.0": 1.0, "-1.0": -1.0}
MAX_TEXT = 1 << 16
"""Characters of a judge's answer that are read (its end, where the verdict is); the rest is ignored."""


@dataclass(frozen=True)
class Vote:
    """One reading of one judge answer."""

    score: float | None
    """+1.0 or -1.0; None for an invalid vote."""
    reason: str = ""
    """Why a vote is invalid: `empty`, `no_box`, `not_a_score`."""

    @property
    def valid(self) -> bool:
        return self.score is not None


def parse_vote(text: str) -> Vote:
    """The score of one judge answer: the last `\\boxed{...}` decides (a judge that reasons may box an
    option before its verdict), and its content must be 1 or -1 (`+1`, `1.0`, spaces allowed)."""
    if not text or not text.strip():
        return Vote(None, "empty")
    boxes = _BOXED.findall(text[-MAX_TEXT:])
    if not boxes:
        return Vote(None, "no_box")
    score = _SCORES.get(boxes[-1].strip().replace(" ", ""))
    return Vote(score, "" if score is not None else "not_a_score")


@dataclass(frozen=True)
class StepVotes:
    """The m votes on one step, combined."""

    score: float | None
    """The mean of the valid votes; None when none is valid (a missing score, never invented)."""
    votes: int
    invalid: int


def combine(votes: list[Vote]) -> StepVotes:
    """Mean of the valid votes, with the counts."""
    valid = [v.score for v in votes if v.score is not None]
    return StepVotes(
        score=sum(valid) / len(valid) if valid else None, votes=len(votes), invalid=len(votes) - len(valid)
    )
