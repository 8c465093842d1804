"""PRM+RL with a judge that takes a fixed time per call: env-worker steps/s with the PRM on against off,
side by side in one run (issue 6: judging is hidden behind acting when on/off >= 0.9x).

`guirl.train.run_train` runs in this process on configs/local_prm_rl.toml with the tiny Qwen3-VL (built
once, offline), the local training suite on local desktops, and the scripted judge (`prm.backend =
"scripted"`: every judge call takes `prm.scripted.latency_s`, whatever its batch). Each env step costs
`env.step_latency_s` more, a wait that, like a remote VM, costs this machine no CPU. Three setups, with the
same seed, tasks, batch shape (2 groups x 2), VMs and number of updates:

- `on`: PRM on (`train.advantage = "step_wise"`), the judge at `--judge-latency` s per call, `--votes` votes
  per step, `prm.max_concurrency` steps judged at once (32, the default; the judge's one engine takes
  `prm.max_batch` = 8 requests per call, so it judges up to 8 / votes steps per `--judge-latency`);
- `off`: the same config with `prm.enabled = false` and `train.advantage = "grpo"`;
- `slow` (once, after the rounds; `--no-slow` skips it): a judge that cannot keep up (`--slow-latency` s per
  call, one step judged at a time), with `prm.score_timeout_s = --slow-timeout`: its queue grows, and the
  learner waits that long for the steps still unscored, which it then marks missing (never invented).
  Acting goes on meanwhile, but only as far as the staleness bound lets it: a learner that holds each batch
  `--slow-timeout` s past its last episode publishes versions later, so the coordinator admits episodes
  later (`--set train.max_staleness=N` gives the VMs that much more headroom).

The on and off runs alternate (on, off, off, on, ...: `--repeat` rounds) so that the machine's drift hits
both alike; the figures are the medians over rounds. By default the learner gets a core of its own and the
rollout side (broker, env workers with their desktops, the PRM) the others, as learner GPUs are apart from
rollout GPUs in production; `--shared-cores` drops that, and then on a small machine the learner (slowed
by the broker's inference on the same cores) sets the pace, so the time it waits for scores is on the
critical path and env steps/s measures the learner as much as acting.

The measure, env-worker steps/s in the steady state: every step an env worker plays writes the screen the
policy sees (`step_NNN.png`) as it starts, after the step's latency; the steps started between the first
update and the last one (metrics.jsonl's `time`), over that span. Start-up (model loading, desktops
starting, the first batch) is left out, and so is shutdown; what stays is acting while the learner trains
and, with the PRM on, while the judge judges and the learner holds trajectories for their scores. If
judging were on the critical path (a learner waiting for scores long enough that the staleness bound holds
back new episodes; a worker blocked sending transitions; the PRM's CPU work starving acting), this is
where it shows. The tiny random policy's answers almost never parse, so an episode is one step and a VM
spends most of an episode in its reset and the task's setup: env steps/s here counts episodes as much as
steps. Also reported: the summary's whole-run steps/s (`env_steps / seconds`, start-up included), how busy
the VMs were in the steady span (below 1: waiting for the staleness bound), the learner's wait per update
(`collect_s`), from the PRM runs' metrics.jsonl the judge's figures (mean latency, queue wait, deepest
queue, steps scored / missing), and, for contention, the CPU seconds each actor (with the processes it
started: the desktops are their worker's) used in the steady span and how busy the machine was, sampled
from /proc. Prints a table, then one line of JSON.

    python bench/prm_overlap.py [--updates 5] [--vms 4] [--step-latency 0.5] [--judge-latency 1.0]
        [--votes 2] [--repeat 2] [--slow-latency 4.0] [--slow-timeout 8] [--no-slow] [--shared-cores]
        [--keep] [--set KEY=VALUE ...]
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

from bench.sampling import Sampler, proc_table  # noqa: E402
from guirl.config import load_config  # noqa: E402
from guirl.log import setup_logging  # noqa: E402
from guirl.model.tiny import ensure_tiny_checkpoint  # noqa: E402
from guirl.train import run_train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "local_prm_rl.toml"
TARGET_RATIO = 0.9
RUN_TIMEOUT_S = 600.0
"""A run that has not made its updates by then is stuck: the bench fails."""
FOREIGN_MAX = 0.1
"""Cores' worth of other processes' CPU in a run's steady span above which the bench says it was noisy."""
CPU_SAMPLE_S = 0.5
"""How often the CPU sampler reads /proc."""
TICK = os.sysconf("SC_CLK_TCK")


