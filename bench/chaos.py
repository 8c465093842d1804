"""Chaos soak: runs on local desktops back to back — RL (the tiny model), PRM+RL (the tiny model as policy and
judge) and eval (the scripted reference solutions), in turn by seed (`--mode mixed`) or one kind — each under
a new seed's fault schedule (SIGKILL and SIGSTOP/SIGCONT of the broker, the learner, the env worker, the PRM
and desktops, at random times and mid-broadcast, mid-checkpoint, mid-setup, mid-judging; a hostile peer
sending malformed messages to every actor throughout), until `--minutes` have passed; every run's invariants
are checked (`guirl.chaos.check_run`; an eval run's accuracy must stay 100 %).

    python bench/chaos.py [--minutes 20] [--updates 8] [--faults 6] [--span 60] [--seed 1] [--mode mixed]

Prints one line per run, then one line of JSON: runs, faults injected by kind, stalls (the longest gap
without an env step, max and p99 over runs), episodes re-issued, samples dropped by reason, and invariant
violations (must be 0; each one is listed with the seed that reproduces it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from guirl.chaos import check_run  # noqa: E402
from guirl.config.schema import ENV_VARS  # noqa: E402

MODES = ("rl", "prm", "eval")


def mode_of(args: argparse.Namespace, seed: int) -> str:
    """The run's mode: `--mode`, or with `mixed` one of rl, prm+rl and scripted eval by seed."""
    return MODES[seed % len(MODES)] if args.mode == "mixed" else args.mode


EVAL_SPAN_S = 15.0
"""The longest span of an eval run's faults: the scripted suite takes ~25 s unfaulted, and a fault due after
the run has ended is never injected."""


def command(args: argparse.Namespace, mode: str, seed: int, ckpt: str, root: Path) -> list[str]:
    """The `guirl` command of one chaos run (what a failing seed's report says to run again)."""
    span = min(args.span, EVAL_SPAN_S) if mode == "eval" else args.span
    chaos = [
        *("--set", f"chaos.seed={seed}", "--set", f"chaos.faults={args.faults}"),
        *("--set", f"chaos.span_s={span}", "--set", "supervisor.max_restarts=20"),
        *("--set", f"run.root_dir={root}"),
    ]
    if mode == "eval":  # the reference solutions: accuracy is 100 % whatever the faults
        config = ROOT / "configs" / "local_eval.toml"
        return [
            *(sys.executable, str(ROOT / "bin" / "guirl"), "eval", "--config", str(config)),
            *("--backend", "scripted", "--max-steps", "15", "--set", "eval.max_attempts=6", *chaos),
            # the light applications' tasks (the faults are what is tested, not the suite)
            *("--domain", "terminal", "--domain", "text_editor", "--domain", "spreadsheet"),
        ]
    config = ROOT / "configs" / ("local_prm_rl.toml" if mode == "prm" else "local_rl.toml")
    cmd = [
        *(sys.executable, str(ROOT / "bin" / "guirl"), "train", "--config", str(config), "--ckpt", ckpt),
        *("--updates", str(args.updates), "--max-steps", "2", "--set", "train.checkpoint_every=2", *chaos),
    ]
    if mode == "prm":
        cmd += ["--set", f"model.prm_model_path={ckpt}"]
    if getattr(args, "eval_every", 0):  # periodic evaluations: faults also strike mid-evaluation
        cmd += ["--set", f"train.eval_every={args.eval_every}"]
    return cmd


