"""Launching an SGLang server process for an engine: its command line, its environment, its log, its end.

The command is `python -m sglang.launch_server --model-path ... --tp-size N --port P --mem-fraction-static F`
(plus `--context-length`, `--enable-deterministic-inference`, extra flags), run in its own process group
(TP workers included) with `CUDA_VISIBLE_DEVICES` set to the engine's GPUs, output appended to the engine's
log, and a parent-death signal: a broker that dies, even by SIGKILL, takes its servers with it.

The environment also turns off SGLang's vision-embedding cache (`SGLANG_VLM_CACHE_SIZE_MB=0`, unless set):
SGLang keeps the vision tower's outputs per image hash across weight updates (0.5.23 never clears that
cache, not even on `/flush_cache`), and guirl trains the vision tower, so a screenshot seen before an
update would reuse features of the old weights.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guirl.net import free_port
from guirl.proc import die_with_parent

log = logging.getLogger(__name__)

VLM_CACHE_ENV = "SGLANG_VLM_CACHE_SIZE_MB"


@dataclass
class LaunchSpec:
    """How to start one SGLang server process."""

    model_path: str
    gpus: list[str] = field(default_factory=list)
    """CUDA_VISIBLE_DEVICES of the server (empty: inherit)."""
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port."""
    mem_fraction_static: float = 0.8
    context_length: int = 0
    deterministic: bool = False
    """`--enable-deterministic-inference`: the server honours `sampling_seed`."""
    command: list[str] = field(default_factory=list)
    """The command before SGLang's flags (empty: `python -m sglang.launch_server`)."""
    extra_args: list[str] = field(default_factory=list)
    log_path: str = ""
    start_timeout_s: float = 1200.0

    def argv(self, port: int) -> list[str]:
        cmd = list(self.command) or [sys.executable, "-m", "sglang.launch_server"]
        cmd += ["--model-path", self.model_path, "--host", self.host, "--port", str(port)]
        cmd += ["--tp-size", str(self.tp_size), "--mem-fraction-static", f"{self.mem_fraction_static:g}"]
        if self.context_length:
            cmd += ["--context-length", str(self.context_length)]
        if self.deterministic:
            cmd += ["--enable-deterministic-inference"]
        return cmd + list(self.extra_args)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server's environment: `base` (this process's), its GPUs, no vision-embedding cache."""
        env = dict(os.environ if base is None else base)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        if env.setdefault(VLM_CACHE_ENV, "0") != "0":
            log.warning(
                "%s=%s is inherited: the server caches vision features across weight updates (stale ones, "
                "as guirl trains the vision tower)",
                VLM_CACHE_ENV,
                env[VLM_CACHE_ENV],
            )
        return env


def spawn_server(spec: LaunchSpec, name: str) -> tuple[subprocess.Popen, str, Any]:
    """Start the server of `spec` (engine `name`): its process, its URL, and its open log file (or None)."""
    port = spec.port or free_port(spec.host)
    log_file: Any = None
    if spec.log_path:
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        log_file = open(spec.log_path, "ab")  # noqa: SIM115 - the server writes it until it is closed
    argv = spec.argv(port)
    log.info("engine %s: launching %s", name, " ".join(argv))
    proc = subprocess.Popen(  # noqa: S603 - the configured launch command, not model output
        argv,
        env=spec.env(),
        stdout=log_file if log_file is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stopped whole, TP workers included
        # and SIGTERMed when the broker dies, even by SIGKILL: no GPUs held (the signal follows the thread
        # that starts it: the engine's, on the broker's event loop, which lives as long as the broker)
        preexec_fn=functools.partial(_die_with, os.getpid()),
    )
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return proc, f"http://{host}:{port}", log_file


def _die_with(parent: int) -> None:
    """In the server's process, before it runs: die with `parent`, and at once if it is already gone."""
    die_with_parent()
    if os.getppid() != parent:
        os._exit(1)


def log_tail(path: str, lines: int = 20) -> str:
    """ "; the end of PATH:" and its last `lines` lines, or "" when there is no log."""
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 8192))
        tail = f.read().decode("utf-8", "replace").splitlines()[-lines:]
    return f"; the end of {path}:\n" + "\n".join(tail)


def stop_server(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the server's process group, SIGKILL it after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # TP workers left in the group after the leader exited
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
