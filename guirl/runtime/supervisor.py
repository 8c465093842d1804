"""The supervisor: starts actor processes (spawned children, or through a cluster host's launcher: ssh,
srun — `guirl.cluster.launch`), waits for them to be ready, restarts crashed ones with exponential backoff,
reports every start/exit/restart as an event, and stops them gracefully.

A restarted actor rebinds the endpoints its first incarnation actually bound (a random tcp port stays
the same), so its peers' connections find it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from guirl.config import GuirlConfig
from guirl.runtime.launch import ActorStartError, LocalLauncher
from guirl.runtime.process import ActorSpec, check_options

__all__ = ["ActorHandle", "ActorStartError", "Supervisor", "SupervisorEvent"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupervisorEvent:
    """Something that happened to a supervised actor."""

    kind: str  # started | exited | restarted | gave_up | start_failed | stopped | completed | shut_down
    name: str
    pid: int = 0
    exitcode: int | None = None
    restarts: int = 0
    detail: str = ""
    at: float = field(default_factory=time.time)


@dataclass
class ActorHandle:
    """A supervised actor: its spec, current process (`guirl.cluster.launch.ActorProcess`), actual
    endpoints, restart history."""

    spec: ActorSpec
    process: Any = None
    endpoints: list[str] = field(default_factory=list)
    restarts: int = 0
    recent_exits: deque = field(default_factory=deque)
    stopping: bool = False
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    watcher: asyncio.Task | None = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


class Supervisor:
    """Owns a set of actor processes for one run. Use `async with Supervisor(cfg) as sup:`."""

    def __init__(
        self, cfg: GuirlConfig, *, run_dir: str = "", launchers: dict[str, Any] | None = None
    ) -> None:
        """`launchers`: host name -> `guirl.cluster.launch.Launcher`; an actor whose spec names a host
        starts through that host's launcher, every other one as a local child."""
        self.cfg = cfg
        self.launchers = launchers or {}
        self._local = LocalLauncher()
        self.sc = cfg.supervisor
        self.run_dir = run_dir
        self.actors: dict[str, ActorHandle] = {}
        self.history: list[SupervisorEvent] = []
        self._waiters: list[asyncio.Future] = []
        self._cfg_bytes = msgspec.msgpack.encode(cfg)

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop_all()

    def _emit(self, event: SupervisorEvent) -> None:
        self.history.append(event)
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        level = logging.WARNING if event.kind in ("exited", "gave_up", "start_failed") else logging.INFO
        facts = [f"pid {event.pid}"] if event.pid else []
        if event.exitcode is not None:
            facts.append(f"exit code {event.exitcode}")
        if event.restarts:
            facts.append(f"{event.restarts} restarts")
        detail = f": {event.detail}" if event.detail else ""
        log.log(level, "actor %s %s (%s)%s", event.name, event.kind, ", ".join(facts), detail)

    async def _spawn(self, handle: ActorHandle, spec: ActorSpec) -> None:
        if not spec.run_dir and self.run_dir:
            spec = msgspec.structs.replace(spec, run_dir=self.run_dir)
        if spec.host and spec.host not in self.launchers:
            raise ActorStartError(f"actor {spec.name}: no launcher for host {spec.host!r}")
        launcher = self.launchers.get(spec.host, self._local)
        if handle.process is not None:  # a restart: nothing of the last incarnation may be left running
            handle.process.close()
            if hasattr(launcher, "before_restart"):
                await launcher.before_restart(spec.name)
        proc = launcher.start(msgspec.msgpack.encode(spec), self._cfg_bytes, spec.name)
        handle.process = proc
        try:
            info = await proc.ready(spec.name, self.sc.start_timeout_s)
        except BaseException:  # not ready, or our caller gave up (cancelled): leave no orphan behind
            proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10.0)
            raise
        handle.endpoints = list(info["endpoints"])

    async def start(self, spec: ActorSpec) -> ActorHandle:
        """Start an actor and wait until it is ready; its endpoints are in the returned handle. Its options
        are checked first (`ActorOptionsError` naming the key, before any process starts)."""
        if spec.name in self.actors:
            raise ValueError(f"an actor named {spec.name!r} is already supervised")
        check_options(spec)
        handle = ActorHandle(spec=spec)
        await self._spawn(handle, spec)
        self.actors[spec.name] = handle
        self._emit(SupervisorEvent("started", spec.name, handle.pid))
        handle.watcher = asyncio.create_task(self._watch(handle), name=f"watch:{spec.name}")
        return handle

    async def _watch(self, handle: ActorHandle) -> None:
        name = handle.spec.name
        while True:
            code = await handle.process.wait()
            if handle.stopping:
                self._emit(SupervisorEvent("stopped", name, handle.pid, code, handle.restarts))
                return
            info = handle.process.exit_info() if code == 0 else {}
            if info.get("exit") == "completed":  # its main returned: the work is done
                self._emit(SupervisorEvent("completed", name, handle.pid, code, handle.restarts))
                return
            if info.get("exit") == "shutdown":  # asked to stop (a Shutdown message, a signal): not a crash
                reason = str(info.get("reason", ""))
                self._emit(SupervisorEvent("shut_down", name, handle.pid, code, handle.restarts, reason))
                return
            now = time.monotonic()
            handle.recent_exits.append(now)
            while handle.recent_exits and now - handle.recent_exits[0] > self.sc.restart_window_s:
                handle.recent_exits.popleft()
            self._emit(SupervisorEvent("exited", name, handle.pid, code, handle.restarts))
            if len(handle.recent_exits) > self.sc.max_restarts:
                self._emit(
                    SupervisorEvent(
                        "gave_up",
                        name,
                        handle.pid,
                        code,
                        handle.restarts,
                        f"{len(handle.recent_exits)} exits in {self.sc.restart_window_s} s",
                    )
                )
                return
            delay = min(
                self.sc.restart_backoff_initial_s * 2 ** (len(handle.recent_exits) - 1),
                self.sc.restart_backoff_max_s,
            )
            with contextlib.suppress(TimeoutError):  # the backoff, cut short by stop()
                await asyncio.wait_for(handle.stop_requested.wait(), delay)
            if handle.stopping:
                self._emit(SupervisorEvent("stopped", name, handle.pid, code, handle.restarts))
                return
            # pin the endpoints actually bound, so a random port survives the restart
            spec = msgspec.structs.replace(handle.spec, bind=handle.endpoints or handle.spec.bind)
            try:
                await self._spawn(handle, spec)
            except Exception as exc:  # counted as another exit on the next turn of the loop
                if handle.stopping:
                    self._emit(SupervisorEvent("stopped", name, 0, None, handle.restarts))
                    return
                self._emit(SupervisorEvent("start_failed", name, 0, None, handle.restarts, str(exc)))
                continue
            handle.restarts += 1
            self._emit(SupervisorEvent("restarted", name, handle.pid, None, handle.restarts))
            if handle.stopping:  # stop() came while it was starting: it found nothing to terminate then
                handle.process.terminate()

    async def wait_event(
        self, kind: str, name: str | None = None, *, after: int = 0, timeout: float = 30.0
    ) -> SupervisorEvent:
        """The first event of `kind` (for `name`) at index >= `after` in `history`, waiting for it if
        needed (TimeoutError after `timeout`). Take `after = len(sup.history)` before causing an event."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        index = after
        while True:
            for ev in self.history[index:]:
                if ev.kind == kind and (name is None or ev.name == name):
                    return ev
            index = len(self.history)
            fut = loop.create_future()
            self._waiters.append(fut)
            await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))

    async def stop(self, name: str, timeout: float | None = None) -> int | None:
        """Graceful stop: SIGTERM (the actor drains and closes), SIGKILL after `timeout`. Returns the
        exit code. The watcher task alone waits on the process (an fd has one reader per loop)."""
        handle = self.actors.get(name)
        if handle is None:  # already stopped (or being stopped by another caller, which waits for it)
            return None
        handle.stopping = True
        handle.stop_requested.set()
        timeout = self.sc.stop_timeout_s if timeout is None else timeout
        proc = handle.process
        if proc is not None and proc.alive():
            proc.terminate()
        if handle.watcher is not None and not handle.watcher.done():
            try:
                await asyncio.wait_for(asyncio.shield(handle.watcher), timeout)
            except TimeoutError:
                log.warning("actor %s did not stop within %.1f s; killing it", name, timeout)
                if handle.process is not None:
                    handle.process.kill()
                await asyncio.wait_for(handle.watcher, 10.0)
        elif proc is not None and proc.alive():
            proc.kill()
            await asyncio.wait_for(proc.wait(), timeout)
        self.actors.pop(name, None)
        proc = handle.process
        if proc is not None:
            proc.close()
        return proc.exitcode if proc is not None else None

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(n) for n in list(self.actors)))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send a signal to an actor's process (fault injection in tests and the demo); for an actor on
        another host, to the local client (ssh, srun) whose end the remote agent sees as EOF."""
        handle = self.actors[name]
        handle.process.signal(sig)
        return handle.pid
