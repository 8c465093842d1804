"""Grounding rows as the coordinator's tasks (GUI-R1 mode): one task per row, its id a safe directory name."""

from __future__ import annotations

import re
from typing import Any

from guirl.data.rows import load_rows
from guirl.data.source import resolve_rows
from guirl.errors import InputError
from guirl.vmpool.tasks.suite import SuiteTask

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def task_id_of(row_id: str, split: str) -> str:
    """The task id (a directory name) of a row: the split, then the row id with unsafe characters replaced;
    the caller keeps ids unique (`dataset_tasks`)."""
    return f"{split}-{_UNSAFE.sub('_', row_id)}"[:200]


def dataset_tasks(path: str, split: str, limit: int = 0) -> list[Any]:
    """The rows of `path` as the coordinator's tasks (`SuiteTask`: task id, domain, and the row's id)."""
    tasks, seen = [], set()
    for row in load_rows(resolve_rows(path), limit=limit):
        task_id = task_id_of(row.id, split)
        if task_id in seen:
            raise InputError(f"{path}: rows {row.id!r} and another map to the same task id {task_id!r}")
        seen.add(task_id)
        tasks.append(SuiteTask(task_id, row.domain or split, {"row": row.id, "split": split}))
    return tasks
