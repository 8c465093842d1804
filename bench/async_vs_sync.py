"""RL mode decoupled (IMPALA-style, max staleness 1) vs `--sync` (rollout, then train), side by side in one
run: `guirl.train.run_train` in this process on configs/local_rl.toml, with the tiny Qwen3-VL (built once,
offline), the local training suite on local desktops, and an injected step delay on the acting path, so
that acting is slow next to the learner's step, as it is with real VMs. Both modes get the same seed,
tasks, batch shape (2 groups x 2), VMs (4) and number of updates; with more than one round the modes
alternate, so the machine's drift hits both alike.

The delay: by default (`--delay-via step`) `env.step_latency_s`, slept by the env worker at every step
whether the response parses or not, a wait that, like a remote VM, costs this machine no CPU. The
alternatives: `agent.sleep_after_action_s` (`--delay-via action`), paid only after an executed action (the
tiny random model's responses almost never parse as one), and the broker's `inference.max_wait_ms`
(`--delay-via broker`: with 4 VMs a batch of 8 never fills). The JSON says which was used and whether any
step paid it.

`--set cluster.learner_cpus=[1] --set cluster.rollout_cpus=[0]` pins the learner and the rollout side
(engine, env workers, desktops) to cores of their own, the CPU analogue of the split of learner and
rollout GPUs in OpenClaw-RL's GUI-RL: without it, on a small machine, overlapping them slows both.

Reports per mode: trained step samples per second of wall time (the run's summary: from the start of
`run_train`, actor start-up included; and the steady state between the first and the last update),
environment utilisation (the summary's, and this bench's own from the first episode to the last update),
the learner's idle fraction, wall seconds, updates, and actor crashes (a run with one is flagged NOT
VALID). Then the async/sync ratio and whether the issue's targets hold (async >= 1.5x sync samples/s,
async env utilisation >= 80 %). Prints a table, then one line of JSON.

    python bench/async_vs_sync.py [--quick] [--rounds N] [--delay S] [--delay-via broker|action] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the actor processes inherit it: no weight-loading progress bars between the bench's lines
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import uvloop  # noqa: E402

from guirl.config import load_config  # noqa: E402
from guirl.log import setup_logging  # noqa: E402
from guirl.model.tiny import ensure_tiny_checkpoint  # noqa: E402
from guirl.train import run_train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "local_rl.toml"
MODES = {"async": "train.sync=false", "sync": "train.sync=true"}
TARGET_RATIO = 1.5
TARGET_UTILISATION = 0.8
RUN_TIMEOUT_S = 600.0
"""A run that has not made its updates by then is stuck (a learner that cannot recover): the bench fails."""


def overrides(ckpt: str, root: Path, updates: int, delay_s: float, via: str, staleness: int) -> list[str]:
    """The settings both modes share (the mode's own `train.sync` is added per run).

    `via="action"`: the delay is `agent.sleep_after_action_s`, paid after each executed action, as a slow VM
    would charge it. `via="broker"`: it is the broker's `inference.max_wait_ms` (a partial batch waits that
    long for company, and 4 VMs never fill a batch of 8), a wait on the acting path that, like a remote VM,
    costs this machine no CPU; it is paid once per step whether the response parses or not."""
    if via == "step":
        delay = [f"env.step_latency_s={delay_s}", "agent.sleep_after_action_s=0", "inference.max_wait_ms=20"]
    elif via == "action":
        delay = [f"agent.sleep_after_action_s={delay_s}", "inference.max_wait_ms=20"]
    else:
        delay = ["agent.sleep_after_action_s=0", f"inference.max_wait_ms={delay_s * 1000:g}"]
    return [
        f"model.hf_ckpt={ckpt}",
        f"run.root_dir={root}",
        "run.seed=0",
        f"train.updates={updates}",
        f"train.max_staleness={staleness}",  # `sync` forces 0 whatever this says
        "train.checkpoint_every=0",
        "rollout.batch_size=2",  # 2 groups x 2 samples: 4 episodes per update
        "rollout.n_samples_per_prompt=2",
        "env.max_envs=4",  # one VM per episode of an update
        "env.prewarm_envs=4",
        "env.workers=1",
        "agent.max_steps=2",
        "inference.max_batch=8",  # more than the VMs: with via="broker" every batch waits max_wait_ms
        *delay,
        "logging.level=WARNING",
    ]


def steady_samples_per_s(metrics: list[dict[str, Any]]) -> float | None:
    """Samples of updates 2..N over the wall time from update 1 to update N (start-up left out)."""
    if len(metrics) < 2:
        return None
    span = metrics[-1]["time"] - metrics[0]["time"]
    return round(sum(m["samples"] for m in metrics[1:]) / span, 3) if span > 0 else None


def episode_figures(run_dir: Path, slots: int, until: float) -> dict[str, Any]:
    """From the episodes' own records: how many steps executed an action (only those pay
    `sleep_after_action_s`), outcomes, mean episode seconds, and the VM utilisation from the first
    episode's start to the last update (the summary's counts from the coordinator's start, model loading
    and desktop start-up included, and leaves out episodes still running at the end). An episode cut off
    by the run's end leaves no record, so this one is a lower bound."""
    spans, acted, outcomes = [], 0, {}
    for result in run_dir.glob("episodes/*/*/result.json"):
        r = json.loads(result.read_text())
        end = r.get("ended_at") or result.stat().st_mtime  # when the episode ended
        spans.append((end - r["seconds"], end))
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        traj = result.parent / "traj.jsonl"
        if traj.exists():
            acted += sum(1 for line in traj.read_text().splitlines() if "actions" in json.loads(line))
    if not spans:
        return {
            "acted_steps": 0,
            "outcomes": outcomes,
            "episode_s_mean": None,
            "env_utilisation_active": None,
        }
    first = min(s for s, _ in spans)
    busy = sum(max(0.0, min(e, until) - max(s, first)) for s, e in spans)
    return {
        "acted_steps": acted,
        "outcomes": outcomes,
        "episode_s_mean": round(statistics.mean(e - s for s, e in spans), 2),
        "env_utilisation_active": round(busy / (slots * (until - first)), 4) if until > first else None,
    }


