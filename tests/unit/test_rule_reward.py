"""GUI-R1's rule reward against hand-worked cases: every action type, malformed answers, weights, data rows.

Default weights: total = 0.2 * format + 0.8 * accuracy.
"""

from __future__ import annotations

import math

import pytest

from guirl.learner.rule_reward import GroundTruth, RewardWeights, RuleReward, rule_reward, token_f1

IMAGE = (1000, 800)
BOX = GroundTruth("click", (100, 100, 200, 150), image_size=IMAGE)  # centre (150, 125)
POINT = GroundTruth("click", (500, 400), image_size=IMAGE)


def say(action: str, point: tuple[float, float] = (-100, -100), text: str = "no input text") -> str:
    return (
        f"<think>reasoning</think> <answer>[{{'action': '{action}', 'point': [{point[0]}, {point[1]}], "
        f"'input_text': '{text}'}}]</answer>"
    )


def reward(response: str, gt: GroundTruth, **weights: float) -> RuleReward:
    return rule_reward(response, gt, RewardWeights(**weights))


# --- click ---------------------------------------------------------------------------------------


def test_click_inside_box() -> None:
    # format 1, type 1, point 1 (150 in 100..200, 120 in 100..150): accuracy 1, total 0.2 + 0.8 = 1.0
    assert reward(say("click", (150, 120)), BOX) == RuleReward(
        total=1.0, format=1.0, type=1.0, point=1.0, text=None, accuracy=1.0
    )


def test_click_on_box_edge_counts() -> None:
    assert reward(say("click", (100, 150)), BOX).point == 1.0


def test_click_outside_box_near_its_centre_misses() -> None:
    # (150, 200) is 75 px below the centre, inside the radius, but outside the box: a box counts its inside
    # only. accuracy 0, total 0.2 * 1 = 0.2
    r = reward(say("click", (150, 200)), BOX)
    assert (r.point, r.accuracy, r.total) == (0.0, 0.0, pytest.approx(0.2))


@pytest.mark.parametrize(
    ("pred", "point"),
    [
        ((600, 490), 1.0),  # sqrt(100^2 + 90^2) = 134.5 <= 140
        ((584, 512), 1.0),  # sqrt(84^2 + 112^2) = 140 exactly: inclusive
        ((600, 500), 0.0),  # sqrt(100^2 + 100^2) = 141.4 > 140
    ],
)
def test_click_near_a_ground_truth_point(pred: tuple[int, int], point: float) -> None:
    r = reward(say("click", pred), POINT)
    assert r.point == point
    assert r.total == pytest.approx(0.2 + 0.8 * point)


def test_click_outside_the_image_misses_even_within_the_radius() -> None:
    edge = GroundTruth("click", (990, 400), image_size=IMAGE)
    # (1050, 400) is 60 px from the point but beyond the image's 1000 px width: point 0, total 0.2
    assert reward(say("click", (1050, 400)), edge).total == pytest.approx(0.2)
    # Without the image size only the radius applies: point 1, total 1.0
    assert reward(say("click", (1050, 400)), GroundTruth("click", (990, 400))).total == pytest.approx(1.0)


def test_wrong_type_scores_format_only() -> None:
    # type 0 -> accuracy 0 whatever the rest; the type action has no point: point 0. total 0.2
    r = reward(say("type", text="hello"), POINT)
    assert r == RuleReward(total=pytest.approx(0.2), format=1.0, type=0.0, point=0.0, text=None, accuracy=0.0)


def test_the_first_action_is_scored() -> None:
    both = (
        "<think>t</think> <answer>[{'action': 'click', 'point': [150, 120], 'input_text': 'no input text'}, "
        "{'action': 'complete', 'point': [-100, -100], 'input_text': 'no input text'}]</answer>"
    )
    assert reward(both, BOX).total == pytest.approx(1.0)
    assert reward(both, GroundTruth("complete")).total == pytest.approx(0.2)


# --- text actions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "text", "total"),
    [
        ("shanghai mall", 1.0, 1.0),  # F1 1
        ("shanghai", 1.0, 1.0),  # P 1/1, R 1/2: F1 2*0.5/1.5 = 0.67 >= 0.5
        ("beijing mall", 1.0, 1.0),  # P 1/2, R 1/2: F1 0.5, at the threshold
        ("beijing airport", 0.0, 0.2),  # F1 0: accuracy 0
    ],
)
def test_type_text_f1(pred: str, text: float, total: float) -> None:
    r = reward(say("type", text=pred), GroundTruth("type", (), "shanghai mall"))
    assert (r.type, r.point, r.text, r.total) == (1.0, None, text, pytest.approx(total))


