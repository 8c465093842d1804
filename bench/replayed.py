"""Runs of `guirl` on replayed desktops for the benches (bench/control_plane.py, bench/decoupling.py): the
settings they share (replayed desktops, the scripted latency model), the subprocess that runs one, and their
argument types."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from guirl.config.schema import ENV_VARS  # noqa: E402


def numbers(text: str, kind: type = int) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want positive numbers, comma-separated")
    return values


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a number above 0")
    return value


def screen(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want WIDTHxHEIGHT") from None
    if not (64 <= w <= 8192 and 64 <= h <= 8192):
        raise argparse.ArgumentTypeError(f"{text!r}: sides of 64 to 8192 pixels")
    return w, h


def replayed_settings(args: argparse.Namespace, n: int, workers: int, rec: dict) -> list[str]:
    """What this bench and bench/decoupling.py share: `n` desktops replaying `rec` (each step `args.period`
    minus `args.engine_s` on the desktop), over `workers` env workers, and the scripted latency model
    (`args.engine_s` per request, streamed) as the policy; screens shown as they are (`args.max_pixels`)."""
    w, h = args.screen
    return [
        "inference.backend=scripted",
        "inference.engines=1",
        "inference.dispatch=stream",
        f"inference.max_batch={n}",
        f"inference.max_queue={max(256, 2 * n)}",
        f"inference.scripted.dir={rec['scripts']}",
        f"inference.scripted.latency_s={args.engine_s}",
        f"inference.scripted.latency_jitter={args.jitter}",
        "env.provider=replay",
        f"env.replay.run={rec['root']}",
        f"env.replay.step_latency_s={args.period - args.engine_s}",
        f"env.replay.step_jitter={args.jitter}",
        "env.action_space=computer_use",
        f"env.screen_width={w}",
        f"env.screen_height={h}",
        f"env.max_envs={n}",
        f"env.prewarm_envs={n}",
        f"env.workers={workers}",
        f"agent.max_pixels={args.max_pixels}",
        "agent.sleep_after_action_s=0",
        "logging.level=WARNING",
        *args.set,
    ]


def run_guirl(mode: str, config: Path, settings: list[str], timeout: float, watch: Any = None) -> tuple:
    """`bin/guirl MODE --config CONFIG --set ...` as a subprocess in a session of its own (its whole tree is
    killed past `timeout`), watched by `watch(pid)` (a context manager: a `Sampler`) while it runs. Returns
    (its exit code, None when it timed out; its output; its pid; the watcher)."""
    overrides = [x for s in settings for x in ("--set", s)]
    cmd = [sys.executable, str(ROOT / "bin" / "guirl"), mode, "--config", str(config), *overrides]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        cmd, stdout=pipe, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True
    )
    watcher = watch(proc.pid) if watch is not None else contextlib.nullcontext()
    with watcher:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, "", proc.pid, watcher
    return proc.returncode, out, proc.pid, watcher


@contextlib.contextmanager
def scratch(prefix: str, *, keep: bool) -> Iterator[Path]:
    """A temporary directory for a bench's recording and runs: removed at the end, or kept (and said)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    finally:
        if keep:
            print(f"kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
