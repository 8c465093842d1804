"""GUI-R1's rule reward (arXiv 2504.10458) on single-step data, as pure functions.

total = format * 0.2 + accuracy * 0.8, as in GUI-R1's public reward. The two terms are independent, as
there: a response without its think block still scores accuracy from its answer (the gap of `format` is
what teaches the layout). Accuracy is 0 unless the first predicted action's type is the ground truth's,
then the product of the checks that apply: the point for click, the text for text actions, the key for
press/hotkey, nothing for complete, close, navigate_back/home, wait.

Where this departs from GUI-R1's public code, and why:
- a box ground truth counts a click inside the box only, not within the radius of its centre: around a
  small icon the radius covers its neighbours; a point ground truth counts the radius. Edges count (GUI-R1
  uses strict inequalities; a click on an element's border pixel is on the element).
- with the image size known, a point outside the image scores 0 even within the radius of a point.
- press/hotkey compare key names exactly (as sets, after `normalize_key`: "Return" == "enter"), not by
  text F1, whose single-token substring rule would score "down" for "pagedown".
- the answer is read with `json`/`ast.literal_eval`, never `eval`, and from the last answer block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from guirl.agent.unified import (
    KEY_ACTIONS,
    NO_INPUT_TEXT,
    POINT_ACTIONS,
    TEXT_ACTIONS,
    UnifiedAction,
    canonical_action,
    key_chord,
    normalize_input_text,
    parse_answer,
)

F1_TEXT_ACTIONS = TEXT_ACTIONS | {"scroll"}
"""Ground-truth actions whose text is scored by token F1 (scroll's is its direction)."""


@dataclass(frozen=True)
class GroundTruth:
    """One step's answer: `bbox` is a point (x, y) or a box (x1, y1, x2, y2) in pixels of the image shown,
    empty when the action has none; `image_size` (width, height), when known, bounds the scored points."""

    action: str
    bbox: tuple[float, ...] = ()
    input_text: str = ""
    image_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        action, text = canonical_action(self.action, self.input_text)
        bbox = tuple(float(v) for v in self.bbox)
        if len(bbox) not in (0, 2, 4) or not all(math.isfinite(v) for v in bbox):
            raise ValueError(f"bbox must be (), (x, y) or (x1, y1, x2, y2) finite pixels, not {self.bbox!r}")
        if len(bbox) == 4 and (bbox[0] > bbox[2] or bbox[1] > bbox[3]):
            raise ValueError(f"box corners out of order: {bbox}")
        if action in POINT_ACTIONS and not bbox:
            raise ValueError(f"a {action} ground truth needs a point or box")
        if self.image_size is not None and min(self.image_size) <= 0:
            raise ValueError(f"image_size must be positive, not {self.image_size}")
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "bbox", bbox)
        object.__setattr__(self, "input_text", normalize_input_text(action, text))

    @classmethod
    def from_relative(
        cls,
        action: str,
        bbox_rel: Sequence[float] | None,
        input_text: str | None,
        image_size: tuple[int, int],
    ) -> GroundTruth:
        """From a GUI-R1 data row: `gt_bbox` relative to the image (0-1; [-100, -100] or empty for none)
        scaled by `image_size` (width, height) of the image the model is shown; 'no input text' is ""."""
        w, h = image_size
        rel = tuple(float(v) for v in bbox_rel) if bbox_rel is not None else ()
        if rel == (-100.0, -100.0):
            rel = ()
        if not all(0.0 <= v <= 1.0 for v in rel):
            raise ValueError(f"relative bbox must lie in 0..1, not {rel}")
        bbox = tuple(v * (w if i % 2 == 0 else h) for i, v in enumerate(rel))
        text = input_text or ""
        return cls(action, bbox, "" if text.strip().lower() == NO_INPUT_TEXT else text, (w, h))


@dataclass(frozen=True)
class RewardWeights:
    """GUI-R1's weights and thresholds."""

    format: float = 0.2
    """Weight of the format term."""
    accuracy: float = 0.8
    """Weight of the accuracy term."""
    point_radius_px: float = 140.0
    """A click within this many pixels of a ground-truth point is on it."""
    text_f1: float = 0.5
    """Token F1 at or above this is the right text."""


@dataclass(frozen=True)
class RuleReward:
    """The reward and its parts: `point`/`text` are None where they do not apply to the ground truth."""

    total: float
    format: float
    type: float
    point: float | None
    text: float | None
    accuracy: float


def rule_reward(response: str, gt: GroundTruth, weights: RewardWeights = RewardWeights()) -> RuleReward:
    """GUI-R1's rule reward for one response; never raises on any response text."""
    parsed = parse_answer(response)
    pred = parsed.actions[0] if parsed.actions else None
    fmt = 1.0 if parsed.format_ok else 0.0
    kind = 1.0 if pred is not None and pred.action == gt.action else 0.0
    point = _point_score(pred, gt, weights) if gt.action in POINT_ACTIONS else None
    text = None
    if gt.action in F1_TEXT_ACTIONS:
        text = (
            1.0 if pred is not None and token_f1(pred.input_text, gt.input_text) >= weights.text_f1 else 0.0
        )
    elif gt.action in KEY_ACTIONS:
        text = _key_score(pred, gt)
    accuracy = kind * (1.0 if point is None else point) * (1.0 if text is None else text)
    return RuleReward(
        total=fmt * weights.format + accuracy * weights.accuracy,
        format=fmt,
        type=kind,
        point=point,
        text=text,
        accuracy=accuracy,
    )


def token_f1(pred: str, gt: str) -> float:
    """GUI-R1's text F1: lower-cased whitespace tokens as sets, brackets stripped; two single tokens where
    one contains the other count 1."""
    p = set(pred.replace("[", "").replace("]", "").lower().split())
    g = set(gt.replace("[", "").replace("]", "").lower().split())
    if len(p) == 1 and len(g) == 1:
        (a,), (b,) = p, g
        if a in b or b in a:
            return 1.0
    common = len(p & g)
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def _point_score(pred: UnifiedAction | None, gt: GroundTruth, weights: RewardWeights) -> float:
    if pred is None or pred.point is None:
        return 0.0
    x, y = pred.point
    if gt.image_size is not None and not (0 <= x <= gt.image_size[0] and 0 <= y <= gt.image_size[1]):
        return 0.0
    if len(gt.bbox) == 2:
        return 1.0 if math.hypot(x - gt.bbox[0], y - gt.bbox[1]) <= weights.point_radius_px else 0.0
    x1, y1, x2, y2 = gt.bbox
    return 1.0 if x1 <= x <= x2 and y1 <= y <= y2 else 0.0


def _key_score(pred: UnifiedAction | None, gt: GroundTruth) -> float:
    if pred is None:
        return 0.0
    try:
        return 1.0 if set(key_chord(pred.input_text)) == set(key_chord(gt.input_text)) else 0.0
    except ValueError:  # the prediction's text is not a key (a type action's free text)
        return 0.0
