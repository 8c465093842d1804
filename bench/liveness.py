"""Liveness at the largest model this machine holds: is a busy actor taken for a dead one?

A random Qwen3-VL of 293 M parameters (built offline; `--hidden`, `--layers`; 457 M ran the machine out of
memory at its first checkpoint, beside the broker and the desktops) is trained by
GRPO through the whole actor system on local desktops (`configs/local_rl.toml`), with a checkpoint after
every update (`train.checkpoint_every = 1`: a full-state save, optimizer included) and a weight broadcast
to the broker after every update — the heavy work that, at production sizes, keeps an actor busy for seconds
to minutes. Two runs, side by side:

- `heartbeats`: the rule before issue 21 (a peer whose own heartbeats stop for
  `heartbeat_interval_s × heartbeat_liveness`, 3 s, is dead);
- `transport`: today's (ZeroMQ's heartbeats keep a busy peer's connection alive; dead = connection lost
  and silent for the deadline; hung = connected but silent past the progress deadline).

For each, per actor: the longest event-loop stall, the heartbeats it could not send (stall / interval), the
peers it declared dead (every one a false death: nothing is killed), and the run's episodes lost to them
(environment errors that name a dead peer). Then a third run (`transport`) in which the bench SIGKILLs the
learner mid-checkpoint, the broker and the env worker, one at a time, and reads from the peers' logs how
long each death took to be declared: it must be within the transport deadline plus one heartbeat tick.

    python bench/liveness.py [--hidden 1024] [--layers 24] [--updates 3] [--busy N] [--no-kills] [--quick]

`--busy N` adds N `HoldGil` faults to each of the two runs (`chaos.busy`): the learner or the broker holds
the GIL for 6 to 12 s, as an 8B checkpoint save or weight gather would — work this machine cannot hold. The
kill run has none. `--quick` is a few-minute smoke run of the whole bench with a small model. Ends with one
line of JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from guirl.config.schema import ENV_VARS  # noqa: E402

CACHE = ROOT / ".cache" / "liveness"
INTERVAL_S, LIVENESS = 1.0, 3  # the defaults: a 3 s transport deadline
VICTIMS = ("learner", "broker", "worker0")


def build_model(args: argparse.Namespace) -> tuple[Path, int]:
    from guirl.model.tiny import count_parameters, write_tiny_checkpoint

    knobs = {
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": args.hidden // 64,
        "kv_heads": max(1, args.hidden // 256),
        "head_dim": 64,
        "mrope_section": (12, 10, 10),
        "vision_depth": 2,
        "vision_hidden": 128,
        "max_pixels": 256 * 256,
    }
    key = "-".join(f"{k}{v}" for k, v in knobs.items() if k != "mrope_section")
    target = CACHE / key
    if not (target / "guirl_tiny.json").is_file():
        started = time.monotonic()
        tmp = CACHE / f".{key}.{os.getpid()}"
        write_tiny_checkpoint(tmp, **knobs)
        os.replace(tmp, target)
        print(f"built {target.name} in {time.monotonic() - started:.0f} s", flush=True)
    return target, count_parameters(target)


def command(
    args: argparse.Namespace, ckpt: Path, root: Path, liveness: str, updates: int, busy: int = 0
) -> list[str]:
    chaos = [  # HoldGil faults: the learner or the broker holds the GIL 6 to 12 s, as an 8B save would
        *("--set", "runtime.fault_injection=true", "--set", "chaos.seed=1", "--set", "chaos.faults=0"),
        *("--set", f"chaos.busy={busy}", "--set", "chaos.span_s=120"),
    ]
    return [
        *(
            sys.executable,
            str(ROOT / "bin" / "guirl"),
            "train",
            "--config",
            str(ROOT / "configs" / "local_rl.toml"),
        ),
        *("--ckpt", str(ckpt), "--updates", str(updates), "--max-steps", "1"),
        *("--set", "train.checkpoint_every=1", "--set", "train.weight_sync=broadcast"),
        *("--set", f"runtime.liveness={liveness}", "--set", f"runtime.heartbeat_interval_s={INTERVAL_S}"),
        *("--set", f"runtime.heartbeat_liveness={LIVENESS}", "--set", "logging.format=json"),
        *("--set", "logging.level=INFO"),
        *("--set", "agent.history_images=0", "--set", "agent.max_new_tokens=16"),
        *("--set", "agent.max_pixels=65536", "--set", "supervisor.max_restarts=20"),
        *("--set", "train.micro_batch_tokens=1024"),  # the activations of one micro-batch bound the memory
        *("--set", f"run.root_dir={root}", "--set", "wandb.mode=disabled"),
        *(chaos if busy else []),
    ]


def log_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def when(line: dict) -> float:
    return dt.datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


def figures(lines: list[dict], run_dir: Path) -> dict:
    """Per actor: its longest stall, heartbeats it could not send, peers it declared dead; and the run's
    episodes lost to a declared death."""
    actors: dict[str, dict] = {}
    for line in lines:
        if line.get("liveness"):
            name = line.get("actor", "?")
            actors[name] = {
                "stall_max_s": line["stall_max_s"],
                "heartbeats_missed": int(line["stall_max_s"] // INTERVAL_S),
                "declared_dead": line["peers_dead"],
                "declared_hung": line["peers_hung"],
                "requests_waited_busy": line["requests_waited_busy"],
            }
    # a chaos run's hostile peer (a hex id) is declared dead when the monkey closes it: not an actor
    deaths = [x for x in lines if x.get("peer_dead") and not str(x["peer_dead"]).startswith("0x")]
    lost = 0
    ledger = run_dir / "episodes.jsonl"
    if ledger.is_file():
        for row in map(json.loads, ledger.read_text().splitlines()):
            err = str(row.get("env_error") or "")
            if row.get("kind") == "ended" and ("dead" in err or "died" in err or "PeerDead" in err):
                lost += 1
    chaos = run_dir / "chaos.jsonl"
    held = [json.loads(x) for x in chaos.read_text().splitlines()] if chaos.is_file() else []
    held = [f"{x['target']}: {x['busy']}" for x in held if "busy" in x]
    summary = (
        json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    )
    return {
        "actors": dict(sorted(actors.items())),
        "false_deaths": len(deaths),
        "deaths": [
            f"{x.get('actor')} declared {x['peer_dead']} dead after {x.get('silent_s')} s" for x in deaths
        ],
        "episodes_lost": lost,
        "busy_faults": held,
        "updates": summary.get("updates"),
        "env_errors": summary.get("env_errors"),
    }


def run_dir_of(root: Path) -> Path | None:
    runs = [p for p in root.iterdir() if p.is_dir()]
    return runs[0] if len(runs) == 1 else None


def clean_run(args: argparse.Namespace, ckpt: Path, work: Path, liveness: str) -> dict:
    root = work / liveness
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    started = time.monotonic()
    stderr_path = work / f"{liveness}.stderr"
    with open(stderr_path, "w") as err:
        cmd = command(args, ckpt, root, liveness, args.updates, args.busy)
        out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env, cwd=ROOT)
    out.stderr = stderr_path.read_text()
    seconds = round(time.monotonic() - started, 1)
    run_dir = run_dir_of(root)
    if out.returncode != 0 or run_dir is None:
        return {
            "liveness": liveness,
            "seconds": seconds,
            "error": f"exit {out.returncode}: {out.stderr[-800:]}",
        }
    return {"liveness": liveness, "seconds": seconds, **figures(log_lines(out.stderr), run_dir)}


def kill_run(args: argparse.Namespace, ckpt: Path, work: Path) -> dict:
    """SIGKILL each victim once (the learner while it writes a checkpoint) and read from the peers' logs when
    each death was declared."""
    root = work / "kills"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    stderr_path = work / "kills.stderr"
    started = time.monotonic()
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            command(args, ckpt, root, "transport", args.updates + 2),
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=ROOT,
        )
        kills: dict[str, float] = {}
        pending = list(VICTIMS)
        while proc.poll() is None and pending:
            time.sleep(0.05)  # a poll of the run directory, not a synchronisation
            run_dir = run_dir_of(root)
            status = _status(run_dir)
            actors = status.get("actors", {})
            victim = pending[0]
            a = actors.get(victim) or {}
            if not a.get("up") or not a.get("pid") or (status.get("learner") or {}).get("version", 0) < 1:
                continue
            if victim == "learner" and not any(run_dir.glob("checkpoints/.v*.tmp")):
                continue  # wait for it to be busy writing a checkpoint
            if kills and time.time() - max(kills.values()) < 3 * INTERVAL_S * LIVENESS:
                continue  # one death at a time
            try:
                os.kill(int(a["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills[victim] = time.time()
            pending.pop(0)
        proc.wait()
    seconds = round(time.monotonic() - started, 1)
    lines = log_lines(stderr_path.read_text())
    detected = {}
    for victim, at in kills.items():
        # declared dead, or met again as a new process (restarted within the deadline): whichever came first
        told = [x for x in lines if victim in (x.get("peer_dead"), x.get("peer_restarted"))]
        seen = sorted(when(x) - at for x in told if when(x) >= at)
        detected[victim] = round(seen[0], 2) if seen else None
    bound = INTERVAL_S * LIVENESS + INTERVAL_S
    return {
        "seconds": seconds,
        "exit": proc.returncode,
        "killed": sorted(kills),
        "not_killed": pending,
        "detect_s": detected,
        "bound_s": bound,
        "all_within_bound": bool(detected) and all(d is not None and d <= bound for d in detected.values()),
    }


def _status(run_dir: Path | None) -> dict:
    if run_dir is None:
        return {}
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a small model: a smoke run of the whole bench")
    p.add_argument("--no-kills", action="store_true", help="skip the third run (SIGKILLs)")
    p.add_argument(
        "--busy",
        type=int,
        default=0,
        help="besides the real work, N HoldGil faults per run (chaos.busy): the learner or the broker holds "
        "the GIL for 6 to 12 s, as an 8B checkpoint save or weight gather would",
    )
    args = p.parse_args()
    if args.quick:
        args.hidden, args.layers, args.updates = 256, 2, 2
    ckpt, params = build_model(args)
    print(f"model: {params / 1e6:.0f} M parameters ({ckpt.name})", flush=True)
    work = Path(tempfile.mkdtemp(prefix="guirl-liveness-"))
    runs = {}
    for liveness in ("heartbeats", "transport"):
        r = clean_run(args, ckpt, work, liveness)
        runs[liveness] = r
        print(
            f"{liveness}: {r.get('seconds')} s, false deaths {r.get('false_deaths')}, episodes lost "
            f"{r.get('episodes_lost')}, {r.get('error', '')}",
            flush=True,
        )
        for name, a in r.get("actors", {}).items():
            print(
                f"  {name:<12} stall max {a['stall_max_s']:6.2f} s, declared dead {a['declared_dead']}",
                flush=True,
            )
        for d in r.get("deaths", [])[:10]:
            print(f"  {d}", flush=True)
    kills = None if args.no_kills else kill_run(args, ckpt, work)
    if kills is not None:
        print(f"kills: detected after {kills['detect_s']} (bound {kills['bound_s']} s)", flush=True)
    line = {
        "bench": "liveness",
        "params_m": round(params / 1e6, 1),
        "updates": args.updates,
        "busy_faults_per_run": args.busy,
        "transport_deadline_s": INTERVAL_S * LIVENESS,
        **{
            liveness: {
                k: r.get(k)
                for k in (
                    "seconds",
                    "false_deaths",
                    "episodes_lost",
                    "updates",
                    "actors",
                    "busy_faults",
                    "error",
                )
            }
            for liveness, r in runs.items()
        },
        "kills": kills,
        "ok": runs["transport"].get("false_deaths") == 0
        and runs["transport"].get("episodes_lost") == 0
        and (kills is None or (kills["all_within_bound"] and not kills["not_killed"])),
    }
    print(json.dumps(line))
    return 0 if line["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
