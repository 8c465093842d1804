"""Running one task on one VM: setup, the agent's actions (here: a solution's typed actions), evaluation.

This is what `guirl vm run` does for a person debugging a task, and what tests use to check that every
shipped task's reference solution scores 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from guirl.agent.actions import AnyAction
from guirl.errors import InputError
from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.evaluate import evaluate
from guirl.vmpool.tasks.model import Task
from guirl.vmpool.tasks.setup import TaskContext, run_setup


class SolutionError(InputError):
    """A solution file with a line that is not a typed action."""


def load_solution(path: str | Path) -> list[AnyAction]:
    """Typed actions, one JSON object per line (`{"type": "click", "x": 10, "y": 20}`)."""
    actions = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            actions.append(msgspec.json.decode(line, type=AnyAction))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SolutionError(f"{path}:{n}: not a typed action: {exc}") from None
    return actions


@dataclass
class Episode:
    """What happened: the score, and one screenshot per step (after it)."""

    score: float
    steps: int
    screenshots: list[bytes] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


async def play(
    task: Task,
    client: VMClient,
    actions: list[AnyAction],
    ctx: TaskContext,
    *,
    keep_screenshots: bool = False,
    action_space: str = "computer_use",
    setup: bool = True,
) -> Episode:
    """Set the task up (unless `setup` is False: the desktop already is), perform `actions` in
    `action_space` (see `VMClient.perform`), and score the result."""
    if setup:
        await run_setup(client, task.config, ctx)
    episode = Episode(score=0.0, steps=0)
    for action in actions:
        result = await client.perform(action, action_space=action_space, screenshot=keep_screenshots)
        if not result.ok:
            episode.refused.append(result.error)
        ctx.actions.append(action)
        episode.steps += 1
        if keep_screenshots and result.screenshot:
            episode.screenshots.append(result.screenshot)
    episode.score = await evaluate(task, client, ctx)
    return episode


def episode_json(episode: Episode) -> str:
    return json.dumps({"score": episode.score, "steps": episode.steps, "refused": episode.refused})
