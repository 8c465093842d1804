"""`guirl tasks check PATH...`: validate task files and say, per domain, how many guirl fully supports.

A PATH is a task file, a directory of them (searched recursively), or an OSWorld meta list
(`{"domain": [task ids]}`, with the tasks in `examples/<domain>/<id>.json` beside it).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from guirl.vmpool.tasks.model import Task, TaskError, getters_of, load_task


@dataclass
class DomainReport:
    total: int = 0
    supported: int = 0
    missing: Counter = field(default_factory=Counter)


@dataclass
class CheckReport:
    domains: dict[str, DomainReport] = field(default_factory=lambda: defaultdict(DomainReport))
    errors: list[str] = field(default_factory=list)


def _meta_list(path: Path) -> dict[str, list] | None:
    """The `{domain: [ids]}` of a meta list file, or None if `path` is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        return data
    return None


def _task_files(path: Path) -> list[tuple[str, Path]]:
    """(domain, file) pairs named by `path`."""
    if path.is_dir():
        return [(p.parent.name, p) for p in sorted(path.rglob("*.json")) if _meta_list(p) is None]
    meta = _meta_list(path)
    if meta is not None:
        base = path.parent / "examples"
        return [(d, base / d / f"{i}.json") for d, ids in meta.items() for i in ids]
    return [(path.parent.name, path)]


def missing_parts(task: Task) -> list[str]:
    """Names of the setup types, getters and metrics of `task` that guirl lacks."""
    from guirl.vmpool.tasks.getters import GETTERS
    from guirl.vmpool.tasks.metrics import METRICS
    from guirl.vmpool.tasks.setup import SETUP_TYPES

    out = [f"setup:{s.type}" for s in [*task.config, *task.evaluator.postconfig] if s.type not in SETUP_TYPES]
    out += [f"getter:{g}" for g in getters_of(task) if g not in GETTERS]
    if not task.infeasible:
        out += [f"metric:{m}" for m in task.funcs if m not in METRICS]
    return sorted(set(out))


def check(paths: list[Path]) -> CheckReport:
    report = CheckReport()
    for path in paths:
        if not path.exists():
            report.errors.append(f"{path}: no such file or directory")
            continue
        for domain, file in _task_files(path):
            try:
                task = load_task(file)
            except TaskError as exc:
                report.errors.append(str(exc))
                continue
            d = report.domains[domain]
            d.total += 1
            missing = missing_parts(task)
            d.supported += not missing
            d.missing.update(missing)
    return report


def render(report: CheckReport) -> str:
    lines = [f"{'domain':<22} {'tasks':>6} {'supported':>10}  missing (tasks)"]
    total = supported = 0
    for name in sorted(report.domains):
        d = report.domains[name]
        total, supported = total + d.total, supported + d.supported
        miss = ", ".join(f"{k} ({v})" for k, v in d.missing.most_common(6))
        more = f", +{len(d.missing) - 6} more" if len(d.missing) > 6 else ""
        lines.append(f"{name:<22} {d.total:>6} {d.supported:>10}  {miss}{more}")
    lines.append(f"{'all':<22} {total:>6} {supported:>10}")
    lines += [f"error: {e}" for e in report.errors]
    return "\n".join(lines)
