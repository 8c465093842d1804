"""The shipped suite end to end: `guirl eval --backend scripted` over all of `tasks/local/` (its test and
train lists together) playing the reference solutions in each action space — computer_use (guirl's
`/action`) and OSWorld's pyautogui (programs through `/execute`) — and once doing nothing (every script a
single `done`). Reports each pass's accuracy, the tasks off their mark (a solution under 1, or doing
nothing above 0 on a feasible task) and how long each pass took. Prints one line of JSON.

    python bench/local_suite.py [--workers N] [--vms-per-worker V] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tasks" / "local"


def whole_suite(work: Path) -> tuple[Path, dict[str, list[str]]]:
    """One meta list of every task (test and train), beside a link to the suite's examples."""
    listing: dict[str, list[str]] = {}
    for meta in ("test.json", "train.json"):
        for domain, ids in json.loads((SUITE / meta).read_text()).items():
            listing.setdefault(domain, []).extend(ids)
    (work / "examples").symlink_to(SUITE / "examples")
    (work / "all.json").write_text(json.dumps(listing))
    return work / "all.json", listing


def infeasible(listing: dict[str, list[str]]) -> set[str]:
    out = set()
    for domain, ids in listing.items():
        for task_id in ids:
            task = json.loads((SUITE / "examples" / domain / f"{task_id}.json").read_text())
            if task["evaluator"].get("func") == "infeasible":
                out.add(task_id)
    return out


def one_pass(label: str, suite: Path, work: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    runs = work / label
    cmd = [sys.executable, str(ROOT / "bin" / "guirl"), "eval", "--config", "local_eval"]
    cmd += ["--backend", "scripted", "--tasks", str(suite), "--max-steps", "30"]
    cmd += ["--workers", str(args.workers), "--vms-per-worker", str(args.vms_per_worker)]
    cmd += ["--set", f"run.root_dir={runs}", "--set", "logging.level=WARNING", *extra]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"{label}: guirl eval failed ({out.returncode}):\n{out.stderr[-3000:]}")
    (found,) = runs.glob("*/summary.json")
    summary = json.loads(found.read_text())
    scores = {r["task_id"]: r["score"] for r in summary["results"]}
    return {
        "tasks": summary["tasks"],
        "accuracy": summary["accuracy"],
        "env_errors": summary["env_errors"],
        "seconds": round(seconds, 1),
        "scores": scores,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="env workers (default 1)")
    ap.add_argument("--vms-per-worker", type=int, default=2, help="desktops per worker (default 2)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N tasks (default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="guirl-suite-") as tmp:
        work = Path(tmp)
        suite, listing = whole_suite(work)
        nothing_dir = work / "nothing"
        nothing_dir.mkdir()
        for ids in listing.values():
            for task_id in ids:
                (nothing_dir / f"{task_id}.jsonl").write_text('{"type": "done"}\n')
        passes = {
            "computer_use": one_pass("computer_use", suite, work, args, []),
            "pyautogui": one_pass("pyautogui", suite, work, args, ["--set", "env.action_space=pyautogui"]),
            "nothing": one_pass(
                "nothing", suite, work, args, ["--set", f"inference.scripted.dir={nothing_dir}"]
            ),
        }
    skip = infeasible(listing)
    off = {
        label: sorted(t for t, s in p["scores"].items() if s != (0.0 if label == "nothing" else 1.0))
        for label, p in passes.items()
    }
    for label, p in passes.items():
        print(
            f"{label:>13}: {p['tasks']} tasks, accuracy {p['accuracy']:.1%}, {p['seconds']:.0f} s",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {
                "bench": "local_suite",
                "tasks": sum(len(v) for v in listing.values()),
                "domains": sorted(listing),
                "infeasible": sorted(skip),
                "workers": args.workers,
                "vms_per_worker": args.vms_per_worker,
                "cpus": os.cpu_count(),
                **{
                    label: {k: v for k, v in p.items() if k != "scores"} | {"off": off[label]}
                    for label, p in passes.items()
                },
                "targets_met": {
                    "solutions_100_both_spaces": not off["computer_use"] and not off["pyautogui"],
                    "nothing_done_0": not off["nothing"],
                },
            }
        )
    )


if __name__ == "__main__":
    main()
