"""The shipped suite `tasks/local/`: every reference solution scores 1 on a real local VM, doing nothing
scores 0 on every feasible task, and the meta lists are valid and disjoint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.runner import load_solution, play
from guirl.vmpool.tasks.check import check
from guirl.vmpool.tasks.model import load_task
from guirl.vmpool.tasks.setup import TaskContext
from tests.helpers import run

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "local"


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


def test_reference_solutions_score_one_and_doing_nothing_scores_zero(tmp_path):
    """Both passes over the suite run at once, each on its own desktop (a solution's waits leave the CPU
    idle); every reference solution scores 1, doing nothing scores 0 on every feasible task."""

    async def play_suite(label: str) -> dict[str, float]:
        provider = LocalProvider(tmp_path / label / "vms", width=1024, height=768)
        vm = await provider.create("suite")
        scores = {}
        try:
            async with VMClient(provider.address(vm), timeout_s=60) as client:
                for task_id, path in _suite():
                    task = load_task(path)
                    actions = (
                        load_solution(SUITE / "solutions" / f"{task_id}.jsonl") if label == "solution" else []
                    )
                    await provider.reset(vm)
                    ctx = TaskContext(
                        task_id=task_id,
                        cache_dir=tmp_path / "cache" / task_id / label,
                        download_cache=tmp_path / "downloads",
                        width=1024,
                        height=768,
                    )
                    ctx.cache_dir.mkdir(parents=True)
                    episode = await play(task, client, actions, ctx)
                    assert episode.refused == [], (task_id, episode.refused)
                    scores[task_id] = episode.score
        finally:
            await provider.delete(vm)
        return scores

    async def main():
        return await asyncio.gather(play_suite("solution"), play_suite("nothing"))

    solved, nothing = run(main(), timeout=400)
    assert solved == {task_id: 1.0 for task_id, _ in _suite()}
    assert nothing == {task_id: 0.0 for task_id, _ in _suite()}
