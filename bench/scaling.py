"""Env-worker scaling: env steps/s with 1, 2, 4 and 8 env workers (one VM each) in one run, against a broker
whose policy takes a fixed time per batch and desktops whose every step takes a fixed time more, and the
scaling efficiency of each point, `rate(N) / (N / N0 x rate(N0))` (N0: the first point, 1 by default).

Each point is one `guirl eval` (this checkout's `bin/guirl`, a subprocess: the public entry point) on
configs/local_eval.toml with `--set` overrides, the same for every point but the workers:

- the desktops are real local desktops (`env.provider = "local"`: sandboxed Xvfb, reset between episodes),
  each episode a copy, under its own id, of the shipped task terminal-infeasible-photoshop (an xterm;
  OSWorld's `infeasible` evaluator, which costs nothing), `--episodes` episodes per VM;
- the policy is the scripted backend (`inference.backend = "scripted"`, one engine taking batches of up to
  `inference.max_batch` = 8): every batch takes `inference.scripted.latency_s`, whatever its size, and each
  episode is answered from a script written for the bench: a click into the xterm, a typed key per step,
  then FAIL at step `--steps` (the infeasible task is solved by FAIL only: a score of 1 says the episode
  played its whole script, and the bench is `valid` when every episode did, without environment errors);
- every step costs `env.step_latency_s` more, slept by the env worker (a remote VM's latency: no CPU here).

So a VM's step takes at least policy + step latency (`--latency`, 0.5,1.0 s by default), plus guirl's real
work — the screenshot, the prompt (the screenshot resized), the action on the desktop, the ZeroMQ hops — and
between episodes the VM's reset (its desktop restarted) and the task's setup (an xterm started). The
latencies are chosen well above that work, so that the rate is governed by guirl's scaling — the
coordinator handing out episodes, the broker batching N workers' requests into one engine's batches, the
workers' concurrency — and not by this 2-core machine's CPU. The bench checks it rather than assumes it:
it samples the machine's CPU (/proc/stat) over each point's steady span and flags a point over `CPU_BOUND`
busy (there the machine, not guirl, may have set the pace: raise `--latency`).

The measure, per point: each step a worker plays writes the screen the policy sees (`step_NNN.png`) as the
step starts. The steady span is the one in which every worker was playing: from the first step of the last
worker to start (start-up — the broker, the worker processes, their first desktops — is left out) to the
last step of the first worker to finish (so is the tail, where workers run out of episodes); steps/s is
the steps started in that span over its length. Also per point: the latency bound `VMs / (policy + step
latency)` and the share of it reached; a VM's seconds per step, split into the step latency, the wait for
the policy (traj.jsonl's `timing`; well above the policy latency, a request that came while its engine had
a batch in flight and waited for it: the broker keeps one batch in flight per engine), the time to act, and
the rest, the episode turnover (reset, setup, evaluation, next hand-out) spread over the steps; the pools'
reset p50; start-up time; the machine's CPU, mean and 90th percentile of 0.5 s intervals (desktops that
restart together load it in bursts). Prints a table, then one line of JSON.

    python bench/scaling.py [--points 1,2,4,8] [--latency 0.5,1.0] [--episodes 4] [--steps 8]
        [--vms-per-worker 1] [--keep] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sampling import Sampler  # noqa: E402
from guirl.config import load_config  # noqa: E402
from guirl.config.schema import ENV_VARS  # noqa: E402

CONFIG = ROOT / "configs" / "local_eval.toml"
TEMPLATE = ROOT / "tasks" / "local" / "examples" / "terminal" / "terminal-infeasible-photoshop.json"
CPU_BOUND = 0.7
"""Machine CPU busy fraction over a steady span above which the point may measure this machine, not guirl."""
CPU_BURST = 0.9
"""90th percentile of a steady span's 0.5 s CPU intervals above which the machine saturated in bursts (the
desktops restarting together): the turnover there is partly this machine's."""
CPU_SAMPLE_S = 0.5
"""How often the machine's CPU counters are read."""
CLICK = {"type": "click", "x": 300, "y": 200}  # into the xterm (110x32 characters at the top left)


