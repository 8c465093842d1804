"""The targets app on a real local desktop: a generated task of each kind is set up, scored as it stands (0),
played by its reference solution (1), and by a wrong answer (0); the app refuses a screen it was not drawn
for and bad arguments with a message, never a window."""

from __future__ import annotations

import json
from pathlib import Path

from guirl.agent.actions import Click
from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.runner import load_solution, play
from guirl.vmpool.targets import layout
from guirl.vmpool.tasks.evaluate import evaluate
from guirl.vmpool.tasks.generate import GenerateSpec, generate
from guirl.vmpool.tasks.model import load_task
from guirl.vmpool.tasks.setup import TaskContext, run_setup
from tests.helpers import run


def _wrong(task_id: str, suite: Path) -> list:
    """A click on another target (click, menu: after opening it), or a click beside the field (type)."""
    command = load_task(suite / "examples" / "targets" / f"{task_id}.json").config[0].parameters["command"]
    args = dict(zip(command[3::2], command[4::2], strict=True))
    lay = layout(args["--kind"], int(args["--seed"]), 640, 400, tuple(args["--labels"].split(",")))
    if lay.kind == "type":
        f = lay.field
        return [Click(x=f.x + 5, y=f.y + f.h + 20 if f.y + f.h + 20 < 400 else f.y - 20)]
    other = next(t for t in lay.targets if t.label != lay.goal)
    opening = [] if lay.button is None else [Click(x=lay.button.centre[0], y=lay.button.centre[1])]
    return [*opening, Click(x=other.centre[0], y=other.centre[1])]


def test_each_kind_scores_its_solution_one_and_anything_else_zero(tmp_path):
    suite = tmp_path / "suite"
    generate(GenerateSpec(str(suite), train=3, test=0, kinds=["click", "type", "menu"]))
    ids = json.loads((suite / "train.json").read_text())["targets"]

    async def main() -> dict:
        provider = LocalProvider(tmp_path / "vms", width=640, height=400)
        vm = await provider.create("targets")
        scores = {}
        try:
            async with VMClient(provider.address(vm), timeout_s=60) as client:
                for task_id in ids:
                    task = load_task(suite / "examples" / "targets" / f"{task_id}.json")
                    ctx = TaskContext(
                        task_id=task_id,
                        cache_dir=tmp_path / task_id,
                        download_cache=tmp_path / "dl",
                        width=640,
                        height=400,
                    )
                    ctx.cache_dir.mkdir()
                    await run_setup(client, task.config, ctx)
                    nothing = await evaluate(task, client, ctx)
                    solved = await play(  # on the app just set up and scored as it stood
                        task,
                        client,
                        load_solution(suite / "solutions" / f"{task_id}.jsonl"),
                        ctx,
                        setup=False,
                    )
                    await provider.reset(vm)
                    wrong = await play(task, client, _wrong(task_id, suite), ctx)
                    await provider.reset(vm)
                    scores[task_id] = (nothing, solved.score, wrong.score)
                # a screen the task was not drawn for, and bad arguments: refused with a message
                small = await client.execute(
                    [
                        "python",
                        "-m",
                        "guirl.vmpool.targets",
                        "--kind",
                        "click",
                        "--seed",
                        "1",
                        "--width",
                        "800",
                        "--height",
                        "600",
                    ]
                )
                bad = await client.execute(
                    [
                        "python",
                        "-m",
                        "guirl.vmpool.targets",
                        "--kind",
                        "click",
                        "--seed",
                        "1",
                        "--width",
                        "640",
                        "--height",
                        "400",
                        "--labels",
                        "red,;rm",
                    ]
                )
        finally:
            await provider.delete(vm)
        return {"scores": scores, "small": small, "bad": bad}

    got = run(main(), timeout=300)
    assert got["scores"] == {task_id: (0.0, 1.0, 0.0) for task_id in ids}
    assert got["small"]["returncode"] != 0 and "drawn for a 800x600 screen" in got["small"]["error"]
    assert got["bad"]["returncode"] == 2 and "labels" in got["bad"]["error"]