def shared_settings(ckpt: str, root: Path, args: argparse.Namespace) -> list[str]:
    """The settings every run shares (each setup adds its own PRM settings)."""
    return [
        f"model.hf_ckpt={ckpt}",
        f"run.root_dir={root}",
        "run.seed=0",
        f"train.tasks={ROOT / 'tasks' / 'local' / 'train.json'}",
        f"train.updates={args.updates}",
        "train.checkpoint_every=0",
        "rollout.batch_size=2",  # 2 groups x 2 samples: 4 episodes per update
        "rollout.n_samples_per_prompt=2",
        f"env.max_envs={args.vms}",
        f"env.prewarm_envs={args.vms}",
        f"env.step_latency_s={args.step_latency}",
        "env.workers=1",
        "inference.max_wait_ms=20",
        "wandb.mode=disabled",
        "logging.level=WARNING",
        "prm.backend=scripted",
        f"prm.votes={args.votes}",
        *pinning(args.shared_cores),
    ]


def pinning(shared: bool) -> list[str]:
    """The learner on the last core, the rollout side (broker, env workers and their desktops, the PRM) on
    the others: the CPU analogue of learner GPUs apart from rollout GPUs, as in production. Shared cores
    (`--shared-cores`) make this machine's learner the bottleneck: its update, slowed by the broker's
    inference on the same cores, then sets the pace at which the staleness bound lets episodes start."""
    cores = sorted(os.sched_getaffinity(0))
    if shared or len(cores) < 2:
        return []
    rollout = ",".join(str(c) for c in cores[:-1])
    return [f"cluster.learner_cpus=[{cores[-1]}]", f"cluster.rollout_cpus=[{rollout}]"]


def setups(args: argparse.Namespace) -> dict[str, list[str]]:
    return {
        "on": [f"prm.scripted.latency_s={args.judge_latency}", "prm.score_timeout_s=60"],
        "off": ["prm.enabled=false", "train.advantage=grpo"],
        "slow": [
            f"prm.scripted.latency_s={args.slow_latency}",
            "prm.max_concurrency=1",
            f"prm.score_timeout_s={args.slow_timeout}",
        ],
    }


