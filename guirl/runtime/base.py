"""The actor runtime: one process, one event loop (uvloop), one ROUTER mailbox, any number of connections.

An actor owns its sockets, receives typed messages on its mailbox, answers them from `handle`, and talks
to other actors through `Connection`s. It heartbeats every peer and tells a dead peer from a busy one (see
`connection.py`), keeps every queue bounded and counts every drop by reason, and shuts down on a `Shutdown`
message or SIGTERM: stop accepting → drain in-flight requests → cancel `main` and settle what others count as
done (`settle`) → say goodbye and close the sockets (linger 0 beyond the goodbye) → terminate the context
with a timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import zmq

from guirl.log import log_fields
from guirl.messages import Codec, CodecLimits, DiagChannel, Header, IdGen
from guirl.messages.types import Heartbeat, Message, StatsReply
from guirl.runtime.connection import Connection
from guirl.runtime.mailbox import Mailbox, Request
from guirl.runtime.security import CurveSecurity, load_keys
from guirl.runtime.sockets import peer_label
from guirl.runtime.stats import Counters

log = logging.getLogger(__name__)

STALL_PERIOD_S = 0.05
"""How often the stall watcher wakes (its resolution)."""

MAX_RECORD_FAILURES = 10
"""Write errors after which an actor stops recording (and says so) rather than failing on each message."""


class Actor:
    """Base class of every guirl actor. Subclasses set `channel`, override `handle` and/or `main`."""

    channel: ClassVar[Any] = DiagChannel
    """The union of message types this actor's mailbox accepts (control messages always included)."""
    role: ClassVar[str] = ""
    """Its role in a run (`learner`, `broker`, ...): picks its progress deadline
    (`runtime.progress_timeout_by_role`)."""
    Options: ClassVar[type | None] = None
    """Its typed options (a msgspec Struct refusing unknown fields), the constructor's second argument: what
    an `ActorSpec`'s `options` must convert to, checked before the process starts (`check_options`). None:
    it takes none from a spec (the coordinators, built in the driver's process with keyword arguments)."""

    def __init__(
        self,
        name: str,
        *,
        runtime: Any,
        codec: Any = None,
        bind: Sequence[str] = (),
        recorder: Any = None,
    ) -> None:
        self.name = name
        self.runtime = runtime
        self.limits = (
            codec
            if isinstance(codec, CodecLimits)
            else (CodecLimits.from_config(codec) if codec is not None else CodecLimits())
        )
        self.bind_endpoints = list(bind)
        self.recorder = recorder
        self.endpoints: list[str] = []  # actual bound endpoints (tcp port 0 resolved)
        self.counters = Counters()
        self.ids = IdGen()
        self.incarnation = os.urandom(6).hex()
        self.codec = Codec(self.limits)
        self.policy_version = -1
        self.connections: dict[str, Connection] = {}
        self.stopping = False
        self.ctx: zmq.Context | None = None
        self.mailbox: Mailbox | None = None
        self.security: CurveSecurity | None = None  # CURVE + ZAP, when runtime.curve_keys_dir is set
        self._stop = asyncio.Event()
        self.stop_reason = ""
        self.completed = False  # main() returned: the actor finished its work
        self._drop_log_at = 0.0
        self._fatal: BaseException | None = None
        self._record_failures = 0
        self._pushes: asyncio.Queue | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._busy: collections.Counter[str] = collections.Counter()  # heavy work under way (`busy`)
        self.stall_max_s = 0.0  # the longest its event loop went without running a ready callback

    # -- hooks for subclasses ----------------------------------------------------------------------

    async def setup(self) -> None:
        """Open connections (`self.connect`) and resources; runs before the actor reports ready."""

    async def main(self) -> None:
        """The actor's own work loop. Returning ends the actor; the default waits for shutdown."""
        await self._stop.wait()

    async def handle(self, req: Request) -> Message | None:
        """Answer one mailbox message; a returned message is sent back as the reply."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(req.msg).__name__}")

    async def on_push(self, conn: Connection, header: Header, msg: Message) -> None:
        """A message a connected peer sent us unasked (not a reply)."""
        self.counters["received.unsolicited"] += 1

    def on_peer_dead(self, name: str, error: Exception) -> None:
        """A peer (mailbox client or connection) missed its heartbeats."""

    def on_peer_restarted(self, name: str) -> None:
        """A peer we connect to came back as a new process (its heartbeats carry a new incarnation), whether
        or not it had been declared dead meanwhile: whatever state it held is gone."""

    def on_peer_left(self, name: str) -> None:
        """A peer said goodbye: a mailbox client closing its connection, or a peer we connect to shutting
        down."""

    async def teardown(self) -> None:
        """Release resources after the sockets are closed."""

    # -- public API --------------------------------------------------------------------------------

    def connect(self, name: str, endpoint: str, channel: Any) -> Connection:
        """A connection to another actor's mailbox; usable once `setup` has returned."""
        if self.ctx is None:
            raise RuntimeError("connect() is for setup() or later, once the actor runs")
        conn = Connection(self, name, endpoint, channel)
        self.connections[name] = conn
        conn.open()
        return conn

    @property
    def busy_with(self) -> str:
        """The heavy work under way, announced in every heartbeat (several tasks may be busy at once)."""
        return ",".join(sorted(self._busy))

    @property
    def patience_s(self) -> float:
        """The progress deadline this actor announces to its peers: how long they may hear nothing from it,
        its connections alive, before they take it for hung (longer while it is `busy`)."""
        rt = self.runtime
        usual = getattr(rt.progress_timeout_by_role, self.role, 0.0) or rt.progress_timeout_s
        return max(usual, rt.busy_timeout_s) if self.busy_with else usual

    def heartbeat(self, inflight: int = 0, **fields: Any) -> Heartbeat:
        return Heartbeat(
            inflight=inflight,
            incarnation=self.incarnation,
            patience_s=self.patience_s,
            busy=self.busy_with,
            **fields,
        )

    @contextlib.contextmanager
    def busy(self, what: str) -> Any:
        """Around heavy work that may starve the event loop (a checkpoint save, a weight gather or load, run
        on a thread that holds the GIL): every peer is told at once, and waits `runtime.busy_timeout_s` for
        this actor rather than its usual progress deadline. A busy actor is never dead while its
        connections are alive (ZeroMQ's I/O threads answer for it), only late."""
        self._busy[what] += 1
        self.counters[f"busy.{what}"] += 1
        self._beat_now()
        try:
            yield
        finally:
            self._busy[what] -= 1
            if self._busy[what] <= 0:
                del self._busy[what]
            self._beat_now()

    def hold_gil(self, seconds: float) -> None:
        """Fault injection (`HoldGil`): block every Python thread of this process for `seconds`, on the
        event loop's thread, as C code that keeps the GIL does (libc's `usleep` called through
        `ctypes.PyDLL`, which does not release it). ZeroMQ's I/O threads go on."""
        self.counters["faults.gil_held"] += 1
        log.warning("fault injection: holding the GIL for %.2f s", seconds)
        ctypes.PyDLL(None).usleep(ctypes.c_uint(int(seconds * 1_000_000)))

    def _beat_now(self) -> None:
        if self.loop is None or self.stopping:
            return
        if self.mailbox is not None:
            self.mailbox.beat_all()
        for conn in self.connections.values():
            conn.send_heartbeat()

    def request_shutdown(self, reason: str = "") -> None:
        if not self._stop.is_set():
            self.stop_reason = reason
            log.info("shutdown requested: %s", reason or "no reason given")
            self._stop.set()

    async def reply(self, req: Request, msg: Message) -> bool:
        """Send `msg` to the sender of `req`. Returns False (and counts) if it could not be routed."""
        return self.mailbox.send(req.peer, msg, reply_to=req.header.msg_id)

    def push(self, peer_ident: bytes, msg: Message) -> bool:
        """Send an unsolicited message to a mailbox peer."""
        return self.mailbox.send([peer_ident], msg)

    def stats(self) -> StatsReply:
        return StatsReply(
            actor=self.name,
            counters=self.counters.snapshot(),
            peers=[peer_label(p) for p in (self.mailbox.peers if self.mailbox else ())],
        )

    # -- running -----------------------------------------------------------------------------------

    async def run(self, ready: Any = None, *, handle_signals: bool = False) -> None:
        """Run until shutdown. `ready(endpoints)` is called once the mailbox is bound and setup is done.
        With `handle_signals` (the actor owns its process), SIGTERM and SIGINT request a shutdown."""
        self.loop = asyncio.get_running_loop()
        self.ctx = zmq.Context()
        self._pushes = asyncio.Queue(maxsize=self.runtime.inbox_max)
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        settled = False
        try:
            if getattr(self.runtime, "curve_keys_dir", ""):
                keys = load_keys(self.runtime.curve_keys_dir)
                self.security = CurveSecurity(keys, self.ctx, self.counters, self.crash)
            if self.bind_endpoints:
                self.mailbox = Mailbox(self, self.bind_endpoints)
                self.endpoints = self.mailbox.endpoints
            for sig in signals:
                self.loop.add_signal_handler(sig, self.request_shutdown, sig.name)
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._heartbeat_loop(), name="heartbeat"),
                    tg.create_task(self._push_loop(), name="pushes"),
                    tg.create_task(self._watch_stalls(), name="stalls"),
                ]
                # setup may take long (a model to load): a shutdown request must not wait for it
                setup = tg.create_task(self.setup(), name="setup")
                stopped = tg.create_task(self._stop.wait(), name="stop")
                await asyncio.wait([setup, stopped], return_when=asyncio.FIRST_COMPLETED)
                serving = not self._stop.is_set()
                if serving:
                    if self.mailbox is not None:
                        tasks += [
                            tg.create_task(self.mailbox.worker(), name=f"worker{i}")
                            for i in range(self.runtime.max_concurrency)
                        ]
                    tasks.append(tg.create_task(self._run_main(), name="main"))
                    if ready is not None:
                        ready(self.endpoints)
                    await stopped
                tasks.append(setup)
                self.stopping = True
                if serving and self._fatal is None and self.mailbox is not None:
                    await self.mailbox.drain(self.runtime.shutdown_timeout_s)
                if serving and self._fatal is None:
                    # main first (no new work), then what others already count as done, heartbeats still
                    # going out meanwhile (a settling actor is not a silent one)
                    main = next(t for t in tasks if t.get_name() == "main")
                    main.cancel()
                    await asyncio.wait([main])
                    await self.settle(self.runtime.shutdown_timeout_s)
                    settled = True
                for t in tasks:
                    t.cancel()
        finally:
            self.stopping = True
            for sig in signals:
                self.loop.remove_signal_handler(sig)
            if not settled:  # a crash or a cancellation: what was under way is abandoned, not left running
                await self.settle(0.0)
            await self._close()
            c = self.counters
            log.info(
                "liveness: loop stall max %.2f s, %d peer(s) declared dead (%d hung)",
                self.stall_max_s,
                c["peers.dead"],
                c["peers.hung"],
                extra=log_fields(
                    liveness=True,
                    stall_max_s=round(self.stall_max_s, 3),
                    stalls_over_1s=c["loop.stalls_over_1s"],
                    peers_dead=c["peers.dead"],
                    peers_hung=c["peers.hung"],
                    requests_waited_busy=c["requests.waited_busy"],
                ),
            )
        if self._fatal is not None:
            raise self._fatal

    async def start(self) -> asyncio.Task:
        """Run this actor in the current event loop, beside other work: returns its `run` task once it
        is ready, or raises whatever stopped it before that (a port in use, a failing setup)."""
        ready = asyncio.Event()
        task = asyncio.create_task(self.run(lambda _endpoints: ready.set()), name=f"actor:{self.name}")
        waiter = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if not ready.is_set():
            task.result()  # raises the start-up error
            raise RuntimeError(f"actor {self.name} stopped before it was ready: {self.stop_reason}")
        return task

    def crash(self, exc: BaseException) -> None:
        """An internal error in a socket callback: stop now and let `run` raise it (the supervisor
        restarts the process). A bug must not be logged and forgotten."""
        log.error("internal error, stopping: %r", exc, exc_info=exc)
        if self._fatal is None:
            self._fatal = exc
        self.request_shutdown(f"internal error: {exc!r}")

    async def settle(self, timeout: float) -> None:
        """On a graceful shutdown, after `main` is cancelled and before the sockets close: finish work that
        another actor already counts as done (an env worker's end report the coordinator may have taken),
        in at most `timeout` seconds, and cancel what is left (`timeout` 0 after a crash)."""

    async def _run_main(self) -> None:
        try:
            await self.main()
            self.completed = not self._stop.is_set()  # the default main just waits for a shutdown
        finally:  # whatever ended main (return, error, a stray cancellation), the actor stops with it
            self.request_shutdown("main returned" if self.completed else "main ended")

    async def _close(self) -> None:
        for conn in self.connections.values():
            conn.close()
        if self.mailbox is not None:
            self.mailbox.close()
        if self.security is not None:  # after the sockets it secured: a mailbox never runs without ZAP
            self.security.close()
        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            # term() blocks while any socket is open; every socket above is closed with linger 0, but
            # a leaked one must not hang the process forever.
            done = threading.Event()
            threading.Thread(target=lambda: (ctx.term(), done.set()), daemon=True).start()
            if not await asyncio.to_thread(done.wait, self.runtime.term_timeout_s):
                log.error("zmq context did not terminate within %.1f s", self.runtime.term_timeout_s)
        try:
            await self.teardown()
        finally:
            if self.recorder is not None:
                self.recorder.close()

    def log_drop(self, peer: str, exc: Exception) -> None:
        """Drops are counted always and logged at most once a second (a flood must not flood the log)."""
        now = time.monotonic()
        if now - self._drop_log_at >= 1.0:
            self._drop_log_at = now
            log.warning(
                "dropped a message from %s: %s (counters: %s)",
                peer,
                exc,
                {k: v for k, v in self.counters.items() if k.startswith("dropped.")},
            )

    def enqueue_push(self, conn: Connection, header: Header, msg: Message) -> None:
        """Queue an unsolicited message from a connection for `on_push` (bounded; overflow counted)."""
        try:
            self._pushes.put_nowait((conn, header, msg))
        except asyncio.QueueFull:
            self.counters["dropped.push_overflow"] += 1

    async def _push_loop(self) -> None:
        while True:
            conn, header, msg = await self._pushes.get()
            await self.on_push(conn, header, msg)

    # -- heartbeats ----------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.runtime.heartbeat_interval_s
        last = self.loop.time()
        while True:
            await asyncio.sleep(interval)
            now = self.loop.time()
            # Our own loop was stalled (the GIL held by heavy work): nothing could be heard meanwhile, so the
            # stall is no peer's silence.
            stall, last = max(0.0, now - last - interval), now
            if self.runtime.liveness == "heartbeats":  # the old rule, exactly (bench/liveness.py)
                stall = 0.0
            if self.mailbox is not None:
                self.mailbox.tick(now, stall)
            for conn in self.connections.values():
                conn.tick(now, stall)

    async def _watch_stalls(self) -> None:
        """The longest time the event loop went without running (`loop.stall_max_ms` in the stats; stalls
        over a second counted in `loop.stalls_over_1s`)."""
        period = STALL_PERIOD_S
        last = self.loop.time()
        while True:
            await asyncio.sleep(period)
            now = self.loop.time()
            stall, last = now - last - period, now
            if stall > self.stall_max_s:
                self.stall_max_s = stall
                self.counters["loop.stall_max_ms"] = int(stall * 1000)
            if stall >= 1.0:
                self.counters["loop.stalls_over_1s"] += 1
                doing = f" ({self.busy_with})" if self.busy_with else ""
                log.info("event loop stalled %.2f s%s", stall, doing)

    # -- recording -----------------------------------------------------------------------------------

    def record(self, direction: str, sock: str, peer: Any, frames: Sequence[Any], msg: Message) -> None:
        """Tee one message into the message log, if recording is on (heartbeats are not recorded)."""
        rec = self.recorder
        if rec is None or isinstance(msg, Heartbeat):
            return
        if isinstance(peer, bytes):
            peer = peer_label(peer)
        try:
            rec.record(direction, sock, peer, frames[0], frames[1], frames[2:])
        except OSError as exc:  # a full disk must not take the actor down: count, warn, and give up
            self.counters["dropped.record"] += 1
            self._record_failures += 1
            if self._record_failures >= MAX_RECORD_FAILURES:
                log.error("message recording disabled after %d write errors: %s", self._record_failures, exc)
                self.recorder = None
                with contextlib.suppress(OSError):
                    rec.close()
            else:
                self.log_drop("recorder", exc)
