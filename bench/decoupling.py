"""Decoupling measured where it matters: the decoupled layout (IMPALA-style, `max_staleness` >= 1) against
`--sync` (a batch is played, then trained on, while the desktops wait), with a learner whose update takes
as long as the rollout's, or longer, as it does with GUI-RL's model on GPUs.

`bench/async_vs_sync.py` cannot show the gain here: with the tiny model on 2 cores the update is a quarter
of the rollout, so even a perfect overlap gives 1.25x. This bench takes GUI-RL's layout (64 desktops, 8
tasks x 8 samples per update, 30-step episodes) scaled down in time: each run is one `guirl train` (this
checkout's `bin/guirl`, a subprocess: the real coordinator, broker, learner and env-worker processes) on
configs/local_rl.toml with

- replayed desktops (`env.provider = "replay"`): a synthetic recording of `--steps`-step episodes on
  `--screen` desktop-like screens, each step taking `--period` minus `--engine-s` on the desktop;
- the scripted backend as a latency model (`--engine-s` per request, streamed), answering with token ids
  (`inference.scripted.tokens`), so trajectories reach the learner as a model's would;
- a simulated learner (`train.simulated_update_s`): the real intake, GRPO groups, staleness checks,
  advantages, versions and publishing, around an update that takes U seconds.

The rollout time of one batch is R = steps x period (every desktop plays one episode of the batch), and U is
`--factors` times R: 0.25x, 1x and 2x by default. For each factor the two modes run side by side (their order
alternating); each reports its steady time per update (from the first update to the last, start-up left
out). Then per factor:

- the measured gain, sync time per update / async time per update;
- the overlap bound, (R + U) / max(R, U), with R and U as measured in the sync run (its wait for a batch and
  its update plus publish): a decoupled update costs at best the longer of the two;
- the model of docs/scale.md ("Decoupling, on paper"): async time per update max(E, U + P), where E is the
  mean episode time measured in the async run (desktops never wait, so a batch of one episode per desktop
  takes one episode's time) and P the part of publishing the update waits for; sync time per update R + U;
- the fraction of the bound and of the model reached (target: >= 90 % of the bound), and the steps the
  learner dropped for staleness in the async run (target: none at `--staleness` >= 2).

Prints a table, then one line of JSON.

    python bench/decoupling.py [--factors 0.25,1,2] [--desktops 64] [--tasks 8] [--samples 8] [--steps 30]
        [--period 0.5] [--engine-s 0.1] [--updates 4] [--staleness 2] [--screen 1280x800] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.replayed import numbers, replayed_settings, run_guirl, scratch, screen  # noqa: E402
from guirl.testing.recording import write_recording  # noqa: E402

CONFIG = ROOT / "configs" / "local_rl.toml"
TARGET_FRACTION = 0.9


def settings(args: argparse.Namespace, rec: dict, root: Path, update_s: float, sync: bool) -> list[str]:
    return [
        f"run.root_dir={root}",
        f"train.sync={'true' if sync else 'false'}",
        f"train.tasks={rec['suite']}",
        "train.domains=[]",
        f"train.updates={args.updates}",
        f"train.simulated_update_s={update_s}",
        f"train.max_staleness={args.staleness}",  # `sync` makes it 0
        "train.checkpoint_every=0",
        f"rollout.batch_size={args.tasks}",
        f"rollout.n_samples_per_prompt={args.samples}",
        "inference.scripted.tokens=true",
        f"agent.max_steps={args.steps + 2}",
        *replayed_settings(args, args.desktops, max(1, -(-args.desktops // 128)), rec),
    ]


def one_run(args: argparse.Namespace, rec: dict, root: Path, update_s: float, sync: bool) -> dict[str, Any]:
    code, out, _, _ = run_guirl("train", CONFIG, settings(args, rec, root, update_s, sync), args.timeout)
    if code is None:
        return {"valid": False, "error": f"did not finish within {args.timeout:.0f} s"}
    found = list(root.glob("*/summary.json"))
    if code != 0 or len(found) != 1:
        return {"valid": False, "error": f"exit {code}: {out[-1500:]}"}
    run_dir = found[0].parent
    summary = json.loads(found[0].read_text())
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if len(metrics) < 2:
        return {"valid": False, "error": "fewer than 2 updates: no steady state to measure"}
    later, last = metrics[1:], metrics[-1]  # the first update waited for start-up and the first batch
    episodes = [json.loads(p.read_text()) for p in run_dir.glob("episodes/*/*/result.json")]
    seconds = [e["seconds"] for e in episodes if e.get("status") == "completed" and e.get("seconds")]
    received = last.get("trajectories_received", 0)
    mb = last.get("trajectories_bytes", 0) / received / 2**20 if received else None
    return {
        "valid": summary["env_errors"] == 0 and not summary.get("learner_restarts"),
        "updates": len(metrics),
        "per_update_s": round((last["time"] - metrics[0]["time"]) / (len(metrics) - 1), 3),
        "collect_s": round(statistics.mean(m["collect_s"] for m in later), 3),
        "update_s": round(statistics.mean(m["update_s"] for m in later), 3),
        "publish_s": round(statistics.mean(m["publish_s"] for m in later), 3),
        "episode_s": round(statistics.mean(seconds), 3) if seconds else None,
        "env_utilisation": summary.get("env_utilisation"),
        "learner_idle_frac": summary.get("learner_idle_frac"),
        # the buffer's own count: a batch that was all stale makes no metrics line of its own
        "stale_steps_dropped": last.get("buffer.steps.stale_dropped", 0),
        "version_lag_max": max(m["version_lag_max"] for m in metrics),
        "mb_per_trajectory": round(mb, 3) if mb is not None else None,
        "samples_trained": summary.get("samples_trained"),
        "env_errors": summary["env_errors"],
    }


def compare(a: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """The gain, the overlap bound and the model (see the module docstring) of one factor's two runs."""
    if not (a.get("valid") and s.get("valid")):
        return {"valid": False}
    rollout, learn = s["collect_s"], s["update_s"] + s["publish_s"]
    bound = (rollout + learn) / max(rollout, learn)
    gain = s["per_update_s"] / a["per_update_s"]
    model_async = max(a["episode_s"] or rollout, a["update_s"] + a["publish_s"])
    model = (rollout + learn) / model_async
    return {
        "valid": True,
        "gain": round(gain, 3),
        "overlap_bound": round(bound, 3),
        "fraction_of_bound": round(gain / bound, 3),
        "model_gain": round(model, 3),
        "fraction_of_model": round(gain / model, 3),
        "stale_steps_dropped": a["stale_steps_dropped"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--factors",
        type=lambda text: numbers(text, float),
        default=[0.25, 1.0, 2.0],
        help="update time / rollout time",
    )
    ap.add_argument("--desktops", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=8, help="GRPO groups per update")
    ap.add_argument("--samples", type=int, default=8, help="episodes per group")
    ap.add_argument("--steps", type=int, default=30, help="steps per episode")
    ap.add_argument("--period", type=float, default=0.5, help="a desktop's seconds per step")
    ap.add_argument("--engine-s", type=float, default=0.1, help="the engine's seconds per request")
    ap.add_argument(
        "--jitter", type=float, default=0.2, help="engine and desktop times vary by this either side"
    )
    ap.add_argument("--updates", type=int, default=4, help="updates per run (the first is start-up)")
    ap.add_argument("--staleness", type=int, default=2, help="train.max_staleness of the decoupled runs")
    ap.add_argument("--screen", type=screen, default=(1280, 800))
    ap.add_argument(
        "--max-pixels",
        type=int,
        default=16 * 16 * 4 * 12800,
        help="agent.max_pixels (Qwen3-VL's default: a 1280x800 screen is shown as it is, not resampled)",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--keep", action="store_true", help="keep the recording and the runs")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides")
    args = ap.parse_args(argv)
    if not 0 < args.engine_s < args.period:
        ap.error("--engine-s must be above 0 and below --period")
    if args.updates < 3:
        ap.error("--updates must be at least 3 (the first is start-up)")
    if min(args.steps, args.desktops, args.tasks, args.samples) < 1:
        ap.error("--steps, --desktops, --tasks and --samples must be at least 1")
    rollout_s = args.steps * args.period
    started = time.monotonic()
    with scratch("guirl-decoupling-", keep=args.keep) as tmp:
        rec = write_recording(
            tmp / "recording",
            tasks=args.tasks * (args.updates + 2),
            steps=args.steps,
            size=args.screen,
            distinct_screens=args.steps,  # each step a new screen: trajectories carry one per step
        )
        rec["root"] = str(tmp / "recording")
        points = []
        for i, factor in enumerate(args.factors):
            update_s = round(factor * rollout_s, 3)
            runs = {}
            for sync in (False, True) if i % 2 == 0 else (True, False):  # alternating: drift hits both
                mode = "sync" if sync else "async"
                runs[mode] = one_run(args, rec, tmp / f"f{factor}-{mode}", update_s, sync)
            point = {"factor": factor, "update_s": update_s, **runs, **compare(runs["async"], runs["sync"])}
            points.append(point)
            print(
                f"U = {factor:g} x R ({update_s:g} s)  per update async "
                f"{runs['async'].get('per_update_s', '-')} s / sync {runs['sync'].get('per_update_s', '-')} s"
                f"  gain {point.get('gain', '-')}  bound "
                f"{point.get('overlap_bound', '-')}  ({point.get('fraction_of_bound', '-')} of it)  model "
                f"{point.get('model_gain', '-')}  stale drops {point.get('stale_steps_dropped', '-')}",
                flush=True,
            )
        result = {
            "bench": "decoupling",
            "desktops": args.desktops,
            "batch": f"{args.tasks} x {args.samples}",
            "steps": args.steps,
            "period_s": args.period,
            "engine_s": args.engine_s,
            "rollout_s_nominal": round(rollout_s, 3),
            "staleness": args.staleness,
            "screen": f"{args.screen[0]}x{args.screen[1]}",
            "cores": os.cpu_count(),
            "points": points,
            "target": {
                "fraction_of_bound": TARGET_FRACTION,
                "met": all(
                    p.get("valid")
                    and p["fraction_of_bound"] >= TARGET_FRACTION
                    and not p["stale_steps_dropped"]
                    for p in points
                ),
            },
            "bench_wall_s": round(time.monotonic() - started, 1),
        }
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
