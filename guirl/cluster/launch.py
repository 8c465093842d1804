"""Starting actor processes on a cluster's hosts: one interface, three launchers.

The supervisor asks a `Launcher` for a process and gets an `ActorProcess` back: it waits for the process
to report ready (its bound endpoints), waits for it to exit (and why), and stops or kills it. What differs
between hosts is only how the process is started:

- `local`: a `spawn`ed child of this process, readiness and exit reason on a pipe (`SpawnProcess`, with
  the local launcher in `guirl.runtime.launch`: the supervisor needs it without any cluster);
- `ssh`: the OpenSSH client runs `PYTHON -m guirl.cluster.agent` on the host (`CommandProcess`);
- `slurm`: `srun` runs the same agent as a job step on the host's node (`CommandProcess`).

The agent reads the actor's spec and the run's config as one line on stdin, reports on stdout (a JSON line
when ready, one when it exits cleanly) and logs on stderr. Its stdin stays open for as long as the
supervisor wants it: EOF (the launcher exited, was killed, or its SSH connection or `srun` died) stops the
actor — the cross-host counterpart of the local children's parent-death signal. Every agent's command line
carries `--cluster NAME --host HOST`, which is how `bin/launch_cluster --down` finds leftovers on a host.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import os
import shlex
import signal
import sys
from collections import deque
from typing import Any

import msgspec

from guirl.cluster.spec import Host
from guirl.proc import die_with_parent
from guirl.runtime.launch import ActorStartError, LocalLauncher

log = logging.getLogger(__name__)
AGENT_MODULE = "guirl.cluster.agent"


# -- ssh and slurm: an agent command whose stdio is the channel --------------------------------------


# runs in the child before exec: an ssh/srun client dies if the process that started it does
die_with_us = functools.partial(die_with_parent, signal.SIGKILL)


def agent_payload(spec_bytes: bytes, cfg_bytes: bytes) -> bytes:
    """The agent's first stdin line: the spec and config, msgpack, base64 (no newline inside)."""
    return base64.b64encode(msgspec.msgpack.encode([spec_bytes, cfg_bytes])) + b"\n"


class CommandProcess:
    """An actor run by `argv` (ssh or srun around the agent); the command's stdio carries its reports."""

    TAIL = 40

    def __init__(
        self, argv: list[str], payload: bytes, name: str, *, env: dict[str, str] | None = None
    ) -> None:
        self.argv, self.payload, self.name, self.env = argv, payload, name, env
        self.proc: asyncio.subprocess.Process | None = None
        self.pid = 0
        self.client_pid = 0
        self.exitcode: int | None = None
        self.tail: deque[str] = deque(maxlen=self.TAIL)
        self.load: float | None = None
        self.reports: asyncio.Queue[dict] = asyncio.Queue()
        self._exit: dict = {}
        self._tasks: list[asyncio.Task] = []

    async def _start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_us,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the launcher, which stops us in order
            env=self.env,
            limit=1 << 20,
        )
        self.client_pid = self.proc.pid
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.payload)
        with contextlib.suppress(ConnectionError):
            await self.proc.stdin.drain()
        self._tasks = [
            asyncio.create_task(self._read_reports(), name=f"reports:{self.name}"),
            asyncio.create_task(self._read_log(), name=f"log:{self.name}"),
        ]

    async def _read_reports(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in _lines(self.proc.stdout):
            line = raw.decode("utf-8", "replace").strip()
            try:
                report = json.loads(line)
            except ValueError:
                report = None
            if isinstance(report, dict) and "load" in report:  # the agent's report of its host's load
                with contextlib.suppress(TypeError, ValueError):
                    self.load = float(report["load"])
                continue
            if not (isinstance(report, dict) and ("ready" in report or "exit" in report)):
                self._log_line(line)  # anything else on stdout (a library, a child process) is log
                continue
            if "exit" in report:
                self._exit = report
            await self.reports.put(report)

    async def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in _lines(self.proc.stderr):
            self._log_line(raw.decode("utf-8", "replace").rstrip("\n"))

    def _log_line(self, line: str) -> None:
        if not line:
            return
        if len(line) > 8192:
            line = line[:8192] + f" … ({len(line) - 8192} more characters)"
        self.tail.append(line)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line + "\n")  # the actor's log, as a local child's would be

    def log_tail(self) -> str:
        return "\n".join(self.tail)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def ready(self, name: str, timeout: float) -> dict:
        if self.proc is None:
            try:
                await self._start()
            except OSError as exc:
                raise ActorStartError(f"actor {name}: cannot run {self.argv[0]!r}: {exc}") from None
        assert self.proc is not None
        exited = asyncio.create_task(self.proc.wait())
        report_task = asyncio.create_task(self.reports.get())
        try:
            done, _ = await asyncio.wait(
                {exited, report_task}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
            if report_task in done and "ready" in report_task.result():
                report = report_task.result()
                self.pid = int(report.get("pid", 0))
                return report
            if exited in done or report_task in done:
                with contextlib.suppress(TimeoutError):  # the rest of its log, if it comes soon
                    await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 5.0)
                raise ActorStartError(
                    f"actor {name} exited with {self.proc.returncode} before ready; its log ends:\n"
                    f"{self.log_tail() or '(nothing)'}"
                )
            raise ActorStartError(
                f"actor {name} not ready within {timeout} s; its log ends:\n{self.log_tail() or '(nothing)'}"
            )
        finally:
            for task in (exited, report_task):
                task.cancel()

    async def wait(self) -> int | None:
        assert self.proc is not None
        code = await self.proc.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # its last reports and log lines
        self.exitcode = code
        return code

    def exit_info(self) -> dict:
        return self._exit

    def terminate(self) -> None:
        """Close its stdin: the agent stops the actor gracefully (as a local child does on SIGTERM)."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    def kill(self) -> None:
        """Kill the client (ssh/srun): the agent sees EOF and stops; a step left behind is `--down`'s."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()