def numbers(text: str, kind: type, count: int | None = None) -> list[Any]:
    """`1,2,4` as numbers of `kind`; exactly `count` of them when given."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or (count is not None and len(values) != count) or min(values) <= 0:
        want = f"{count} positive numbers" if count else "positive numbers"
        raise argparse.ArgumentTypeError(f"{text!r}: want {want}, comma-separated")
    return values


def write_suite(tmp: Path, tasks: int, steps: int) -> Path:
    """`tasks` copies of the template task (ids scale-000...) as a meta list with its examples/, and each
    one's script under scripts/ (see the module docstring); returns the meta list's path."""
    template = json.loads(TEMPLATE.read_text())
    examples, scripts = tmp / "examples" / "terminal", tmp / "scripts"
    examples.mkdir(parents=True)
    scripts.mkdir()
    script = ([CLICK] if steps > 1 else []) + [{"type": "type", "text": "x"}] * max(0, steps - 2)
    script.append({"type": "fail"})
    ids = [f"scale-{i:03d}" for i in range(tasks)]
    for task_id in ids:
        (examples / f"{task_id}.json").write_text(json.dumps({**template, "id": task_id}, indent=1))
        (scripts / f"{task_id}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in script))
    meta = tmp / "tasks.json"
    meta.write_text(json.dumps({"terminal": ids}))
    return meta


def point_settings(args: argparse.Namespace, workers: int, tmp: Path) -> list[str]:
    """The `--set` overrides of the point with `workers` env workers."""
    policy_s, step_s = args.latency
    vms = workers * args.vms_per_worker
    return [
        f"run.root_dir={tmp / f'n{workers}'}",
        f"run.name=scaling-n{workers}",
        "inference.backend=scripted",
        "inference.engines=1",
        f"inference.scripted.dir={tmp / 'scripts'}",
        f"inference.scripted.latency_s={policy_s}",
        f"env.step_latency_s={step_s}",
        f"env.max_envs={vms}",
        f"env.prewarm_envs={vms}",
        f"env.workers={workers}",
        f"env.vms_per_worker={args.vms_per_worker}",
        f"eval.tasks={tmp / 'tasks.json'}",
        f"eval.limit={args.episodes * vms}",
        f"agent.max_steps={args.steps}",
        "agent.sleep_after_action_s=0",
        "logging.level=WARNING",
        *args.set,
    ]


class CpuSampler(Sampler):
    """The machine's (busy, total) CPU ticks every CPU_SAMPLE_S, in a thread, while a point runs."""

    period_s = CPU_SAMPLE_S

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[tuple[float, int, int]] = []

    def sample(self) -> None:
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        self.samples.append((time.time(), sum(values) - idle, sum(values)))

    def busy(self, start: float, end: float) -> tuple[float | None, float | None]:
        """The machine's busy fraction over [start, end], from the samples nearest inside it, and the 90th
        percentile of its sampling intervals' (bursts: desktops restarting together)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][2] <= inside[0][2]:
            return None, None
        steps = [(b[1] - a[1]) / (b[2] - a[2]) for a, b in zip(inside, inside[1:]) if b[2] > a[2]]
        p90 = sorted(steps)[int(0.9 * (len(steps) - 1))]
        return round((inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2]), 3), round(p90, 3)


def step_records(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every step played: its start, worker and timing; every episode's result.json)."""
    steps, episodes = [], []
    for result_path in sorted(run_dir.glob("episodes/*/*/result.json")):
        episode = json.loads(result_path.read_text())
        episodes.append(episode)
        traj = result_path.parent / "traj.jsonl"
        timing = {}
        if traj.exists():
            for line in traj.read_text().splitlines():
                record = json.loads(line)
                timing[record["step"]] = record.get("timing", {})
        for png in result_path.parent.glob("step_*.png"):
            step = int(png.stem.removeprefix("step_"))
            steps.append({"start": png.stat().st_mtime, "worker": episode["worker"], **timing.get(step, {})})
    return sorted(steps, key=lambda s: s["start"]), episodes


def mean_of(values: list[float]) -> float | None:
    return round(statistics.mean(values), 3) if values else None


