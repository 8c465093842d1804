"""What a run prints and writes about itself: the progress lines, the accuracy table per domain, the table of
updates, the W&B lines, and the summaries (`summary.json`) of eval and train runs."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, TextIO

from guirl.actors.coordinator import Coordinator, TaskResult
from guirl.fileio import JsonlTail
from guirl.tracking import Tracker
from guirl.vmpool.tasks.suite import SkippedTask


def progress_line(snap: dict[str, Any]) -> str:
    scored = snap["scored"]
    rate = f"{100.0 * snap['score_sum'] / scored:.1f}%" if scored else "-"
    sps = snap["steps"] / snap["elapsed_s"] if snap["elapsed_s"] > 0 else 0.0
    return (
        f"[eval] {snap['done']}/{snap['total']} tasks · running {snap['running']} · "
        f"success {snap['success']}/{scored} ({rate}) · env errors {snap['env_errors']} · "
        f"aborted {snap['aborted']} · {sps:.2f} steps/s · {snap['elapsed_s']:.0f} s"
    )


def domain_table(
    results: list[TaskResult], skipped: list[SkippedTask] | tuple = ()
) -> tuple[dict[str, dict], str]:
    """Accuracy per domain, two ways, and the table as text. `accuracy`: the mean evaluator score over the
    scored tasks (aborted tasks — environment errors to the last attempt — are listed apart, never counted
    as failures). `accuracy_all`: over every task run, an aborted one scoring 0, as OSWorld's own figures
    count it. Skipped tasks (unsupported, never run) are in neither."""
    blank = {"tasks": 0, "scored": 0, "success": 0, "score_sum": 0.0, "skipped": 0}
    rows: dict[str, dict] = defaultdict(lambda: dict(blank))
    for r in results:
        for key in (r.domain, "all"):
            row = rows[key]
            row["tasks"] += 1
            if r.status == "completed":
                row["scored"] += 1
                row["score_sum"] += r.score or 0.0
                row["success"] += int((r.score or 0.0) >= 1.0)
    for t in skipped:
        for key in (t.domain, "all"):
            rows[key]["tasks"] += 1
            rows[key]["skipped"] += 1
    out: dict[str, dict] = {}
    for key, row in rows.items():
        scored, run = row["scored"], row["tasks"] - row["skipped"]
        out[key] = {
            **row,
            "score_sum": round(row["score_sum"], 4),
            "aborted": run - scored,
            "accuracy": round(row["score_sum"] / scored, 4) if scored else None,
            "accuracy_all": round(row["score_sum"] / run, 4) if run else None,
        }
    order = sorted(k for k in out if k != "all") + ["all"]
    names = ("tasks", 5), ("scored", 6), ("success", 7), ("aborted", 7), ("skipped", 7)
    head = f"{'domain':<20} " + " ".join(f"{n:>{w}}" for n, w in names) + f" {'accuracy':>9} {'all (0)':>9}"
    lines = [head]
    for key in order:
        r = out[key]
        acc, acc_all = (
            f"{100 * r[k]:.1f}%" if r[k] is not None else "-" for k in ("accuracy", "accuracy_all")
        )
        if key == "all":
            lines.append("-" * len(head))
        lines.append(
            f"{key:<20} {r['tasks']:>5} {r['scored']:>6} {r['success']:>7} {r['aborted']:>7} "
            f"{r['skipped']:>7} {acc:>9} {acc_all:>9}"
        )
    lines.append(
        "accuracy: over the scored tasks · all (0): over every task run, an aborted one as 0 (OSWorld's way) "
        "· skipped tasks: in neither"
    )
    return {k: out[k] for k in order}, "\n".join(lines)


def _percent(share: float | None) -> str:
    return f"{100 * share:.1f}%" if share is not None else "-"


def env_utilisation(snap: dict[str, Any]) -> float | None:
    """The share of VM time spent in episodes so far (None before any VM time has passed)."""
    vm_time = snap["slots"] * snap["vm_elapsed_s"]
    return min(1.0, snap["episode_s"] / vm_time) if vm_time > 0 else None


class Tracking:
    """Each update's metrics line (and each evaluation) to W&B, with the coordinator's view beside it."""

    def __init__(self, tracker: Tracker, run_dir: Path) -> None:
        self.tracker = tracker
        self.tail = JsonlTail(run_dir / "metrics.jsonl")
        self.step = 0
        self.evals = 0

    def poll(self, coord: Coordinator, started: float) -> None:
        if not self.tracker.enabled:
            return
        new = self.tail.read()
        if new or len(coord.eval_lines) > self.evals:
            snap = coord.snapshot()
            elapsed = time.monotonic() - started
            env = {
                "env/utilisation": env_utilisation(snap) or 0.0,
                "env/episodes": len(coord.ended),
                "env/errors": snap["env_errors"],
                "env/steps_per_s": snap["steps"] / elapsed if elapsed > 0 else 0.0,
            }
        for m in new:
            if m.get("version", 0) <= self.step:  # a restarted learner repeats its checkpoint's version
                continue
            self.step = int(m["version"])
            self.tracker.log({**m, **env}, step=self.step)
        for line in coord.eval_lines[self.evals :]:
            self.tracker.log(
                {
                    "eval/accuracy": line["accuracy"],
                    "eval/version": line["version"],
                    "eval/scored": line["scored"],
                    **{f"eval/{d}": v for d, v in (line.get("domains") or {}).items()},
                },
                step=max(self.step, 1),
            )
        self.evals = len(coord.eval_lines)


_TABLE = (  # column, metrics key, format
    ("version", "version", "{:d}"),
    ("reward", "reward_mean", "{:+.2f}"),
    ("success", "success_rate", "{:.0%}"),
    ("samples", "samples", "{:.0f}"),
    ("degenerate", "degenerate_groups", "{:d}"),
    ("lag", "version_lag_mean", "{:.2f}"),
    ("clipfrac", "clipfrac", "{:.3f}"),
    ("approx_kl", "approx_kl", "{:.2e}"),
    ("entropy", "entropy", "{:.3f}"),
    ("grad_norm", "grad_norm", "{:.3e}"),
    ("prm", "prm.score_mean", "{:+.2f}"),
    ("agree", "prm.agreement", "{:.0%}"),
    ("invalid", "prm.invalid_vote_rate", "{:.0%}"),
    ("judge_s", "prm.judge_latency_mean_s", "{:.2f}"),
    ("update_s", "update_s", "{:.1f}"),
    ("idle", "learner_idle_frac", "{:.0%}"),
)


def update_table(metrics: list[dict[str, Any]]) -> str:
    """One row per update of the metrics that tell how training goes (all of them: metrics.jsonl); a column
    no update has (the PRM's, in a run without one) is left out."""
    table = [c for c in _TABLE if any(c[1] in m for m in metrics)] or list(_TABLE)
    rows = [[c for c, _, _ in table]]
    for m in metrics:
        row = []
        for _, key, fmt in table:
            v = m.get(key)
            try:
                row.append(fmt.format(int(v) if fmt == "{:d}" else v) if v is not None else "-")
            except (TypeError, ValueError):
                row.append(str(v))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(table))]
    return "".join(" ".join(c.rjust(w) for c, w in zip(r, widths)) + "\n" for r in rows)


