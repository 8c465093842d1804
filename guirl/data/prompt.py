"""A grounding row as the policy sees it, and the answer it should give: one place for GUI-R1 mode's dataset
worker (episodes), SFT (targets) and evaluation alike.

The row's screenshot is resized as the policy's images are (`smart_resize` with the agent's factor and pixel
bounds), and coordinates are pixels of that resized image: the point a policy answers, the point an SFT
target holds, and the ground truth the rule reward compares them with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from guirl.messages.types import ChatMessage, ImagePart, TextPart


@dataclass
class RowPrompt:
    """A one-image chat prompt (the shape the env worker's request and sample code read)."""

    messages: list[ChatMessage]
    images: list[bytes]
    image_sizes: list[tuple[int, int]]

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the image shown."""
        return self.image_sizes[0]


def row_prompt(row: Any, prompt_cfg: Any, task_type: str = "row") -> RowPrompt:
    """The GUI-R1 prompt of `row` (a `GroundingRow`): its image resized by `prompt_cfg` (a `PromptConfig`),
    then the instruction, history and action space (`task_type` "row" = the row's own)."""
    from guirl.agent.imaging import image_size, resize_image, smart_resize
    from guirl.agent.unified import gui_r1_prompt

    w, h = image_size(row.image)
    height, width = smart_resize(
        h,
        w,
        factor=prompt_cfg.image_factor,
        min_pixels=prompt_cfg.min_pixels,
        max_pixels=prompt_cfg.max_pixels,
    )
    png = row.image if (width, height) == (w, h) else resize_image(row.image, width, height)
    text = gui_r1_prompt(row.instruction, row.history, row.task_type if task_type == "row" else task_type)
    return RowPrompt(
        messages=[ChatMessage(role="user", parts=[ImagePart(index=0), TextPart(text=text)])],
        images=[png],
        image_sizes=[(width, height)],
    )


def ground_truth(row: Any, size: tuple[int, int]) -> Any:
    """The row's ground truth in pixels of an image of `size` (a `GroundTruth` for the rule reward)."""
    from guirl.learner.rule_reward import GroundTruth

    return GroundTruth.from_relative(row.gt_action, row.gt_bbox, row.gt_input_text, size)


def target_answer(row: Any, size: tuple[int, int], think: str = "") -> str:
    """The answer GUI-R1 expects for `row` on an image of `size` (the SFT target): its action, the centre of
    its box (or its point) in pixels, its text."""
    from guirl.agent.unified import POINT_ACTIONS, UnifiedAction, render_answer

    truth = ground_truth(row, size)
    point = None
    if len(truth.bbox) == 2:
        point = (round(truth.bbox[0]), round(truth.bbox[1]))
    elif len(truth.bbox) == 4:
        point = (round((truth.bbox[0] + truth.bbox[2]) / 2), round((truth.bbox[1] + truth.bbox[3]) / 2))
    # GUI-R1 answers a point only where the action needs one; the others say [-100, -100] (no point)
    keep = point if truth.action in POINT_ACTIONS else None
    return render_answer(
        [UnifiedAction(action=truth.action, point=keep, input_text=truth.input_text)], think=think
    )