async def _lines(stream: asyncio.StreamReader):
    """The stream's lines; one longer than the reader's limit is replaced by a note instead of ending the
    reading (a reader that stops would leave the remote process blocked on a full pipe)."""
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # over the limit: asyncio dropped it
            yield b"(a line over 1 MiB was dropped)\n"
            continue
        if not raw:
            return
        yield raw


def agent_argv(python: str, cluster: str, host: str, name: str) -> list[str]:
    return [python, "-m", AGENT_MODULE, "--cluster", cluster, "--host", host, "--actor", name]


class CommandLauncher:
    """Common part of `ssh` and `slurm`: the agent command wrapped by the host's launcher command."""

    def __init__(self, name: str, host: Host, cluster: str) -> None:
        self.host, self.spec, self.cluster = name, host, cluster

    @property
    def python(self) -> str:
        return self.spec.python or sys.executable

    def agent_env(self) -> dict[str, str]:
        from guirl.net import HOST_ADDRESS_ENV

        return {HOST_ADDRESS_ENV: self.spec.address, "PYTHONUNBUFFERED": "1"}

    def wrap(self, argv: list[str]) -> list[str]:
        raise NotImplementedError

    def start(self, spec_bytes: bytes, cfg_bytes: bytes, name: str) -> CommandProcess:
        argv = self.wrap(agent_argv(self.python, self.cluster, self.host, name))
        return CommandProcess(argv, agent_payload(spec_bytes, cfg_bytes), name)

    def run_argv(self, argv: list[str]) -> list[str]:
        """A one-off command on the host (the teardown's), wrapped as the agent's would be."""
        return self.wrap(argv)

    async def before_restart(self, name: str) -> None:
        """Kill whatever is left of the actor's last incarnation on the host. Its client (ssh, srun) died,
        but the agent may not have noticed yet (a network cut sshd has not seen): a new one beside it would
        find its endpoints taken, or play its episodes twice."""
        pattern = f"guirl[.]cluster[.]agent --cluster {self.cluster} --host {self.host} --actor {name}$"
        proc = await asyncio.create_subprocess_exec(
            *self.run_argv(["pkill", "-KILL", "-f", pattern]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await asyncio.wait_for(proc.wait(), 60.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class SSHLauncher(CommandLauncher):
    """The OpenSSH client: `ssh [-p PORT] [-o ...] [USER@]ADDRESS 'cd WORKDIR && exec env ... CMD'`."""

    DEFAULTS = ("BatchMode=yes", "ServerAliveInterval=5", "ServerAliveCountMax=3", "ConnectTimeout=15")

    def ssh_base(self) -> list[str]:
        h = self.spec
        argv = ["ssh", "-T", "-p", str(h.ssh_port)]
        for opt in (*h.ssh_options, *self.DEFAULTS):  # ssh keeps the first value given: the host's own win
            argv += ["-o", opt]
        argv += ["--", f"{h.ssh_user}@{h.address}" if h.ssh_user else h.address]
        return argv

    def wrap(self, argv: list[str]) -> list[str]:
        env = [f"{k}={v}" for k, v in self.agent_env().items()]
        remote = shlex.join(["env", *env, *argv])
        if self.spec.workdir:
            remote = f"cd {shlex.quote(self.spec.workdir)} && exec {remote}"
        else:
            remote = f"exec {remote}"
        return [*self.ssh_base(), remote]


class SlurmLauncher(CommandLauncher):
    """`srun`: one job step per actor on the host's node, named `guirl-<cluster>` (what `--down` cancels)."""

    def wrap(self, argv: list[str]) -> list[str]:
        h = self.spec
        out = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={job_name(self.cluster)}",
            "--kill-on-bad-exit=1",
        ]
        out.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in self.agent_env().items()))
        if os.environ.get("SLURM_JOB_ID"):  # steps of the launcher's allocation share its resources
            out.append("--overlap")
        if h.slurm_node:
            out.append(f"--nodelist={h.slurm_node}")
        if h.workdir:
            out.append(f"--chdir={h.workdir}")
        return [*out, *h.slurm_args, *argv]


def job_name(cluster: str) -> str:
    return f"guirl-{cluster}"


def make_launcher(name: str, host: Host, cluster: str) -> Any:
    if host.launcher == "local":
        return LocalLauncher(name)
    if host.launcher == "ssh":
        return SSHLauncher(name, host, cluster)
    return SlurmLauncher(name, host, cluster)