class ActorWatch(logging.Handler):
    """The supervisor's events: each actor's pid (`actor NAME started (pid N)`, logged at INFO, kept out of
    the bench's output) for the CPU sampler, and `exited` (a crash, then a restart: the run measured the
    restart too, so it is flagged, not silently compared). Warnings still reach the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.pids: dict[int, str] = {}
        self.exits: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) >= 3 and args[1] in ("started", "restarted") and str(args[2]).startswith("pid "):
            self.pids[int(str(args[2]).split(",")[0].split()[1])] = str(args[0])
        if len(args) >= 2 and args[1] == "exited":
            self.exits[str(args[0])] = self.exits.get(str(args[0]), 0) + 1
        if record.levelno >= logging.WARNING:
            logging.getLogger().handle(record)


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuSampler(Sampler):
    """Samples every CPU_SAMPLE_S the CPU ticks of every process, each under the actor whose process tree
    it is in (the desktops are their env worker's; this process is the coordinator's), or
    `other:<name>` (not this run's: other users of the machine, kernel threads), and the machine's busy
    ticks; `between` reads a span's share afterwards. A thread: the actors are gone when `run_train`
    returns. Per process, so that a desktop that exits (every VM reset) does not take its CPU time out of
    its worker's sum; what a process used after its last sample is lost, and shows as `unattributed`."""

    period_s = CPU_SAMPLE_S

    def __init__(self, watch: ActorWatch) -> None:
        super().__init__()
        self.watch = watch
        self.samples: list[tuple[float, dict[int, tuple[str, int]], tuple[int, int]]] = []
        self._owner: dict[int, str] = {}  # once a process is an actor's, it stays so (a desktop can outlive
        # its parent)

    def sample(self) -> None:
        me, owner = os.getpid(), self._owner
        table = proc_table()
        owner.update({me: "coordinator", **self.watch.pids})
        seen: dict[int, tuple[str, int]] = {}
        for pid, (_, ticks, _, name) in table.items():
            chain, p = [], pid
            while p not in owner and p in table and len(chain) < 64:  # up the tree to an actor (or not)
                chain.append(p)
                p = table[p].ppid
            # this process's children other than the actors (multiprocessing's helpers) are "other"
            if p in owner and (pid == p or p != me):
                owner.update(dict.fromkeys(chain, owner[p]))
                seen[pid] = (owner[p], ticks)
            else:
                seen[pid] = (f"other:{name}", ticks)
        self.samples.append((time.time(), seen, _machine_ticks()))

    def between(self, start: float, end: float) -> dict[str, Any]:
        """CPU seconds per actor (and `unattributed`) and the machine's busy fraction over [start, end],
        from the samples nearest inside it."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {"cpu_s": {}, "cpu_span_s": None, "foreign_cores": None, "machine_busy": None}
        first, last, used = inside[0][1], {}, {}
        for _, seen, _ in inside:
            last.update(seen)  # each process at its last sample in the span (those that exited included)
        for pid, (who, ticks) in last.items():
            base = first[pid][1] if pid in first else 0  # started within the span: from zero
            used[who] = used.get(who, 0) + max(0, ticks - base)
        (t0, _, m0), (t1, _, m1) = inside[0], inside[-1]
        busy_s = (m1[0] - m0[0]) / TICK
        cpu = {k: round(v / TICK, 1) for k, v in sorted(used.items()) if v / TICK >= 0.1}
        cpu["unattributed"] = round(busy_s - sum(used.values()) / TICK, 1)
        foreign = sum(v for k, v in used.items() if k.startswith("other:")) / TICK
        return {
            "cpu_s": cpu,
            "cpu_span_s": round(t1 - t0, 1),
            # cores' worth of CPU that was not this run's (other users of the machine): figures are suspect
            "foreign_cores": round(foreign / (t1 - t0), 2),
            "machine_busy": round((m1[0] - m0[0]) / (m1[1] - m0[1]), 3) if m1[1] > m0[1] else None,
        }


def step_starts(run_dir: Path) -> list[float]:
    """When each step the env workers played started (its screenshot is written then), wall time."""
    return sorted(p.stat().st_mtime for p in run_dir.glob("episodes/*/*/step_*.png"))


def vm_busy(run_dir: Path, vms: int, start: float, end: float) -> float | None:
    """The share of VM time in [start, end] spent in episodes, from their records (result.json's
    `ended_at` and `seconds`). Below 1, VMs waited: for the coordinator to
    admit an episode (the staleness bound) or to be reset. An episode cut off by the run's end leaves no
    record, so this is a lower bound near the end."""
    busy = 0.0
    for result in run_dir.glob("episodes/*/*/result.json"):
        r = json.loads(result.read_text())
        ended = r.get("ended_at") or result.stat().st_mtime
        began = ended - r["seconds"]
        busy += max(0.0, min(ended, end) - max(began, start))
    return round(busy / (vms * (end - start)), 3) if end > start else None


def prm_figures(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The PRM's figures over the run's updates (metrics.jsonl of a run with the PRM on)."""
    if not any("prm.steps_scored" in m for m in metrics):
        return {}
    judged = [m for m in metrics if m.get("prm.steps_scored")]  # the judge's stats: updates it scored in
    return {
        "judge_latency_mean_s": round(statistics.mean(m["prm.judge_latency_mean_s"] for m in judged), 3)
        if judged
        else None,
        "judge_latency_max_s": max(m.get("prm.judge_latency_max_s", 0) for m in metrics),
        "queue_s_mean": round(statistics.mean(m.get("prm.queue_s_mean", 0) for m in judged), 3)
        if judged
        else None,
        "queue_depth_max": max(m.get("prm.queue_depth_max", 0) for m in metrics),
        # the trained steps by what became of their score (metrics.jsonl's prm.steps_*)
        **{
            f"steps_{k}": sum(m.get(f"prm.steps_{k}", 0) for m in metrics)
            for k in ("scored", "missing", "invalid", "error", "dropped")
        },
    }


async def timed_train(cfg: Any, out: io.StringIO, timeout_s: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(run_train(cfg, out=out), timeout_s)
    except TimeoutError:
        tail = out.getvalue()[-4000:]
        raise SystemExit(f"a run took over {timeout_s:.0f} s (stuck?); its output:\n{tail}") from None


def one_run(settings: list[str], log: io.StringIO) -> dict[str, Any]:
    cfg = load_config(CONFIG, env={}, overrides=settings)
    watch = ActorWatch()
    sup_log = logging.getLogger("guirl.runtime.supervisor")
    sup_log.addHandler(watch)
    sup_log.setLevel(logging.INFO)
    sup_log.propagate = False  # its INFO lines feed the watch; warnings are passed on by it
    t = time.perf_counter()
    try:
        with CpuSampler(watch) as cpu:
            summary = uvloop.run(timed_train(cfg, log, RUN_TIMEOUT_S))
    finally:
        sup_log.removeHandler(watch)
        sup_log.setLevel(logging.NOTSET)
        sup_log.propagate = True
    wall = time.perf_counter() - t
    run_dir = Path(summary["run_dir"])
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = step_starts(run_dir)
    first_update, last_update = (metrics[0]["time"], metrics[-1]["time"]) if metrics else (0.0, 0.0)
    span = last_update - first_update
    steady = sum(1 for s in starts if first_update <= s < last_update)
    active = last_update - starts[0] if starts and metrics else 0.0
    return {
        "steady_steps_per_s": round(steady / span, 3) if span > 0 else None,
        "steady_steps": steady,
        "steady_span_s": round(span, 1),
        # from the first step to the last update: the ramp-up of the first batch included
        "active_steps_per_s": round(sum(1 for s in starts if s < last_update) / active, 3)
        if active > 0
        else None,
        "run_steps_per_s": round(summary["env_steps"] / summary["seconds"], 3)
        if summary["seconds"]
        else None,
        "env_steps": summary["env_steps"],
        "episodes": summary["episodes"],
        "steps_per_episode": round(summary["env_steps"] / summary["episodes"], 2)
        if summary["episodes"]
        else None,
        "env_errors": summary["env_errors"],
        "env_utilisation": summary["env_utilisation"],
        "vm_busy_steady": vm_busy(run_dir, cfg.env.max_envs, first_update, last_update),
        "learner_idle_frac": summary["learner_idle_frac"],
        "updates": summary["updates"],
        "collect_s_mean": round(statistics.mean(m["collect_s"] for m in metrics), 2) if metrics else None,
        "update_s_mean": round(statistics.mean(m["update_s"] for m in metrics), 2) if metrics else None,
        "version_lag_mean": (
            round(statistics.mean(m["version_lag_mean"] for m in metrics), 3) if metrics else None
        ),
        "seconds": summary["seconds"],
        "wall_s": round(wall, 1),
        "prm": prm_figures(metrics),
        **cpu.between(first_update, last_update),
        "actor_exits": sum(watch.exits.values()),  # crashes (each restarted); > 0 makes the run suspect
        "actor_exits_by_name": watch.exits,
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over rounds (a single round: that round's figures); nested figures are the
    first round's (the PRM's) or summed (crashes)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if key == "actor_exits_by_name":
            out[key] = {k: sum(r[key].get(k, 0) for r in runs) for k in {k for r in runs for k in r[key]}}
        elif key == "prm":
            out[key] = {
                k: (round(statistics.median(v), 3) if (v := [r[key][k] for r in runs if r[key]]) else None)
                for k in runs[0][key]
            }
        elif key == "cpu_s":
            names = {k for r in runs for k in r[key]}
            out[key] = {
                k: round(statistics.median(r[key].get(k, 0.0) for r in runs), 1) for k in sorted(names)
            }
        else:
            out[key] = round(statistics.median(values), 4) if values else None
    return out


def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    return round(a[key] / b[key], 3) if a.get(key) and b.get(key) else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    setup_logging("bench", level="WARNING")
    started = time.perf_counter()
    log = io.StringIO()
    modes = setups(args)
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": [], "slow": []}
    tmp = Path(tempfile.mkdtemp(prefix="guirl-bench-"))
    if args.keep:
        print(f"run directories kept under {tmp / 'runs'}", file=sys.stderr)
    try:
        ckpt = str(ensure_tiny_checkpoint(tmp / "tiny"))
        shared = [*shared_settings(ckpt, tmp / "runs", args), *args.set]
        plan = [(r, m) for r in range(args.repeat) for m in (("on", "off") if r % 2 == 0 else ("off", "on"))]
        if not args.no_slow:
            plan.append((args.repeat - 1, "slow"))
        for r, mode in plan:
            try:
                figures = one_run([*shared, *modes[mode]], log)
            except Exception:
                sys.stderr.write(log.getvalue()[-4000:])
                raise
            print(f"round {r + 1}/{args.repeat} {mode}: {json.dumps(figures)}", file=sys.stderr)
            results[mode].append(figures)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    figures = {m: median_of(runs) for m, runs in results.items() if runs}
    on, off = figures["on"], figures["off"]
    steady = ratio(on, off, "steady_steps_per_s")
    pairs = [ratio(a, b, "steady_steps_per_s") for a, b in zip(results["on"], results["off"], strict=True)]
    exits = sum(f["actor_exits"] for f in figures.values())
    return {
        "bench": "prm_overlap",
        "setup": {
            "updates": args.updates,
            "repeat": args.repeat,
            "vms": args.vms,
            "episodes_per_update": 4,
            "env_step_latency_s": args.step_latency,
            "judge_latency_s": args.judge_latency,
            "votes": args.votes,
            "judge_max_concurrency": 32,
            "slow_judge": None
            if args.no_slow
            else {"latency_s": args.slow_latency, "max_concurrency": 1, "score_timeout_s": args.slow_timeout},
            "cpus": os.cpu_count(),
            "pinning": pinning(args.shared_cores),
            "extra_settings": args.set,
        },
        **figures,
        "steady_steps_per_s_ratio": steady,
        "steady_ratio_by_round": pairs,
        "run_steps_per_s_ratio": ratio(on, off, "run_steps_per_s"),
        "slow_steady_steps_per_s_ratio": ratio(figures["slow"], off, "steady_steps_per_s")
        if "slow" in figures
        else None,
        "target_ratio": TARGET_RATIO,
        "target_met": steady is not None and steady >= TARGET_RATIO,
        # an actor crashed (and was restarted) during a run: its figures measured the restart too
        "valid": not exits,
        # no run's steady span lost more than FOREIGN_MAX cores to processes that are not the run's
        "quiet": all((f["foreign_cores"] or 0) <= FOREIGN_MAX for runs in results.values() for f in runs),
        "bench_wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=5, help="updates per run (default 5)")
    parser.add_argument("--vms", type=int, default=4, help="local VMs (default 4)")
    parser.add_argument(
        "--step-latency", type=float, default=0.5, help="env.step_latency_s: extra s per step (default 0.5)"
    )
    parser.add_argument(
        "--judge-latency", type=float, default=1.0, help="s per judge call, the on runs (default 1.0)"
    )
    parser.add_argument("--votes", type=int, default=2, help="judge votes per step (default 2)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of on + off, alternating (default 2)")
    parser.add_argument(
        "--slow-latency", type=float, default=4.0, help="s per judge call, the slow run (default 4.0)"
    )
    parser.add_argument(
        "--slow-timeout", type=float, default=8.0, help="prm.score_timeout_s of the slow run (default 8)"
    )
    parser.add_argument("--no-slow", action="store_true", help="skip the slow-judge run")
    parser.add_argument(
        "--shared-cores",
        action="store_true",
        help="do not pin the learner to a core of its own (then it, not acting, sets the pace here)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config setting for every run"
    )
    args = parser.parse_args()
    args.repeat = max(1, args.repeat)
    result = run(args)
    cols = [m for m in ("on", "off", "slow") if m in result]
    rows = (
        ("env steps/s (steady)", "steady_steps_per_s"),
        ("steps in steady span", "steady_steps"),
        ("steady span s", "steady_span_s"),
        ("steps/s (first step on)", "active_steps_per_s"),
        ("steps/s (whole run)", "run_steps_per_s"),
        ("env steps", "env_steps"),
        ("steps per episode", "steps_per_episode"),
        ("env utilisation", "env_utilisation"),
        ("VM busy (steady)", "vm_busy_steady"),
        ("learner wait s/update", "collect_s_mean"),
        ("update s/update", "update_s_mean"),
        ("learner idle frac", "learner_idle_frac"),
        ("version lag", "version_lag_mean"),
        ("machine CPU busy", "machine_busy"),
        ("foreign load, cores", "foreign_cores"),
        ("wall s", "wall_s"),
    )
    print(f"{'':>24} " + " ".join(f"{c:>10}" for c in cols))
    for label, key in rows:
        print(f"{label:>24} " + " ".join(f"{result[c][key]!s:>10}" for c in cols))
    for key in ("judge_latency_mean_s", "queue_s_mean", "queue_depth_max", "steps_scored", "steps_missing"):
        print(f"{'prm.' + key:>24} " + " ".join(f"{result[c]['prm'].get(key, '-')!s:>10}" for c in cols))
    for c in cols:
        print(f"CPU s by actor in the steady span ({c}): {result[c]['cpu_s']}")
    print(
        f"PRM on/off env steps/s (steady): {result['steady_steps_per_s_ratio']}x "
        f"(by round {result['steady_ratio_by_round']}; whole run {result['run_steps_per_s_ratio']}x) · "
        f"target >= {TARGET_RATIO}x: {'met' if result['target_met'] else 'NOT met'}"
    )
    if "slow" in result:
        print(f"slow judge / off env steps/s (steady): {result['slow_steady_steps_per_s_ratio']}x")
    if not result["quiet"]:
        print(
            f"NOISY: in some runs more than {FOREIGN_MAX} cores' worth of CPU went to processes that are not "
            "the run's (see 'foreign load'); the figures are suspect: run it again on a quiet machine"
        )
    if not result["valid"]:
        exits = {c: result[c]["actor_exits_by_name"] for c in cols}
        print(f"NOT VALID: actors crashed and were restarted during the runs {exits}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
