"""`bench/targets_rows.py`'s rows: each task's layout drawn as the targets app draws it, the goal's box as
ground truth (so the rule reward's accuracy is the app's success), and with one target only the goal's."""

from __future__ import annotations

import io

from PIL import Image

from bench.targets_rows import HEIGHT, WIDTH, rows
from guirl.vmpool.targets import COLOURS, layout


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def test_rows_draw_every_target_in_its_colour_with_the_goal_as_ground_truth():
    for row, seed in zip(rows(6, 40), range(40, 46), strict=True):
        lay = layout("click", seed, WIDTH, HEIGHT)
        goal = lay.goal_box()
        assert row.instruction == lay.instruction and (row.width, row.height) == (WIDTH, HEIGHT)
        x1, y1, x2, y2 = row.gt_bbox
        assert (round(x1 * WIDTH), round(y1 * HEIGHT), round(x2 * WIDTH), round(y2 * HEIGHT)) == (
            goal.x,
            goal.y,
            goal.x + goal.w,
            goal.y + goal.h,
        )
        image = Image.open(io.BytesIO(row.image)).convert("RGB")
        assert image.size == (WIDTH, HEIGHT)
        for box in lay.targets:  # inside each box, clear of its outline and label: the target's colour
            assert image.getpixel((box.x + 4, box.y + 4)) == _rgb(COLOURS[box.label])
        assert image.getpixel((1, 1)) == _rgb("#e8e8e8")


def test_rows_with_goals_are_the_desktop_tasks_that_ask_for_those_colours():
    for row, seed in zip(rows(4, 10, goals=("red",)), range(10, 14), strict=True):
        lay = layout("click", seed, WIDTH, HEIGHT, goals=("red",))
        assert row.instruction == lay.instruction == "Click the target labelled red."
        x1, y1, _, _ = row.gt_bbox
        assert (round(x1 * WIDTH), round(y1 * HEIGHT)) == (lay.goal_box().x, lay.goal_box().y)


def test_one_target_rows_draw_the_goal_alone():
    (row,) = rows(1, 7, targets=1)
    lay = layout("click", 7, WIDTH, HEIGHT)
    image = Image.open(io.BytesIO(row.image)).convert("RGB")
    for box in lay.targets:
        expected = COLOURS[box.label] if box.label == lay.goal else "#e8e8e8"
        assert image.getpixel((box.x + 4, box.y + 4)) == _rgb(expected)