def measure(
    run_dir: Path, args: argparse.Namespace, workers: int, launched: float
) -> tuple[dict[str, Any], tuple[float, float]]:
    """A point's figures from its run directory (see the module docstring), and its steady span."""
    steps, episodes = step_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    vms = workers * args.vms_per_worker
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in steps:
        first.setdefault(s["worker"], s["start"])
        last[s["worker"]] = s["start"]
    # the steady span: every worker playing (the last one to start has started, none has finished)
    t0 = max(first.values()) if len(first) == workers else 0.0
    t1 = min(last.values()) if len(last) == workers else 0.0
    inside = [s for s in steps if t0 <= s["start"] < t1]
    span = t1 - t0
    steady = round(len(inside) / span, 3) if span > 0 and len(inside) >= 2 else None
    bound = vms / sum(args.latency)
    whole = steps[-1]["start"] - steps[0]["start"] if len(steps) >= 2 else 0.0
    pools = [json.loads(p.read_text()) for p in run_dir.glob("pools/*.json")]
    resets = [p["pool"]["reset_p50_s"] for p in pools if p.get("pool", {}).get("reset_p50_s") is not None]
    policy_wait = mean_of([s["infer_s"] for s in inside if "infer_s" in s])
    act = mean_of([s["act_s"] for s in inside if "act_s" in s])
    figures = {
        "workers": workers,
        "vms": vms,
        "steady_steps_per_s": steady,
        "steady_steps": len(inside),
        "steady_span_s": round(span, 1) if span > 0 else 0.0,
        "latency_bound_steps_per_s": round(bound, 3),
        "of_bound": round(steady / bound, 3) if steady else None,
        "s_per_step_per_vm": round(vms / steady, 3) if steady else None,
        "policy_wait_s_mean": policy_wait,
        "act_s_mean": act,
        # the rest of a VM's time per step: episode turnover (the desktop's reset, the task's setup, the
        # evaluation, the next hand-out) spread over the episode's steps
        "turnover_s_per_step": round(vms / steady - args.latency[1] - policy_wait - act, 3)
        if steady and policy_wait is not None and act is not None
        else None,
        "run_steps_per_s": round(len(steps) / whole, 3) if whole > 0 else None,
        "steps": len(steps),
        "tasks": summary["tasks"],
        "episodes": summary["episodes"],
        "env_errors": summary["env_errors"],
        "accuracy": summary["accuracy"],
        # every episode played its whole script: scored 1 (FAIL at the last step) in exactly --steps steps
        "played_out": all(
            e["status"] == "completed" and e["score"] == 1.0 and e["steps"] == args.steps for e in episodes
        )
        and summary["env_errors"] == 0
        and summary["tasks"] == args.episodes * vms,
        "reset_p50_s": round(statistics.median(resets), 3) if resets else None,
        "startup_s": round(t0 - launched, 1) if t0 else None,  # launch to the last worker's first step
    }
    return figures, (t0, t1)