def train_progress_line(coord: Coordinator, metrics: dict[str, Any], updates: int, started: float) -> str:
    snap = coord.snapshot()
    elapsed = time.monotonic() - started
    target = f"/{updates}" if updates else ""
    util = env_utilisation(snap) or 0.0
    parts = [
        f"[train] version {coord.learner_version}{target}",
        f"env utilisation {util:.0%}",
        f"episodes {len(coord.ended)} (running {snap['running']}, env errors {snap['env_errors']})",
        f"{snap['steps'] / elapsed if elapsed > 0 else 0.0:.2f} steps/s",
    ]
    if metrics:
        m = metrics
        # a simulated update (`train.simulated_update_s`) trains nothing: it has no clip fraction to show
        clip = "simulated update" if "simulated_update_s" in m else f"clipfrac {m.get('clipfrac', 0):.3f}"
        parts.append(
            f"last update: reward {m.get('reward_mean', 0):+.2f}, success {m.get('success_rate', 0):.0%}, "
            f"{clip}, lag {m.get('version_lag_mean', 0):.1f}, "
            f"learner idle {m.get('learner_idle_frac', 0):.0%}"
        )
    parts.append(f"{elapsed:.0f} s")
    return " · ".join(parts)


# -- summaries ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Earlier:
    """What a resumed eval carries from its earlier sessions (`guirl.eval.earlier_sessions`): each task's last
    scored result, and the counts of the episodes those sessions played."""

    results: list[TaskResult] = dataclasses.field(default_factory=list)
    episodes: int = 0
    steps: int = 0
    env_errors: int = 0
    last_seq: int = 0  # the last episode number used: a new session numbers on from it


