"""Task suites: an OSWorld meta list (`{domain: [task ids]}`) and the task files it names.

A suite is loaded whole before a run starts, and every file is validated then: a broken task is a
configuration error reported with its path, never a failure discovered (and scored) mid-run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guirl.errors import InputError
from guirl.vmpool.tasks.model import TaskError, parse_task

_SAFE_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class SuiteError(InputError):
    """A meta list or one of its task files is missing or malformed."""


@dataclass(frozen=True)
class SuiteTask:
    """One task of a suite: its id, domain and raw JSON (what an `EpisodeAssignment` carries)."""

    task_id: str
    domain: str
    task: dict[str, Any]


def _safe(name: str, what: str, source: Path) -> str:
    if not isinstance(name, str) or not name or not set(name) <= _SAFE_ID or name.startswith("."):
        raise SuiteError(f"{source}: {what} {name!r} is not a plain file name")
    return name


def load_suite(
    meta: str | Path,
    *,
    examples_dir: str | Path = "",
    domains: list[str] | tuple[str, ...] = (),
    limit: int = 0,
) -> list[SuiteTask]:
    """The tasks of the meta list `meta` (in file order), from `examples_dir/<domain>/<id>.json`
    (default: `examples/` beside the meta list), restricted to `domains` and the first `limit`."""
    meta = Path(meta)
    try:
        listing = json.loads(meta.read_text())
    except OSError as exc:
        raise SuiteError(f"cannot read the task list {meta}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SuiteError(f"{meta}: not JSON: {exc}") from None
    if not isinstance(listing, dict) or not all(isinstance(v, list) for v in listing.values()):
        raise SuiteError(f"{meta}: a task list is an object of domain -> [task ids]")
    unknown = set(domains) - set(listing)
    if unknown:
        raise SuiteError(f"{meta}: no domain(s) {sorted(unknown)}; it has {sorted(listing)}")
    base = Path(examples_dir) if examples_dir else meta.parent / "examples"
    tasks: list[SuiteTask] = []
    seen: set[str] = set()
    for domain, ids in listing.items():
        if domains and domain not in domains:
            continue
        _safe(domain, "domain", meta)
        for task_id in ids:
            _safe(task_id, "task id", meta)
            if task_id in seen:
                raise SuiteError(f"{meta}: task {task_id!r} is listed twice")
            seen.add(task_id)
            path = base / domain / f"{task_id}.json"
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise SuiteError(f"{meta}: task {task_id!r}: cannot read {path}: {exc.strerror}") from None
            try:
                task = parse_task(raw, str(path))
            except TaskError as exc:
                raise SuiteError(str(exc)) from None
            if task.id != task_id:
                raise SuiteError(f"{path}: its id is {task.id!r}, the list calls it {task_id!r}")
            tasks.append(SuiteTask(task_id, domain, json.loads(raw)))
            if limit and len(tasks) >= limit:
                return tasks
    if not tasks:
        raise SuiteError(f"{meta}: no tasks selected")
    return tasks


@dataclass(frozen=True)
class SkippedTask:
    """A task of a suite left out of a run because guirl cannot set it up or score it."""

    task_id: str
    domain: str
    missing: list[str] = field(default_factory=list)
    """What it needs that guirl lacks: `setup:TYPE`, `getter:TYPE`, `metric:NAME`."""


def check_supported(
    tasks: list[SuiteTask],
    *,
    skip_unsupported: bool,
    source: str | Path = "the suite",
    available: set[str] | None = None,
    recorded: set[str] | None = None,
) -> tuple[list[SuiteTask], list[SkippedTask]]:
    """The tasks guirl can run, and those it cannot. Checked before any VM starts: without
    `skip_unsupported` a suite with an unsupported task is refused, naming each task and what it lacks
    (an unscorable task would otherwise fail every attempt, and the accuracy would be over a self-selected
    part of the suite); with it, those tasks are left out and listed as skipped, never run. `available`: the
    settings of `check.NEEDS_SETTINGS` the run provides (None: not checked); `recorded`: on replayed
    desktops, the tasks the recording has (any other lacks `recording`; None: not checked)."""
    from guirl.vmpool.tasks.check import missing_parts, unavailable_parts

    runnable: list[SuiteTask] = []
    skipped: list[SkippedTask] = []
    for t in tasks:
        task = parse_task(json.dumps(t.task), t.task_id)
        missing = missing_parts(task)
        if available is not None:
            missing += unavailable_parts(task, available)
        if recorded is not None and t.task_id not in recorded:
            missing.append("recording")
        if missing:
            skipped.append(SkippedTask(t.task_id, t.domain, missing))
        else:
            runnable.append(t)
    if skipped and not skip_unsupported:
        lines = [f"  {s.domain}/{s.task_id}: {', '.join(s.missing)}" for s in skipped]
        raise SuiteError(
            f"{source}: {len(skipped)} of {len(tasks)} tasks need what guirl does not implement or this "
            f"run does not provide:\n"
            + "\n".join(lines)
            + "\nrun with --skip-unsupported to leave them out (they are listed as skipped, never scored)"
        )
    if not runnable:
        raise SuiteError(f"{source}: none of its {len(tasks)} tasks is supported")
    return runnable, skipped
