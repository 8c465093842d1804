"""`guirl runs [DIR]` and `guirl runs show RUN`: the runs under a results directory, and one run's summary
printed again, read from the files each run leaves (`summary.json` at its end, `status.json` while it runs,
`metrics.jsonl`, `episodes.jsonl`, `sft.jsonl`). Reading never changes a run, and a run that is still
going, was killed or is damaged is listed as such, never left out.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guirl.errors import InputError
from guirl.fileio import read_jsonl

STAMP = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")
"""The tail `make_run_dir` gives a run directory's name: its UTC start and 4 hex digits."""


@dataclass(frozen=True)
class RunInfo:
    """One run as `guirl runs` lists it."""

    path: Path
    mode: str
    """eval, train, sft, or ? (nothing says yet)."""
    started: float | None
    """Epoch seconds (from the directory's name; its creation time otherwise)."""
    state: str
    """done (its summary is written), running (its driver is alive), stopped (killed or crashed)."""
    progress: str
    figures: str


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_run(path: Path) -> bool:
    """A directory a guirl run made: it holds the resolved configuration every run saves first."""
    return path.is_dir() and (path / "config.toml").is_file()


def _percent(share: Any) -> str:
    return f"{100 * share:.1f}%" if isinstance(share, int | float) else "-"


def run_info(path: Path) -> RunInfo:
    from guirl.proc import pid_alive

    summary, status = _json(path / "summary.json"), _json(path / "status.json")
    summary = summary if isinstance(summary, dict) else None
    status = status if isinstance(status, dict) else None
    metrics = read_jsonl(path / "metrics.jsonl")
    sft = read_jsonl(path / "sft.jsonl")
    said = ((summary or {}).get("mode"), (status or {}).get("mode"))
    mode = next((m for m in said if isinstance(m, str) and m), "")
    if not mode:
        mode = "train" if metrics or (path / "coordinator.json").exists() else "sft" if sft else "?"
    m = STAMP.search(path.name)
    try:
        started: float | None = calendar.timegm(time.strptime(m.group(1), "%Y%m%d-%H%M%S"))  # type: ignore
    except (AttributeError, ValueError):  # no stamp, or not a date: the directory's own time
        started = path.stat().st_mtime
    if summary is not None:
        state = "done"
    elif status is not None and pid_alive(status.get("driver_pid")):
        state = "running"
    else:
        state = "stopped"
    if mode == "eval":
        if summary is not None:
            progress = f"{summary.get('tasks', '?')} tasks"
            figures = (
                f"accuracy {_percent(summary.get('accuracy'))}, "
                f"all (0) {_percent(summary.get('accuracy_all'))}, aborted {summary.get('aborted', '?')}"
            )
        else:
            results = read_jsonl(path / "results.jsonl")
            scored = {r.get("task_id") for r in results if r.get("status") == "completed"}
            handed = sum(1 for x in read_jsonl(path / "episodes.jsonl") if x.get("kind") == "assigned")
            progress, figures = f"{len(scored)} tasks scored, {handed} episodes handed out", ""
    elif mode == "train":
        last = metrics[-1] if metrics else {}
        progress = f"version {last.get('version', 0)}"
        reward = last.get("reward_mean")
        figures = f"last update: reward {reward:.2f}" if isinstance(reward, int | float) else ""
        if summary is not None:
            progress = f"{summary.get('updates', '?')} updates"
    elif mode == "sft":
        progress = f"{len(sft)} steps"
        nll = sft[-1].get("nll") if sft else None
        figures = f"nll {nll:.3f}" if isinstance(nll, int | float) else ""
    else:
        progress, figures = "", ""
    return RunInfo(path, mode, started, state, progress, figures)


def list_runs(root: Path) -> list[RunInfo]:
    """The runs directly under `root` (or `root` itself, a run), newest first."""
    if not root.is_dir():
        raise InputError(f"{root}: no such directory (runs go under run.root_dir, `runs` by default)")
    paths = [root] if is_run(root) else [p for p in root.iterdir() if is_run(p)]
    infos = [run_info(p) for p in paths]
    return sorted(infos, key=lambda r: (r.started or 0.0, r.path.name), reverse=True)


def render_list(infos: list[RunInfo]) -> str:
    if not infos:
        return "no runs"
    rows = [("run", "mode", "started (UTC)", "state", "progress", "figures")]
    for r in infos:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started)) if r.started else "?"
        rows.append((r.path.name, r.mode, when, r.state, r.progress, r.figures))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)) + "  " + row[5]
        for row in rows
    ).rstrip()


def show(path: Path) -> str:
    """A run's summary and tables, as its command printed them at its end (or what it has so far)."""
    from guirl.actors.coordinator import TaskResult
    from guirl.report import domain_table, update_table
    from guirl.vmpool.tasks.suite import SkippedTask

    if not is_run(path):
        raise InputError(f"{path}: not a run directory (no config.toml in it)")
    info = run_info(path)
    head = f"{path.name}: {info.mode} run, {info.state}" + (f" · {info.progress}" if info.progress else "")
    lines = [head]
    summary = _json(path / "summary.json")
    if info.mode == "eval" and isinstance(summary, dict):
        try:
            results = [TaskResult(**r) for r in summary.get("results", [])]
            skipped = [SkippedTask(**t) for t in summary.get("skipped", [])]
        except TypeError as exc:
            raise InputError(
                f"{path / 'summary.json'}: not an eval summary this guirl reads ({exc})"
            ) from None
        lines.append(domain_table(results, skipped)[1])
        counts = summary.get("outcomes")
        counts = counts if isinstance(counts, dict) else {}
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        lines.append(
            f"{summary.get('episodes', '?')} episodes, {summary.get('steps', '?')} steps · outcomes: "
            f"{outcomes} · environment errors {summary.get('env_errors', '?')} (retried, never scored)"
        )
    elif info.mode == "train":
        metrics = list({m.get("version"): m for m in read_jsonl(path / "metrics.jsonl")}.values())
        if metrics:
            lines.append(update_table(metrics).rstrip("\n"))
        if isinstance(summary, dict):
            lines.append(
                f"{summary.get('updates', '?')} updates in {summary.get('seconds', '?')} s · "
                f"{summary.get('episodes', '?')} episodes · {summary.get('samples_trained', '?')} samples "
                f"trained · rewards by update {summary.get('reward_mean_by_update', '?')}"
            )
    elif info.figures:
        lines.append(info.figures)
    if info.state != "done":
        why = "is still going" if info.state == "running" else "ended before writing it"
        lines.append(f"(no summary: the run {why})")
    return "\n".join(lines)
