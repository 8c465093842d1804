"""The shipped suite `tasks/local/`: every reference solution scores 1 on a real local VM, doing nothing
scores 0 on every feasible task, and the meta lists are valid and disjoint."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path

import pytest

from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.runner import load_solution, play
from guirl.vmpool.tasks.check import check
from guirl.vmpool.tasks.evaluate import evaluate
from guirl.vmpool.tasks.model import load_task
from guirl.vmpool.tasks.setup import TaskContext, run_setup
from guirl.vmpool.tunnel import devtools_endpoint
from tests.helpers import run

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "local"
SHARES = 4
"""Desktops the suite test plays on at once (its reference solutions wait 226 s in all)."""


def _suite() -> list[tuple[str, Path]]:
    out = []
    for meta in ("test.json", "train.json"):
        for domain, ids in json.loads((SUITE / meta).read_text()).items():
            out += [(i, SUITE / "examples" / domain / f"{i}.json") for i in ids]
    return out


def test_meta_lists_are_disjoint_and_every_task_is_supported():
    test = {i for ids in json.loads((SUITE / "test.json").read_text()).values() for i in ids}
    train = {i for ids in json.loads((SUITE / "train.json").read_text()).values() for i in ids}
    assert test and train and not test & train
    report = check([SUITE / "test.json", SUITE / "train.json"])
    assert report.errors == []
    assert all(d.supported == d.total for d in report.domains.values()), {
        k: dict(d.missing) for k, d in report.domains.items()
    }
    for task_id, _ in _suite():
        assert (SUITE / "solutions" / f"{task_id}.jsonl").is_file(), task_id


def _context(tmp_path: Path, task_id: str, label: str, devtools: str | None) -> TaskContext:
    ctx = TaskContext(
        task_id=task_id,
        cache_dir=tmp_path / "cache" / task_id / label,
        download_cache=tmp_path / "downloads",
        width=1024,
        height=768,
        devtools_url=devtools,
    )
    ctx.cache_dir.mkdir(parents=True)
    return ctx


@pytest.mark.timeout(960)  # above the run's own 900 s: its failure, not a stack dump
def test_reference_solutions_score_one_and_doing_nothing_scores_zero(tmp_path):
    """Every task, set up once on a real local desktop: scored as set up (doing nothing: 0 on every feasible
    task, and on an infeasible one, which nothing declares infeasible), then its reference solution played
    and scored again (1). A task with post-evaluation steps (which change the desktop) is set up afresh for
    its solution. The suite is split over four desktops that run at once (a solution's waits leave the CPU
    idle); the tasks alternate between the two action spaces, computer_use (guirl's /action) and OSWorld's
    pyautogui (programs through /execute), so each space plays every application's solutions in turn. A
    solution that misses is played once more from a fresh set-up (and named in a warning)."""
    suite = _suite()
    spaces = ("computer_use", "pyautogui")

    async def play_share(share: int) -> dict[str, tuple[float, float]]:
        provider = LocalProvider(tmp_path / f"desktop{share}" / "vms", width=1024, height=768)
        vm = await provider.create("suite")
        scores = {}
        try:
            async with (
                VMClient(provider.address(vm), timeout_s=60) as client,
                devtools_endpoint(client, 9222) as devtools,
            ):
                for index, (task_id, path) in enumerate(suite):
                    if (index + index // SHARES) % SHARES != share:  # rotated: each desktop plays both spaces
                        continue
                    task = load_task(path)
                    solution = load_solution(SUITE / "solutions" / f"{task_id}.jsonl")
                    space = spaces[index // 2 % 2]
                    await provider.reset(vm)
                    ctx = _context(tmp_path, task_id, "nothing", devtools)
                    if task.evaluator.postconfig:
                        nothing = (await play(task, client, [], ctx)).score
                        await provider.reset(vm)
                        ctx = _context(tmp_path, task_id, "solution", devtools)
                        episode = await play(task, client, solution, ctx, action_space=space)
                    else:
                        await run_setup(client, task.config, ctx)
                        nothing = await evaluate(task, client, ctx)
                        ctx = _context(tmp_path, task_id, "solution", devtools)
                        episode = await play(task, client, solution, ctx, action_space=space, setup=False)
                    assert episode.refused == [], (task_id, episode.refused)
                    if episode.score != 1.0:
                        # once more, from a fresh set-up: a reference solution's fixed waits can fall short
                        # on a loaded machine (CI once saw Calc's edit or save miss); a wrong solution fails
                        # both times
                        first = episode.score
                        await provider.reset(vm)
                        ctx = _context(tmp_path, task_id, "solution-again", devtools)
                        episode = await play(task, client, solution, ctx, action_space=space)
                        assert episode.refused == [], (task_id, episode.refused)
                        retried[task_id] = (first, episode.score)
                    scores[task_id] = (nothing, episode.score)
        finally:
            await provider.delete(vm)
        return scores

    async def main():
        return await asyncio.gather(*(play_share(i) for i in range(SHARES)))

    retried: dict[str, tuple[float, float]] = {}
    scores = {k: v for share in run(main(), timeout=900) for k, v in share.items()}
    again = {t: first for t, (first, then) in retried.items() if then == 1.0}
    if again:
        warnings.warn(f"reference solutions that scored 1 only when played again: {again}", stacklevel=1)
    assert {t: s[1] for t, s in scores.items()} == {task_id: 1.0 for task_id, _ in suite}
    assert {t: s[0] for t, s in scores.items()} == {task_id: 0.0 for task_id, _ in suite}