def test_text_threshold_is_configurable() -> None:
    # "shanghai" vs "shanghai mall": F1 0.67 < 0.7 -> text 0, total 0.2
    r = reward(say("type", text="shanghai"), GroundTruth("type", (), "shanghai mall"), text_f1=0.7)
    assert (r.text, r.total) == (0.0, pytest.approx(0.2))


def test_select_and_open_app() -> None:
    # "texas" vs "Texas": one token each, equal after lower-casing: F1 1
    assert reward(say("select", text="texas"), GroundTruth("select", (), "Texas")).total == pytest.approx(1.0)
    # "Chrome" vs "Google Chrome": F1 0.67
    assert reward(say("open_app", text="Chrome"), GroundTruth("open_app", (), "Google Chrome")).total == 1.0


def test_right_text_wrong_type() -> None:
    # select with the right text for a type step: text 1 but type 0, so accuracy 0, total 0.2
    r = reward(say("select", text="shanghai mall"), GroundTruth("type", (), "shanghai mall"))
    assert (r.type, r.text, r.accuracy, r.total) == (0.0, 1.0, 0.0, pytest.approx(0.2))


@pytest.mark.parametrize(("pred", "total"), [("down", 1.0), ("DOWN", 1.0), ("up", 0.2), ("left", 0.2)])
def test_scroll_direction(pred: str, total: float) -> None:
    assert reward(say("scroll", text=pred), GroundTruth("scroll", (), "DOWN")).total == pytest.approx(total)


# --- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "gt", "text"),
    [
        (say("enter"), GroundTruth("enter"), 1.0),  # both press "enter"
        (say("press", text="Return"), GroundTruth("enter"), 1.0),  # "return" is "enter"
        (say("press", text="tab"), GroundTruth("enter"), 0.0),
        (say("press", text="down"), GroundTruth("press", (), "pagedown"), 0.0),  # F1's substring rule: 1
        (say("hotkey", text="shift+ctrl+t"), GroundTruth("hotkey", (), "ctrl+shift+t"), 1.0),
        (say("hotkey", text="ctrl+t"), GroundTruth("hotkey", (), "ctrl+shift+t"), 0.0),
        (say("type", text="hello world"), GroundTruth("enter"), 0.0),  # not a key at all
    ],
)
def test_keys_compare_exactly(response: str, gt: GroundTruth, text: float) -> None:
    r = reward(response, gt)
    assert r.text == text
    assert r.point is None


# --- actions with neither point nor text ---------------------------------------------------------


@pytest.mark.parametrize(
    ("said", "gt_action"),
    [
        ("complete", "complete"),
        ("finished", "complete"),
        ("press_back", "press_back"),
        ("press_home", "press_home"),
        ("close/delete", "close/delete"),
        ("wait", "wait"),
    ],
)
def test_no_argument_actions(said: str, gt_action: str) -> None:
    # type 1 and nothing else applies: accuracy 1, total 1.0
    assert reward(say(said), GroundTruth(gt_action)) == RuleReward(1.0, 1.0, 1.0, None, None, 1.0)


def test_close_is_not_back() -> None:
    assert reward(say("press_back"), GroundTruth("close/delete")).total == pytest.approx(0.2)


# --- malformed answers ---------------------------------------------------------------------------

INSIDE = "[{'action': 'click', 'point': [150, 120], 'input_text': 'no input text'}]"


def test_no_think_still_scores_accuracy() -> None:
    # As GUI-R1's reward: format and accuracy are separate terms, so a correct answer without its think
    # block keeps the accuracy (0.8) and loses the format (0.2).
    r = reward(f"<answer>{INSIDE}</answer>", BOX)
    assert (r.format, r.accuracy, r.total) == (0.0, 1.0, pytest.approx(0.8))


def test_float_point_is_a_format_slip_not_a_miss() -> None:
    r = reward(say("click", (150.5, 120.0)), BOX)
    assert (r.format, r.point, r.total) == (0.0, 1.0, pytest.approx(0.8))


@pytest.mark.parametrize(
    "response",
    [
        "<think>the button is top left</think>",  # no answer
        "I would click the button.",
        f"<think>t</think> <answer>{INSIDE[:-2]}</answer>",  # bad literal
        "<think>t</think> <answer>[{'action': 'click', 'input_text': 'no input text'}]</answer>",  # no point
        "<think>t</think> <answer>[{'action': 'click', 'point': [-100, -100], 'input_text': ''}]</answer>",
        "<think>t</think> <answer>[{'action': 'click', 'point': ['150', '120'], 'input_text': ''}]</answer>",
        "<think>t</think> <answer>[]</answer>",
    ],
)
def test_unreadable_answers_score_zero(response: str) -> None:
    assert reward(response, BOX) == RuleReward(0.0, 0.0, 0.0, 0.0, None, 0.0)


