"""The control plane at 64, 256 and 1,024 desktops: does one coordinator, one broker, the learner's intake and
the env workers keep up with a thousand desktops stepping every few seconds, and what saturates first?

Each point is one `guirl train` (`--mode train`, the default; configs/local_rl.toml) or `guirl eval`
(`--mode eval`; configs/local_eval.toml): this checkout's `bin/guirl`, a subprocess (the public entry point,
its real actor processes), with `--set` overrides:

- train mode: a simulated learner (`train.simulated_update_s`, `--update-s` per update: the real intake,
  GRPO groups of 8, advantages and versions around a timed update) at `train.max_staleness` `--staleness`,
  a batch of about one episode per desktop; the scripted engines answer with token ids
  (`inference.scripted.tokens`). The JSON's `intake` says what reached the learner: trajectories/s, MB/s
  and MB per trajectory, steps trained and dropped for staleness;

- the desktops are replayed (`env.provider = "replay"`, `guirl.vmpool.replay`): a synthetic recorded run
  (`guirl.testing.recording`) of desktop-like screens, `--screen` (1920x1080 by default) PNGs of about
  100 KB (the JSON says the mean), each step taking `--period` minus `--engine-s` seconds on the desktop
  (the replay host's step latency: a cloud VM acting and settling, no CPU here). Each env worker's desktops
  live in one replay host process of its own, so the bench can tell the desktops' CPU from guirl's;
- the policy is the scripted backend as a latency model: every request takes `--engine-s` seconds
  (`inference.scripted.latency_s`), streamed (`inference.dispatch = "stream"`: each request alone, up to
  `inference.max_batch` in flight, as the broker drives SGLang's continuous batching), answered from the
  recording's scripts, so every episode takes the recorded actions and is scored by the recording;
- `--episodes` episodes per desktop of `--steps` steps; `--vms-per-worker` desktops per env worker.

So a desktop's ideal step period is `--period` (5 s) and the ideal rate about `desktops / period` (exactly:
a step that only says DONE or FAIL sends nothing to the desktop and takes the engine's time alone, so the
ideal counts those steps at `--engine-s`). Engine and desktop times vary by `--jitter` (20 %) either side,
so desktops do not step in lockstep. Episodes are 0.5-1.5x `--steps` long. Measured per point over the
middle 60 % of the run's stepping (start-up, the first wave of episodes all starting together, and the
tail where desktops run out of episodes left out):

- env steps/s (every step in the window, terminal ones too, over its length) and its fraction of the ideal;
- the latency guirl adds per step, p50/p99: from the screen's arrival at the env worker to the policy's
  answer there (traj.jsonl's `infer_s`: the prompt built, the ZeroMQ hops, the broker's queue and routing),
  minus the engine's own time (`engine_s`);
- CPU seconds per step of the coordinator (the driver process: coordinator, supervisor, progress), the
  broker, the learner (train mode), the env workers (each, and all) and the replay hosts (the desktops: not
  guirl's), from /proc/PID/stat sampled every 0.5 s; each one's busy fraction (a process saturates at one
  core, the machine at its cores); and the first component to saturate: the busiest process relative to a
  core;
- memory per desktop slot: the env workers' and replay hosts' resident memory over the desktops.

Targets (the issue's): at 1,024 desktops with a 5 s period, >= 90 % of the ideal rate (>= 185 steps/s) and
guirl's added latency <= 20 ms at p99. Prints a table, then one line of JSON.

    python bench/control_plane.py [--mode train|eval] [--points 64,256,1024] [--period 5] [--engine-s 1]
        [--steps 10] [--episodes 4] [--update-s 1] [--staleness 2] [--vms-per-worker 128]
        [--screen 1920x1080] [--keep] [--set KEY=VALUE ...]
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

from bench.replayed import numbers, positive, replayed_settings, run_guirl, scratch, screen  # noqa: E402
from bench.sampling import Sampler, proc_table  # noqa: E402
from guirl.testing.recording import write_recording  # noqa: E402

CONFIGS = {"train": ROOT / "configs" / "local_rl.toml", "eval": ROOT / "configs" / "local_eval.toml"}
SAMPLES = 8
"""Episodes per GRPO group in `--mode train` (GUI-RL's 8)."""
SAMPLE_S = 0.5
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
TARGET_FRACTION = 0.9
TARGET_P99_MS = 20.0
WINDOW = 0.6
"""The share of a run's stepping, in its middle, over which it is measured."""


# -- processes --------------------------------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class ProcessSampler(Sampler):
    """Every process under the driver: CPU seconds and resident memory every SAMPLE_S, in a thread."""

    period_s = SAMPLE_S

    def __init__(self, root_pid: int) -> None:
        super().__init__()
        self.root = root_pid
        self.samples: list[tuple[float, dict[int, tuple[float, int]]]] = []
        self.parents: dict[int, int] = {}
        self.replay_hosts: set[int] = set()

    def sample(self) -> None:
        now = time.time()
        seen: dict[int, tuple[float, int]] = {}  # pid -> (CPU seconds, resident bytes)
        table = proc_table()
        self.parents.update((pid, proc.ppid) for pid, proc in table.items())
        for pid, proc in table.items():
            if self._under_root(pid):
                seen[pid] = (proc.ticks / TICK, proc.rss_pages * PAGE)
                if pid not in self.replay_hosts and "guirl.vmpool.replay_host" in _cmdline(pid):
                    self.replay_hosts.add(pid)
        self.samples.append((now, seen))

    def _under_root(self, pid: int) -> bool:
        for _ in range(64):
            if pid == self.root:
                return True
            pid = self.parents.get(pid, 0)
            if pid <= 1:
                return False
        return False

    def at(self, t: float) -> dict[int, tuple[float, int]]:
        """The sample nearest `t`."""
        return min(self.samples, key=lambda s: abs(s[0] - t))[1]


# -- one point --------------------------------------------------------------------------------------------


def settings(args: argparse.Namespace, n: int, tmp: Path, rec: dict) -> list[str]:
    workers = max(1, -(-n // args.vms_per_worker))
    if args.mode == "train":  # the learner's intake too: every trajectory received, checked and buffered
        groups = max(1, n // SAMPLES)  # a batch of about one episode per desktop
        mode = [
            f"train.tasks={rec['suite']}",
            "train.domains=[]",
            f"train.updates={max(1, n * args.episodes // (groups * SAMPLES) - 1)}",
            f"train.simulated_update_s={args.update_s}",
            f"train.max_staleness={args.staleness}",
            "train.checkpoint_every=0",
            f"rollout.batch_size={groups}",
            f"rollout.n_samples_per_prompt={SAMPLES}",
            "inference.scripted.tokens=true",
        ]
    else:
        mode = [f"eval.tasks={rec['suite']}", f"eval.limit={n * args.episodes}"]
    return [
        *mode,
        f"run.root_dir={tmp / f'n{n}'}",
        f"run.name=control-n{n}",
        f"env.vms_per_worker={-(-n // workers)}",
        f"agent.max_steps={2 * args.steps + 2}",
        *replayed_settings(args, n, workers, rec),
    ]


def steps_of(run_dir: Path) -> tuple[list[dict], list[float]]:
    """Every step acted (its time, timing and whether it acted on the desktop) and the seconds between
    consecutive steps of an episode, from the episodes' traj.jsonl."""
    steps, intervals = [], []
    for traj in run_dir.glob("episodes/*/*/traj.jsonl"):
        times = []
        for line in traj.read_text().splitlines():
            record = json.loads(line)
            times.append(record["time"])
            # a step that only ends the episode sends nothing to the desktop (its time is the engine's)
            acted = any(a.get("type") not in ("done", "fail") for a in record.get("actions", []))
            steps.append({"time": record["time"], "acted": acted, **record.get("timing", {})})
        intervals += [b - a for a, b in zip(times, times[1:])]
    return sorted(steps, key=lambda s: s["time"]), intervals


def window(steps: list[dict]) -> tuple[float, float] | None:
    """The middle WINDOW share of the run's stepping (from its first step to its last): start-up, the first
    wave of episodes all starting together, and the tail, where desktops run out of episodes, left out."""
    if len(steps) < 2:
        return None
    first, last = steps[0]["time"], steps[-1]["time"]
    cut = (1 - WINDOW) / 2 * (last - first)
    return first + cut, last - cut


def intake(run_dir: Path) -> dict[str, Any]:
    """The learner's side of a train point, from its metrics.jsonl: the trajectories it received per second
    and their bytes on the wire (screens and token ids), between its first and its last update; what it
    trained and dropped for staleness; its updates' mean wait for a batch, and the largest version lag."""
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = (metrics[0], metrics[-1]) if metrics else ({}, {})
    span = last.get("time", 0) - first.get("time", 0)
    received = last.get("trajectories_received", 0) - first.get("trajectories_received", 0)
    nbytes = last.get("trajectories_bytes", 0) - first.get("trajectories_bytes", 0)
    return {
        "trajectories_per_s": round(received / span, 2) if span > 0 else None,
        "mb_per_s": round(nbytes / span / 2**20, 2) if span > 0 else None,
        "mb_per_trajectory": round(nbytes / received / 2**20, 3) if received else None,
        "updates": len(metrics),
        "samples_trained": sum(m.get("samples", 0) for m in metrics),
        # the buffer's own count: a batch that was all stale makes no metrics line of its own
        "stale_steps_dropped": last.get("buffer.steps.stale_dropped", 0),
        "collect_s_mean": round(statistics.mean(m["collect_s"] for m in metrics), 2) if metrics else None,
        "version_lag_max": max((m["version_lag_max"] for m in metrics), default=None),
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def run_point(args: argparse.Namespace, n: int, tmp: Path, rec: dict) -> dict[str, Any]:
    started = time.time()
    run = run_guirl(args.mode, CONFIGS[args.mode], settings(args, n, tmp, rec), args.timeout, ProcessSampler)
    code, out, pid, sampler = run
    if code is None:
        return {"desktops": n, "valid": False, "error": f"did not finish within {args.timeout:.0f} s"}
    wall = time.time() - started
    found = list((tmp / f"n{n}").glob("*/summary.json"))
    if code != 0 or len(found) != 1:
        return {"desktops": n, "valid": False, "error": f"exit {code}: {out[-1500:]}"}
    run_dir = found[0].parent
    summary = json.loads(found[0].read_text())
    status = json.loads((run_dir / "status.json").read_text())
    steps, intervals = steps_of(run_dir)
    span = window(steps)
    point: dict[str, Any] = {
        "desktops": n,
        "env_workers": max(1, -(-n // args.vms_per_worker)),
        "wall_s": round(wall, 1),
        "episodes": summary.get("episodes"),
        "env_errors": summary.get("env_errors"),
        "aborted": summary.get("aborted", 0),
    }
    if args.mode == "eval":
        point["accuracy"] = summary.get("accuracy")
    else:
        point.update(updates=summary.get("updates"), learner_restarts=summary.get("learner_restarts"))
    if span is None or span[1] - span[0] < 4 * args.period:
        point.update(valid=False, error="the run stepped too briefly to measure (more --episodes)")
        return point
    t0, t1 = span
    inside = [s for s in steps if t0 <= s["time"] <= t1]
    rate = len(inside) / (t1 - t0)
    # the ideal: every desktop always stepping, a step acted on the desktop taking `period`, a terminal one
    # (DONE or FAIL: nothing is sent to the desktop) the engine's time only; episode turnover costs nothing
    acted = sum(s["acted"] for s in inside) / len(inside)
    ideal = n / (acted * args.period + (1 - acted) * args.engine_s)
    added = [1000 * (s["infer_s"] - s["engine_s"]) for s in inside if "infer_s" in s and "engine_s" in s]
    queue = [1000 * s["queue_s"] for s in inside if "queue_s" in s]
    prompt = [1000 * s["prompt_s"] for s in inside if "prompt_s" in s]
    # the rest: the request's and the answer's way between the env worker and the broker (ZeroMQ, codec)
    hops = [
        1000 * (s["infer_s"] - s["engine_s"] - s["queue_s"] - s["prompt_s"])
        for s in inside
        if {"infer_s", "engine_s", "queue_s", "prompt_s"} <= s.keys()
    ]
    # processes: the driver (coordinator), the broker, the env workers, the replay hosts
    names = {a["pid"]: name for name, a in status.get("actors", {}).items() if a.get("pid")}
    a, b = sampler.at(t0), sampler.at(t1)
    groups: dict[str, list[int]] = {
        "coordinator": [pid],
        "broker": [],
        "learner": [],
        "env_worker": [],
        "replay_host": [],
    }
    for pid in b:
        if pid in sampler.replay_hosts:
            groups["replay_host"].append(pid)
        elif names.get(pid) in ("broker", "learner"):
            groups[names[pid]].append(pid)
        elif names.get(pid, "").startswith("worker"):
            groups["env_worker"].append(pid)
    steps_in = max(1, len(inside))
    cpu: dict[str, Any] = {}
    busiest = ("", 0.0)
    for group, pids in groups.items():
        deltas = [b[p][0] - a.get(p, (0.0, 0))[0] for p in pids if p in b]  # one started since: all of it
        if not deltas:
            continue
        cpu[group] = {
            "cpu_ms_per_step": round(1000 * sum(deltas) / steps_in, 3),
            "busy_max": round(max(deltas) / (t1 - t0), 3),  # the busiest process of the group, in cores
            "processes": len(deltas),
        }
        if group != "replay_host" and max(deltas) / (t1 - t0) > busiest[1]:
            busiest = (group, max(deltas) / (t1 - t0))
    machine = sum(b[p][0] - a.get(p, (0.0, 0))[0] for p in b) / (t1 - t0)
    rss = {g: sum(b[p][1] for p in pids if p in b) for g, pids in groups.items()}
    if args.mode == "train":
        point["intake"] = intake(run_dir)
    point.update(
        valid=bool(
            summary.get("env_errors") == 0
            and summary.get("aborted", 0) == 0
            and not summary.get("learner_restarts")
        ),
        measured_s=round(t1 - t0, 1),
        steps_per_s=round(rate, 2),
        ideal_steps_per_s=round(ideal, 2),
        fraction_of_ideal=round(rate / ideal, 3),
        step_period_s=round(statistics.mean(intervals), 3) if intervals else None,
        added_ms_p50=round(pct(added, 0.5), 2) if added else None,
        added_ms_p99=round(pct(added, 0.99), 2) if added else None,
        queue_ms_p99=round(pct(queue, 0.99), 2) if queue else None,
        prompt_ms_p50=round(pct(prompt, 0.5), 2) if prompt else None,
        prompt_ms_p99=round(pct(prompt, 0.99), 2) if prompt else None,
        hops_ms_p99=round(pct(hops, 0.99), 2) if hops else None,
        cpu=cpu,
        machine_cores_busy=round(machine, 2),
        cores=os.cpu_count(),
        first_to_saturate=busiest[0] if busiest[1] >= 0.9 else None,
        busiest=busiest[0],
        busiest_cores=round(busiest[1], 3),
        mem_mb_per_slot=round((rss["env_worker"] + rss["replay_host"]) / n / 2**20, 2),
        mem_mb={g: round(v / 2**20, 1) for g, v in rss.items()},
    )
    if machine >= 0.9 * (os.cpu_count() or 1) and point["first_to_saturate"] is None:
        point["first_to_saturate"] = "machine"
    return point


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mode",
        choices=("train", "eval"),
        default="train",
        help="guirl train with a simulated learner (its intake measured too; default) or guirl eval",
    )
    ap.add_argument("--points", type=numbers, default=[64, 256, 1024], help="desktops at each point")
    ap.add_argument("--period", type=float, default=5.0, help="a desktop's ideal seconds per step")
    ap.add_argument("--engine-s", type=float, default=1.0, help="the engine's seconds per request")
    ap.add_argument("--steps", type=int, default=10, help="steps per episode")
    ap.add_argument(
        "--jitter", type=float, default=0.2, help="engine and desktop times vary by this fraction either side"
    )
    ap.add_argument("--episodes", type=int, default=4, help="episodes per desktop")
    ap.add_argument(
        "--update-s", type=positive, default=1.0, help="--mode train: seconds per simulated update"
    )
    ap.add_argument("--staleness", type=int, default=2, help="--mode train: train.max_staleness")
    ap.add_argument("--vms-per-worker", type=int, default=128)
    ap.add_argument("--screen", type=screen, default=(1920, 1080))
    ap.add_argument(
        "--max-pixels", type=int, default=16 * 16 * 4 * 12800, help="agent.max_pixels (Qwen3-VL's default)"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one point may take")
    ap.add_argument("--keep", action="store_true", help="keep the recording and the runs")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides")
    args = ap.parse_args(argv)
    if not 0 < args.engine_s < args.period:
        ap.error("--engine-s must be above 0 and below --period")
    with scratch("guirl-control-", keep=args.keep) as tmp:
        rec = write_recording(
            tmp / "recording",
            tasks=max(args.points) * args.episodes,
            steps=args.steps,
            size=args.screen,
            vary=True,
            # each step a new screen (episodes are up to 1.5 x --steps long): one per step, as a desktop's
            distinct_screens=max(8, args.steps + args.steps // 2 + 1),
        )
        rec["root"] = str(tmp / "recording")
        points = []
        for n in args.points:
            point = run_point(args, n, tmp, rec)
            points.append(point)
            print(
                f"{n:>6} desktops  {point.get('steps_per_s', '-'):>8} steps/s  "
                f"({point.get('fraction_of_ideal', '-')} of {point.get('ideal_steps_per_s', '-')})  "
                f"added p50/p99 "
                f"{point.get('added_ms_p50', '-')}/{point.get('added_ms_p99', '-')} ms  busiest "
                f"{point.get('busiest', '-')} {point.get('busiest_cores', '-')} cores  "
                f"{point.get('mem_mb_per_slot', '-')} MB/slot  valid {point['valid']}",
                flush=True,
            )
        last = points[-1]
        result = {
            "bench": "control_plane",
            "mode": args.mode,
            "period_s": args.period,
            "engine_s": args.engine_s,
            "jitter": args.jitter,
            "steps": args.steps,
            "screen": f"{args.screen[0]}x{args.screen[1]}",
            "screen_kb": round(rec["screen_bytes"] / 1024, 1),
            "points": points,
            "target": {
                "desktops": last["desktops"],
                "fraction": TARGET_FRACTION,
                "p99_ms": TARGET_P99_MS,
                "met": bool(
                    last.get("valid")
                    and last.get("fraction_of_ideal", 0) >= TARGET_FRACTION
                    and (last.get("added_ms_p99") or 1e9) <= TARGET_P99_MS
                ),
            },
        }
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