def one_run(args: argparse.Namespace, seed: int, ckpt: str, root: Path) -> dict:
    mode = mode_of(args, seed)
    cmd = command(args, mode, seed, ckpt, root)
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    seconds = time.monotonic() - started
    runs = [p for p in root.iterdir() if p.is_dir()]
    if out.returncode != 0 or len(runs) != 1:
        return {
            "seed": seed,
            "mode": mode,
            "seconds": round(seconds, 1),
            "violations": [f"guirl {cmd[3]} exited {out.returncode}: {out.stderr[-500:]}"],
        }
    run_dir = runs[0]
    report = check_run(run_dir, updates=None if mode == "eval" else args.updates, max_gap_s=args.gap_bound)
    schedule = "\n".join(x for x in out.stdout.splitlines() if "chaos seed" in x or x.startswith("  +"))
    summary = json.loads((run_dir / "summary.json").read_text())
    if mode == "eval" and (summary.get("accuracy") != 1.0 or summary.get("aborted")):
        report["violations"].append(
            f"the reference solutions scored {summary.get('accuracy')} with {summary.get('aborted')} task(s) "
            "aborted under the faults (100 % and none without them)"
        )
    metrics_file = run_dir / "metrics.jsonl"
    metrics = [json.loads(x) for x in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    faults = Counter()
    moments = Counter()  # faults that struck at the moment they waited for (mid-broadcast, ...)
    for line in (run_dir / "chaos.jsonl").read_text().splitlines():
        f = json.loads(line)
        if f["done"].startswith("not injected"):
            faults["not_injected"] += 1
            continue
        if f["on_moment"] and f["moment"] != "any":
            moments[f["moment"]] += 1
        faults[f"{f['kind']}.{'worker' if f['target'].startswith('worker') else f['target']}"] += 1
    dropped = Counter(
        {
            "stale_steps": sum(m.get("stale_steps_dropped", 0) for m in metrics),
            "version_mismatch_episodes": summary.get("episodes_rejected", 0),
        }
    )
    last_by_epoch: dict[int, dict] = {}  # the buffer's counts are per learner process: each epoch's last
    for m in metrics:
        last_by_epoch[m.get("epoch", 0)] = m
    for m in last_by_epoch.values():
        for key in ("steps.ahead_dropped", "groups.partial_dropped", "trajectories.late", "groups.all_stale"):
            dropped[key.replace(".", "_")] += m.get(f"buffer.{key}", 0)
    return {
        "seed": seed,
        "mode": mode,
        "seconds": round(seconds, 1),
        "run_dir": str(run_dir),
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
        "schedule": schedule,
        "violations": report["violations"],
        "faults": dict(faults),
        "moments": dict(moments),
        "max_gap_s": report["max_gap_s"],
        "episodes": report["episodes"],
        "episodes_reissued": summary.get("episodes_reissued", 0) + summary.get("groups_reissued", 0),
        "learner_restarts": summary.get("learner_restarts", 0),
        "dropped": dict(dropped),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--updates", type=int, default=8)
    p.add_argument("--faults", type=int, default=6)
    p.add_argument("--span", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1, help="the first run's seed (then +1 per run)")
    p.add_argument("--eval-every", type=int, default=4, help="train runs evaluate every N updates (0: never)")
    p.add_argument("--gap-bound", type=float, default=60.0, help="longest gap without an env step allowed")
    p.add_argument(
        "--mode",
        choices=[*MODES, "mixed"],
        default="mixed",
        help="rl (tiny model), prm (PRM+RL, the tiny model as the judge too), eval (the scripted reference "
        "solutions), or mixed: the three in turn, by seed",
    )
    args = p.parse_args()
    from guirl.model.tiny import ensure_tiny_checkpoint

    work = Path(tempfile.mkdtemp(prefix="guirl-chaos-"))
    ckpt = str(ensure_tiny_checkpoint(work / "tiny"))
    deadline = time.monotonic() + args.minutes * 60
    results = []
    seed = args.seed
    while not results or time.monotonic() < deadline:
        root = work / f"seed{seed}"
        root.mkdir()
        r = one_run(args, seed, ckpt, root)
        results.append(r)
        print(
            f"seed {seed} ({r['mode']}): {r['seconds']} s, faults {r.get('faults')}, "
            f"max gap {r.get('max_gap_s')} s, "
            f"violations {len(r['violations'])}",
            flush=True,
        )
        for v in r["violations"]:
            print(f"  VIOLATION (seed {seed}): {v}", flush=True)
        seed += 1
    gaps = sorted(r["max_gap_s"] for r in results if "max_gap_s" in r)
    faults: Counter = Counter()
    dropped: Counter = Counter()
    moments: Counter = Counter()
    for r in results:
        faults.update(r.get("faults", {}))
        moments.update(r.get("moments", {}))
        dropped.update(r.get("dropped", {}))
    violations = [f"seed {r['seed']}: {v}" for r in results for v in r["violations"]]
    line = {
        "bench": "chaos",
        "mode": args.mode,
        "runs_by_mode": dict(Counter(r["mode"] for r in results)),
        "minutes": round(sum(r["seconds"] for r in results) / 60, 1),
        "runs": len(results),
        "seeds": [r["seed"] for r in results],
        "faults_by_kind": dict(sorted(faults.items())),
        "faults": sum(faults.values()),
        "faults_on_moment": dict(sorted(moments.items())),
        "stall_max_s": gaps[-1] if gaps else None,
        "stall_p99_s": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else None,
        "gap_bound_s": args.gap_bound,
        "episodes": sum(r.get("episodes", 0) for r in results),
        "episodes_reissued": sum(r.get("episodes_reissued", 0) for r in results),
        "learner_restarts": sum(r.get("learner_restarts", 0) for r in results),
        "samples_dropped": dict(sorted(dropped.items())),
        "invariant_violations": len(violations),
        "violations": violations[:20],
    }
    print(json.dumps(line))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
