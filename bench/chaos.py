"""Chaos soak: `guirl train` runs on local desktops (tiny model) back to back, each under a new seed's fault
schedule (SIGKILL and SIGSTOP/SIGCONT of the broker, the learner, the env worker and desktops, at random
times and mid-broadcast, mid-checkpoint, mid-setup; a hostile peer sending malformed messages to every
actor throughout), until `--minutes` have passed; every run's invariants are checked
(`guirl.chaos.check_run`).

    python bench/chaos.py [--minutes 20] [--updates 8] [--faults 6] [--span 60] [--seed 1] [--prm]

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


def one_run(args: argparse.Namespace, seed: int, ckpt: str, root: Path) -> dict:
    config = "local_prm_rl.toml" if args.prm else "local_rl.toml"
    cmd = [
        sys.executable,
        str(ROOT / "bin" / "guirl"),
        "train",
        "--config",
        str(ROOT / "configs" / config),
        "--ckpt",
        ckpt,
        "--updates",
        str(args.updates),
        "--max-steps",
        "2",
        "--set",
        f"run.root_dir={root}",
        "--set",
        "train.checkpoint_every=2",
        "--set",
        f"train.chaos_seed={seed}",
        "--set",
        f"train.chaos_faults={args.faults}",
        "--set",
        f"train.chaos_span_s={args.span}",
        "--set",
        "supervisor.max_restarts=20",
    ]
    if args.prm:
        cmd += ["--set", f"model.prm_model_path={ckpt}"]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    seconds = time.monotonic() - started
    runs = [p for p in root.iterdir() if p.is_dir()]
    if out.returncode != 0 or len(runs) != 1:
        return {
            "seed": seed,
            "seconds": round(seconds, 1),
            "violations": [f"guirl train exited {out.returncode}: {out.stderr[-500:]}"],
        }
    run_dir = runs[0]
    report = check_run(run_dir, updates=args.updates, max_gap_s=args.gap_bound)
    schedule = "\n".join(x for x in out.stdout.splitlines() if "chaos seed" in x or x.startswith("  +"))
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    faults = Counter()
    for line in (run_dir / "chaos.jsonl").read_text().splitlines():
        f = json.loads(line)
        if f["done"].startswith("not injected"):
            faults["not_injected"] += 1
            continue
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
        "seconds": round(seconds, 1),
        "run_dir": str(run_dir),
        "schedule": schedule,
        "violations": report["violations"],
        "faults": dict(faults),
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
    p.add_argument("--gap-bound", type=float, default=60.0, help="longest gap without an env step allowed")
    p.add_argument("--prm", action="store_true", help="PRM+RL runs (the tiny model as the judge too)")
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
            f"seed {seed}: {r['seconds']} s, faults {r.get('faults')}, max gap {r.get('max_gap_s')} s, "
            f"violations {len(r['violations'])}",
            flush=True,
        )
        for v in r["violations"]:
            print(f"  VIOLATION (seed {seed}): {v}", flush=True)
        seed += 1
    gaps = sorted(r["max_gap_s"] for r in results if "max_gap_s" in r)
    faults: Counter = Counter()
    dropped: Counter = Counter()
    for r in results:
        faults.update(r.get("faults", {}))
        dropped.update(r.get("dropped", {}))
    violations = [f"seed {r['seed']}: {v}" for r in results for v in r["violations"]]
    line = {
        "bench": "chaos",
        "mode": "prm_rl" if args.prm else "rl",
        "minutes": round(sum(r["seconds"] for r in results) / 60, 1),
        "runs": len(results),
        "seeds": [r["seed"] for r in results],
        "faults_by_kind": dict(sorted(faults.items())),
        "faults": sum(faults.values()),
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
