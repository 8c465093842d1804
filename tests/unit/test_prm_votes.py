"""Reading the judge's votes: well-formed, malformed, empty, several boxes, non-numeric, hostile."""

from __future__ import annotations

import pytest

from guirl.prm.votes import MAX_TEXT, Vote, combine, parse_vote


@pytest.mark.parametrize(
    ("text", "score", "reason"),
    [
        ("The click opened the menu. \\boxed{1}", 1.0, ""),
        ("Nothing changed on screen.\n\\boxed{-1}", -1.0, ""),
        ("\\boxed{ +1 }", 1.0, ""),
        ("\\boxed{1.0}", 1.0, ""),
        ("\\boxed{- 1}", -1.0, ""),
        # several boxes: the last one is the verdict
        ("Either \\boxed{1} or \\boxed{-1}; on reflection the dialog did not open: \\boxed{-1}", -1.0, ""),
        ("\\boxed{-1} ... wait, the file was saved. \\boxed{1}", 1.0, ""),
        ("", None, "empty"),
        ("   \n\t", None, "empty"),
        ("The step made progress, score 1.", None, "no_box"),
        ("\\boxed{}", None, "not_a_score"),
        ("\\boxed{yes}", None, "not_a_score"),
        ("\\boxed{0}", None, "not_a_score"),
        ("\\boxed{2}", None, "not_a_score"),
        ("\\boxed{0.5}", None, "not_a_score"),
        ("\\boxed{1} and then \\boxed{maybe}", None, "not_a_score"),
        ("\\boxed{\\text{1}}", None, "no_box"),  # nested: not a plain score
        ("boxed{1}", None, "no_box"),
        ("\\boxed{1", None, "no_box"),
    ],
)
def test_parse_vote(text: str, score: float | None, reason: str) -> None:
    vote = parse_vote(text)
    assert (vote.score, vote.reason, vote.valid) == (score, reason, score is not None)


def test_hostile_text_is_read_in_linear_time_and_only_its_end() -> None:
    # many unclosed boxes and a huge prefix: the scan stays bounded and the verdict at the end counts
    hostile = "\\boxed{" * 200_000 + "x" * (2 * MAX_TEXT) + "\\boxed{-1}"
    assert parse_vote(hostile) == Vote(-1.0)
    assert parse_vote("\\boxed{1}" + "x" * MAX_TEXT) == Vote(None, "no_box")  # beyond the read window


def test_combine_averages_valid_votes_and_counts_invalid_ones() -> None:
    votes = [parse_vote(t) for t in ("\\boxed{1}", "\\boxed{1}", "\\boxed{-1}", "no verdict", "")]
    step = combine(votes)
    assert step.score == pytest.approx(1 / 3) and step.votes == 5 and step.invalid == 2
    missing = combine([parse_vote("??"), parse_vote("\\boxed{x}")])
    assert missing.score is None and missing.invalid == 2  # no score invented
    assert combine([]).score is None and combine([]).votes == 0