def run_point(args: argparse.Namespace, workers: int, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    settings = point_settings(args, workers, tmp)
    load_config(CONFIG, env={}, overrides=settings)  # a bad setting fails here, before anything starts
    cmd = [sys.executable, str(ROOT / "bin" / "guirl"), "eval", "--config", str(CONFIG)]
    cmd += [arg for s in settings for arg in ("--set", s)]
    policy_s, step_s = args.latency
    # generous: start-up, then each VM's episodes at up to 3x their latency-bound time, resets included
    timeout = 300 + 3 * args.episodes * (args.steps * (policy_s + step_s) + 5)
    log_path = tmp / f"n{workers}.log"
    launched, t = time.time(), time.perf_counter()
    with CpuSampler() as cpu, open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            proc = None
    wall = time.perf_counter() - t
    tail = log_path.read_text()[-4000:]
    if proc is None or proc.returncode != 0:
        why = f"took over {timeout:.0f} s" if proc is None else f"failed (exit {proc.returncode})"
        raise SystemExit(f"guirl eval with {workers} env worker(s) {why}; its output ends:\n{tail}")
    found = list((tmp / f"n{workers}").glob("*/summary.json"))
    if len(found) != 1:
        raise SystemExit(f"no single run directory with a summary.json under {tmp / f'n{workers}'}")
    figures, (t0, t1) = measure(found[0].parent, args, workers, launched)
    busy, p90 = cpu.busy(t0, t1) if t1 > t0 else (None, None)
    bound = busy is not None and busy > CPU_BOUND
    figures.update(cpu_busy=busy, cpu_busy_p90=p90, cpu_bound=bound, wall_s=round(wall, 1))
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    load_before = round(os.getloadavg()[0], 2)
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}  # the caller's GUI_* must not leak in
    tmp = Path(tempfile.mkdtemp(prefix="guirl-scaling-"))
    if args.keep:
        print(f"run directories kept under {tmp}", file=sys.stderr)
    points = []
    try:
        write_suite(tmp, args.episodes * max(args.points) * args.vms_per_worker, args.steps)
        cfg = load_config(CONFIG, env={}, overrides=point_settings(args, args.points[0], tmp))
        for workers in args.points:
            print(f"[scaling] {workers} env worker(s) x {args.vms_per_worker} VM ...", file=sys.stderr)
            figures = run_point(args, workers, tmp, env)
            print(f"[scaling] {workers}: {json.dumps(figures)}", file=sys.stderr)
            points.append(figures)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    base = points[0]
    for p in points:  # steps/s per VM against the first point's
        if p["steady_steps_per_s"] and base["steady_steps_per_s"]:
            per_vm = p["steady_steps_per_s"] / p["vms"]
            p["efficiency"] = round(per_vm / (base["steady_steps_per_s"] / base["vms"]), 3)
        else:
            p["efficiency"] = None
    policy_s, step_s = args.latency
    return {
        "bench": "scaling",
        "setup": {
            "points": args.points,
            "vms_per_worker": args.vms_per_worker,
            "policy_latency_s": policy_s,
            "step_latency_s": step_s,
            "episodes_per_vm": args.episodes,
            "steps_per_episode": args.steps,
            "engines": cfg.inference.engines,
            "max_batch": cfg.inference.max_batch,
            "max_wait_ms": cfg.inference.max_wait_ms,
            "screen": [cfg.env.screen_width, cfg.env.screen_height],
            "action_space": cfg.env.action_space,
            "task": TEMPLATE.stem,
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "extra_settings": args.set,
        },
        "points": points,
        "efficiency": {str(p["workers"]): p["efficiency"] for p in points},
        # every episode of every point played its whole script, with no environment error
        "valid": all(p["played_out"] for p in points),
        "cpu_bound_points": [p["workers"] for p in points if p["cpu_bound"]],
        "cpu_bound_threshold": CPU_BOUND,
        "cpu_burst_points": [p["workers"] for p in points if (p["cpu_busy_p90"] or 0) > CPU_BURST],
        "cpu_burst_threshold": CPU_BURST,
        "bench_wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--points",
        type=lambda s: numbers(s, int),
        default=[1, 2, 4, 8],
        metavar="N,N,...",
        help="env workers (default 1,2,4,8)",
    )
    parser.add_argument(
        "--latency",
        type=lambda s: numbers(s, float, 2),
        default=[0.5, 1.0],
        metavar="POLICY_S,STEP_S",
        help="fixed latencies: the policy's per batch, the desktop's per step (default 0.5,1.0)",
    )
    parser.add_argument("--episodes", type=int, default=4, help="episodes per VM per point (default 4)")
    parser.add_argument("--steps", type=int, default=8, help="steps per episode (default 8)")
    parser.add_argument("--vms-per-worker", type=int, default=1, help="VMs per env worker (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config setting for every point"
    )
    args = parser.parse_args()
    if min(args.episodes, args.steps, args.vms_per_worker) < 1:
        parser.error("--episodes, --steps and --vms-per-worker must be at least 1")
    result = run(args)
    s = result["setup"]
    print(
        f"{s['policy_latency_s']} s policy latency per batch ({s['engines']} engine(s), batches of up to "
        f"{s['max_batch']}), "
        f"{s['step_latency_s']} s step latency; {s['episodes_per_vm']} episodes x {s['steps_per_episode']} "
        f"steps per VM; {s['cpus']} CPUs"
    )
    cols = (
        ("workers", "workers", 7),
        ("VMs", "vms", 4),
        ("steps/s", "steady_steps_per_s", 8),
        ("steps", "steady_steps", 6),
        ("span s", "steady_span_s", 7),
        ("bound", "latency_bound_steps_per_s", 6),
        ("of bound", "of_bound", 8),
        ("efficiency", "efficiency", 10),
        ("s/step/VM", "s_per_step_per_vm", 9),
        ("policy s", "policy_wait_s_mean", 8),
        ("act s", "act_s_mean", 6),
        ("turnover s", "turnover_s_per_step", 10),
        ("reset s", "reset_p50_s", 7),
        ("CPU busy", "cpu_busy", 8),
        ("CPU p90", "cpu_busy_p90", 7),
        ("startup s", "startup_s", 9),
        ("wall s", "wall_s", 6),
    )
    print(" ".join(f"{label:>{w}}" for label, _, w in cols))
    for p in result["points"]:
        print(" ".join(f"{p[key]!s:>{w}}" for _, key, w in cols))
    print(
        "scaling efficiency (steady steps/s per VM against the first point's): "
        + ", ".join(f"{n}: {e}" for n, e in result["efficiency"].items())
    )
    if result["cpu_bound_points"]:
        print(
            f"CPU-BOUND: at {result['cpu_bound_points']} worker(s) the machine was over {CPU_BOUND:.0%} busy "
            "in the steady span: those points may measure this machine, not guirl (raise --latency)"
        )
    if result["cpu_burst_points"]:
        print(
            f"CPU BURSTS: at {result['cpu_burst_points']} worker(s) the machine saturated in bursts (CPU "
            f"p90 > {CPU_BURST:.0%}): part of the turnover's growth there is this machine's desktops, "
            "not guirl"
        )
    if not result["valid"]:
        print("NOT VALID: some episodes did not play their whole script, or hit environment errors")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