@pytest.mark.parametrize(
    "response",
    [
        "",
        "\x00" * 1000,
        "x" * 2_000_000,
        "<answer>" + "[" * 100_000 + "]" * 100_000 + "</answer>",
        "<think>t</think> <answer>__import__('os').system('true')</answer>",
        "<think>t</think> <answer>[{'action': 'click', 'point': [1e400, 1], 'input_text': ''}]</answer>",
        "<think>🙂</think> <answer>[{'action': 'ｃｌｉｃｋ', 'point': [1, 1], 'input_text': ''}]</answer>",
    ],
)
def test_hostile_responses_never_raise(response: str) -> None:
    for gt in (BOX, GroundTruth("type", (), "x"), GroundTruth("enter"), GroundTruth("scroll", (), "up")):
        assert reward(response, gt).total == 0.0


# --- weights -------------------------------------------------------------------------------------


def test_weights_are_configurable() -> None:
    w = {"format": 0.5, "accuracy": 0.5}
    assert reward(say("click", (150, 120)), BOX, **w).total == pytest.approx(1.0)  # 0.5 + 0.5
    assert reward(say("complete"), BOX, **w).total == pytest.approx(0.5)  # 0.5 + 0
    assert reward(f"<answer>{INSIDE}</answer>", BOX, **w).total == pytest.approx(0.5)  # 0 + 0.5
    # 134.5 px away: inside the default radius, outside a 100 px one
    assert reward(say("click", (600, 490)), POINT, point_radius_px=100).point == 0.0


# --- ground truth --------------------------------------------------------------------------------


def test_from_relative() -> None:
    gt = GroundTruth.from_relative("click", [0.1, 0.2, 0.3, 0.4], "no input text", (1000, 800))
    assert gt.bbox == pytest.approx((100, 160, 300, 320))
    assert (gt.action, gt.input_text, gt.image_size) == ("click", "", (1000, 800))
    point = GroundTruth.from_relative("click", (0.5, 0.25), None, (1000, 800))
    assert point.bbox == (500.0, 200.0)
    scroll = GroundTruth.from_relative("scroll", [-100, -100], "UP", (1000, 800))
    assert (scroll.action, scroll.bbox, scroll.input_text) == ("scroll", (), "up")
    enter = GroundTruth.from_relative("enter", [], "no input text", (1000, 800))
    assert (enter.action, enter.input_text) == ("press", "enter")
    assert GroundTruth.from_relative("press_back", None, "", (1, 1)).action == "navigate_back"


@pytest.mark.parametrize(
    "make",
    [
        lambda: GroundTruth.from_relative("click", [0.5, 1.5], "", IMAGE),  # not relative
        lambda: GroundTruth("click"),  # nothing to score a click against
        lambda: GroundTruth("click", (1, 2, 3)),
        lambda: GroundTruth("click", (200, 100, 100, 150)),  # corners swapped
        lambda: GroundTruth("click", (math.nan, 1)),
        lambda: GroundTruth("long_press", (1, 2)),
        lambda: GroundTruth("type", (), "no input text"),
        lambda: GroundTruth("scroll", (), "sideways"),
        lambda: GroundTruth("click", (1, 2), image_size=(0, 10)),
    ],
)
def test_bad_ground_truth_raises(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


# --- token F1 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gt", "f1"),
    [
        ("shanghai mall", "shanghai mall", 1.0),
        ("Shanghai Mall", "shanghai shopping mall", 0.8),  # P 2/2, R 2/3: 2 * (2/3) / (5/3)
        ("shanghai", "shanghai mall", 2 / 3),  # P 1, R 1/2
        ("a b c d", "a", 0.4),  # P 1/4, R 1: 2 * 0.25 / 1.25
        ("a a b", "b a", 1.0),  # sets
        ("[up]", "up", 1.0),  # brackets stripped
        ("app", "application", 1.0),  # single tokens, one inside the other
        ("apple pie", "application", 0.0),  # the substring rule is for single tokens only
        ("", "x", 0.0),
        ("", "", 0.0),
    ],
)
def test_token_f1(pred: str, gt: str, f1: float) -> None:
    assert token_f1(pred, gt) == pytest.approx(f1)