def eval_summary(
    coord: Coordinator,
    skipped: list[SkippedTask],
    *,
    run_dir: Path,
    source: str,
    backend: str,
    ckpt: str,
    seconds: float,
    earlier: Earlier | None = None,
) -> tuple[dict[str, Any], str]:
    """An eval run's `summary.json` (every task's result, the skipped ones apart) and its table per domain;
    `earlier`: what a resumed run kept of its earlier sessions (their results, and their episodes, steps
    and environment errors, counted in with this session's)."""
    earlier = earlier or Earlier()
    results = sorted([*earlier.results, *coord.results.values()], key=lambda r: (r.domain, r.task_id))
    per_domain, table = domain_table(results, skipped)
    snap = coord.snapshot()
    summary = {
        "run_dir": str(run_dir),
        "mode": "eval",
        "tasks_file": source,
        "backend": backend,
        "checkpoint": ckpt,
        "seconds": round(seconds, 2),
        "tasks": len(results),
        "accuracy": per_domain["all"]["accuracy"],
        "accuracy_all": per_domain["all"]["accuracy_all"],
        "domains": per_domain,
        "episodes": len(coord.ended) + earlier.episodes,
        "resumed_with": len(earlier.results),
        "env_errors": snap["env_errors"] + earlier.env_errors,
        "aborted": snap["aborted"],
        "steps": snap["steps"] + earlier.steps,
        "outcomes": dict(Counter(r.outcome for r in results if r.status == "completed")),
        "results": [dataclasses.asdict(r) for r in results],
        "skipped": [dataclasses.asdict(t) for t in skipped],
    }
    return summary, table


def eval_end_lines(summary: dict[str, Any], run_dir: Path, seconds: float, out: TextIO) -> None:
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary["outcomes"].items())) or "none"
    print(
        f"[eval] {summary['episodes']} episodes, {summary['steps']} steps · outcomes: {outcomes} · "
        f"environment errors {summary['env_errors']} (retried, never scored)",
        file=out,
    )
    print(
        f"[eval] summary: {run_dir / 'summary.json'} · episodes: {run_dir / 'episodes'} ({seconds:.1f} s)",
        file=out,
    )


def _learner_restarts(run_dir: Path) -> int:
    from guirl.learner.lineage import Lineage

    try:
        lineage = Lineage.load(run_dir)
    except ValueError:  # damaged: the learner refused to start on it, and said so
        return 0
    return lineage.epoch if lineage is not None else 0


def train_summary(
    coord: Coordinator, snap: dict[str, Any], *, run_dir: Path, sync: bool, ckpt: str, seconds: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A train run's `summary.json` (from `metrics.jsonl`, one line per version, and the coordinator's
    `snap`shot taken before shutting down) and the metrics it was made from."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = list({m["version"]: m for m in lines}.values())  # by version: a restarted learner repeats one
    trained = sum(m.get("samples", 0) for m in metrics)
    util = env_utilisation(snap)
    # steady state: samples trained per second from the first update to the last (start-up left out)
    span = metrics[-1]["time"] - metrics[0]["time"] if len(metrics) > 1 else 0.0
    steady = round(sum(m.get("samples", 0) for m in metrics[1:]) / span, 3) if span > 0 else None
    summary = {
        "run_dir": str(run_dir),
        "mode": "train",
        "sync": sync,
        "checkpoint": ckpt,
        "seconds": round(seconds, 2),
        "updates": len(metrics),
        "final_version": metrics[-1]["version"] if metrics else 0,
        "episodes": len(coord.ended),
        "env_errors": snap["env_errors"],
        "env_steps": snap["steps"],
        "samples_trained": trained,
        "samples_per_s": round(trained / seconds, 3) if seconds > 0 else 0.0,
        "reward_mean_by_update": [m.get("reward_mean") for m in metrics],
        "learner_idle_frac": metrics[-1].get("learner_idle_frac") if metrics else None,
        "env_utilisation": round(util, 4) if util is not None else None,
        "evaluations": coord.eval_lines,
        "steady_samples_per_s": steady,
        # faults the run survived: learner restarts (each one a new lineage epoch), the episodes the
        # learner would not train (played by weights a dead learner made after its checkpoint) and the
        # groups handed out again whole after a restart
        "learner_restarts": _learner_restarts(run_dir),
        "episodes_rejected": coord.counters["episodes.rejected_by_learner"],
        "episodes_reissued": coord.counters["episodes.reissued_version_mismatch"]
        + coord.counters["episodes.reissued_undelivered"],
        "episodes_undelivered": coord.counters["episodes.undelivered"],
        "groups_reissued": coord.counters["groups.reissued"],
        # training samples still queued when the learner completed: no update would have used them
        "episodes_not_started_by_end": coord.counters["episodes.not_started_by_end"],
        # training episodes that ended after the learner's last update (it had shut down): not trained
        "episodes_after_last_update": coord.counters["episodes.after_last_update"],
    }
    return summary, metrics


def train_end_lines(
    summary: dict[str, Any], metrics: list[dict[str, Any]], run_dir: Path, out: TextIO
) -> None:
    out.write(update_table(metrics))
    print(
        f"[train] {summary['updates']} updates (version {summary['final_version']}) in "
        f"{summary['seconds']:.1f} s · {summary['episodes']} episodes, {summary['env_steps']} env steps, "
        f"{summary['samples_trained']} samples trained ({summary['samples_per_s']}/s) · rewards by update "
        f"{summary['reward_mean_by_update']}",
        file=out,
    )
    print(f"[train] metrics: {run_dir / 'metrics.jsonl'} · summary: {run_dir / 'summary.json'}", file=out)