class ActorExits(logging.Handler):
    """Counts the supervisor's `actor NAME exited` events: a run in which an actor crashed and was
    restarted measured the restart too, so its figures are flagged, not silently compared."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.exits: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) >= 2 and args[1] == "exited":
            self.exits[str(args[0])] = self.exits.get(str(args[0]), 0) + 1


async def timed_train(cfg: Any, out: io.StringIO, timeout_s: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(run_train(cfg, out=out), timeout_s)
    except TimeoutError:
        tail = out.getvalue()[-4000:]
        raise SystemExit(f"a run took over {timeout_s:.0f} s (stuck?); its output:\n{tail}") from None


def one_run(mode: str, shared: list[str], log: io.StringIO, timeout_s: float) -> dict[str, Any]:
    cfg = load_config(CONFIG, env={}, overrides=[*shared, MODES[mode]])
    exits = ActorExits()
    logging.getLogger("guirl.runtime.supervisor").addHandler(exits)
    t = time.perf_counter()
    try:
        summary = uvloop.run(timed_train(cfg, log, timeout_s))
    finally:
        logging.getLogger("guirl.runtime.supervisor").removeHandler(exits)
    wall = time.perf_counter() - t
    run_dir = Path(summary["run_dir"])
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = episode_figures(run_dir, cfg.env.max_envs, metrics[-1]["time"] if metrics else time.time())
    return {
        "samples_per_s": summary["samples_per_s"],
        "steady_samples_per_s": steady_samples_per_s(metrics),
        "env_utilisation": summary["env_utilisation"],
        "learner_idle_frac": summary["learner_idle_frac"],
        "wall_s": round(wall, 1),
        "updates": summary["updates"],
        "samples_trained": summary["samples_trained"],
        "episodes": summary["episodes"],
        "env_errors": summary["env_errors"],
        # where the learner's time goes, per update: waiting for a batch, training, publishing weights
        "collect_s_mean": round(statistics.mean(m["collect_s"] for m in metrics), 2) if metrics else None,
        "update_s_mean": round(statistics.mean(m["update_s"] for m in metrics), 2) if metrics else None,
        "publish_s_mean": round(statistics.mean(m["publish_s"] for m in metrics), 2) if metrics else None,
        "version_lag_mean": (
            round(statistics.mean(m["version_lag_mean"] for m in metrics), 3) if metrics else None
        ),
        **episodes,
        "actor_exits": sum(exits.exits.values()),  # crashes (each restarted); > 0 makes the run suspect
        "actor_exits_by_name": exits.exits,
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over rounds (a single round: that round's figures)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if key in ("outcomes", "actor_exits_by_name"):
            out[key] = {k: sum(r[key].get(k, 0) for r in runs) for k in {k for r in runs for k in r[key]}}
        else:
            out[key] = round(statistics.median(values), 4) if values else None
    return out


def run(
    quick: bool,
    rounds: int,
    delay_s: float,
    via: str,
    staleness: int,
    keep: bool,
    extra: list[str],
    retries: int,
) -> dict[str, Any]:
    updates = 2 if quick else 4
    setup_logging("bench", level="WARNING")
    started = time.perf_counter()
    log = io.StringIO()
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    discarded: dict[str, list[dict[str, int]]] = {m: [] for m in MODES}
    tmp = Path(tempfile.mkdtemp(prefix="guirl-bench-"))
    if keep:
        print(f"run directories kept under {tmp / 'runs'}", file=sys.stderr)
    try:
        ckpt = str(ensure_tiny_checkpoint(tmp / "tiny"))
        shared = [*overrides(ckpt, tmp / "runs", updates, delay_s, via, staleness), *extra]
        for r in range(rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))  # interleaved, alternating
            for mode in order:
                for attempt in range(retries + 1):
                    try:
                        figures = one_run(mode, shared, log, RUN_TIMEOUT_S)
                    except Exception:
                        sys.stderr.write(log.getvalue()[-4000:])
                        raise
                    print(f"round {r + 1}/{rounds} {mode}: {json.dumps(figures)}", file=sys.stderr)
                    if not figures["actor_exits"] or attempt == retries:
                        break
                    # an actor crashed mid-run (see the log): the run measured its restart; run it again
                    discarded[mode].append(figures["actor_exits_by_name"])
                results[mode].append(figures)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    figures = {m: median_of(runs) for m, runs in results.items()}
    a, s = figures["async"], figures["sync"]
    ratio = round(a["samples_per_s"] / s["samples_per_s"], 2) if s["samples_per_s"] else None
    steady = (
        round(a["steady_samples_per_s"] / s["steady_samples_per_s"], 2)
        if a["steady_samples_per_s"] and s["steady_samples_per_s"]
        else None
    )
    util = a["env_utilisation"]
    exits = a["actor_exits"] + s["actor_exits"]
    # The most overlap can give with these parts: a sync update costs rollout + learning, a decoupled one
    # at best the longer of the two (each measured in the sync run, where they do not overlap).
    rollout, learn = s["collect_s_mean"], (s["update_s_mean"] or 0) + (s["publish_s_mean"] or 0)
    bound = round((rollout + learn) / max(rollout, learn), 2) if rollout and learn else None
    return {
        "bench": "async_vs_sync",
        "setup": {
            "updates": updates,
            "rounds": rounds,
            "vm_step_delay_s": delay_s,
            "delay_via": {
                "step": "env.step_latency_s",
                "action": "agent.sleep_after_action_s",
                "broker": "inference.max_wait_ms",
            }[via],
            "max_staleness_async": staleness,
            "episodes_per_update": 4,
            "max_steps": 2,
            "vms": 4,
            "cpus": os.cpu_count(),
            "extra_settings": extra,
        },
        "async": a,
        "sync": s,
        "samples_per_s_ratio": ratio,
        "steady_samples_per_s_ratio": steady,
        "overlap_bound": bound,
        "target_ratio_met": ratio is not None and ratio >= TARGET_RATIO,
        "target_utilisation_met": util is not None and util >= TARGET_UTILISATION,
        # an actor crashed (and was restarted) during a run: its figures measured the restart too
        "valid": not exits,
        "runs_discarded_for_crashes": discarded,
        # via "action", the delay is paid only after an executed action; 0 means it was never injected
        "delay_paid": via != "action" or bool(a["acted_steps"] and s["acted_steps"]),
        "bench_wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 updates per run instead of 4 (a smoke run)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode, interleaved (default 1)")
    parser.add_argument("--delay", type=float, default=1.0, help="injected step delay, s (default 1.0)")
    parser.add_argument(
        "--delay-via",
        choices=("step", "action", "broker"),
        default="step",
        help="inject the delay at every step (env.step_latency_s, default), after each executed action "
        "(agent.sleep_after_action_s: the tiny random model's responses rarely parse, so rarely paid), or "
        "as the broker's batch wait",
    )
    parser.add_argument("--staleness", type=int, default=1, help="max staleness of the async run (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config setting for both modes"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="runs again (reported) a run in which an actor crashed and was restarted (default 2)",
    )
    args = parser.parse_args()
    result = run(
        args.quick,
        max(1, args.rounds),
        args.delay,
        args.delay_via,
        args.staleness,
        args.keep,
        args.set,
        max(0, args.retries),
    )
    rows = (
        ("samples/s (summary)", "samples_per_s"),
        ("samples/s (steady)", "steady_samples_per_s"),
        ("env utilisation", "env_utilisation"),
        ("learner idle frac", "learner_idle_frac"),
        ("wall s", "wall_s"),
        ("updates", "updates"),
        ("collect s/update", "collect_s_mean"),
        ("update s/update", "update_s_mean"),
        ("publish s/update", "publish_s_mean"),
        ("version lag", "version_lag_mean"),
        ("episode s", "episode_s_mean"),
        ("steps that acted", "acted_steps"),
        ("env util (active)", "env_utilisation_active"),
    )
    print(f"{'':>20} {'async':>10} {'sync':>10}")
    for label, key in rows:
        print(f"{label:>20} {result['async'][key]!s:>10} {result['sync'][key]!s:>10}")
    print(
        f"async/sync samples/s: {result['samples_per_s_ratio']}x (steady state "
        f"{result['steady_samples_per_s_ratio']}x) · target >= {TARGET_RATIO}x: "
        f"{'met' if result['target_ratio_met'] else 'NOT met'} · async env utilisation >= "
        f"{TARGET_UTILISATION:.0%}: {'met' if result['target_utilisation_met'] else 'NOT met'}"
    )
    print(
        f"overlap bound {result['overlap_bound']}x: (rollout + learning) / max(rollout, learning) per"
        " update, from the sync run; decoupling cannot beat it with these parts"
    )
    if not result["valid"]:
        exits = {m: result[m]["actor_exits_by_name"] for m in MODES}
        print(f"NOT VALID: actors crashed and were restarted during the runs {exits}; see the log above")
    if any(result["runs_discarded_for_crashes"].values()):
        print(f"runs run again after an actor crashed: {result['runs_discarded_for_crashes']}")
    if not result["delay_paid"]:
        print("NOT VALID: no step executed an action, so agent.sleep_after_action_s was never paid")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
