"""Starting actor processes: the interface every launcher implements, and the local one.

The supervisor asks a `Launcher` for a process and gets an `ActorProcess` back: it waits for the process
to report ready (its bound endpoints), waits for it to exit (and why), and stops or kills it. Here: the
`local` launcher, a `spawn`ed child of this process reporting readiness and its exit reason on a pipe
(`SpawnProcess`). The launchers that start actors on other hosts (SSH, Slurm) are in `guirl.cluster.launch`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import time
from typing import Protocol

import msgspec

log = logging.getLogger(__name__)
_spawn = mp.get_context("spawn")


class ActorStartError(RuntimeError):
    """An actor process died or stayed silent before reporting ready."""


async def wait_fd(fd: int | list[int], timeout: float | None) -> bool:
    """True once one of the fds is readable (a pipe message or a process sentinel), False on timeout."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fds = fd if isinstance(fd, list) else [fd]
    for f in fds:
        loop.add_reader(f, lambda: fut.done() or fut.set_result(None))
    try:
        await asyncio.wait_for(fut, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        for f in fds:
            loop.remove_reader(f)


class ActorProcess(Protocol):
    """One incarnation of an actor, however it was started."""

    pid: int
    """The actor's pid on its host (0 before it reported ready, if it runs elsewhere)."""
    exitcode: int | None

    def alive(self) -> bool: ...
    async def ready(self, name: str, timeout: float) -> dict: ...
    async def wait(self) -> int | None: ...
    def exit_info(self) -> dict: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def signal(self, sig: int) -> None: ...
    def close(self) -> None: ...


class Launcher(Protocol):
    host: str

    def start(self, spec_bytes: bytes, cfg_bytes: bytes, name: str) -> ActorProcess: ...


class SpawnProcess:
    """A `spawn`ed child running `guirl.runtime.process.actor_main`; it reports on a pipe."""

    def __init__(self, spec_bytes: bytes, cfg_bytes: bytes, name: str) -> None:
        from guirl.runtime.process import actor_main

        self.conn, send_conn = _spawn.Pipe(duplex=False)
        self.process = _spawn.Process(
            target=actor_main, name=f"guirl:{name}", args=(spec_bytes, cfg_bytes, send_conn, os.getpid())
        )
        self.process.start()
        send_conn.close()  # ours stays open: a clean exit reports its reason on it
        self.pid = self.process.pid or 0
        self.exitcode: int | None = None

    def alive(self) -> bool:
        return self.process.is_alive()

    async def ready(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while not self.conn.poll():
            remaining = deadline - time.monotonic()
            if not self.process.is_alive():
                raise ActorStartError(f"actor {name} exited with {self.process.exitcode} before ready")
            if remaining <= 0:
                raise ActorStartError(f"actor {name} not ready within {timeout} s")
            await wait_fd([self.conn.fileno(), self.process.sentinel], remaining)  # ready, or dead
        try:
            return msgspec.msgpack.decode(self.conn.recv_bytes())
        except EOFError:
            raise ActorStartError(f"actor {name} exited before ready") from None

    async def wait(self) -> int | None:
        """Its exit code (the caller alone waits on the process: an fd has one reader per loop)."""
        await wait_fd(self.process.sentinel, None)
        self.process.join()
        self.exitcode = self.process.exitcode
        return self.exitcode

    def exit_info(self) -> dict:
        try:
            if self.conn.poll():
                info = msgspec.msgpack.decode(self.conn.recv_bytes())
                return info if isinstance(info, dict) else {}
        except (EOFError, OSError, msgspec.DecodeError):
            pass
        return {}

    def terminate(self) -> None:
        if self.process.is_alive():
            self.process.terminate()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def close(self) -> None:
        self.conn.close()


class LocalLauncher:
    """Processes on this machine, as children of the supervising process."""

    def __init__(self, host: str = "local") -> None:
        self.host = host

    def start(self, spec_bytes: bytes, cfg_bytes: bytes, name: str) -> SpawnProcess:
        return SpawnProcess(spec_bytes, cfg_bytes, name)
