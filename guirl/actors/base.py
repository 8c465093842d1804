"""The actor runtime: one process, one event loop (uvloop), one ROUTER mailbox, any number of connections.

An actor owns its sockets, receives typed messages on its mailbox, answers them from `handle`, and talks
to other actors through `Connection`s. It heartbeats every peer, declares silent ones dead, keeps every
queue bounded and counts every drop by reason, and shuts down on a `Shutdown` message or SIGTERM:
stop accepting → drain in-flight work → close sockets (linger 0) → terminate the context with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import zmq

from guirl.actors.connection import Connection
from guirl.actors.stats import Counters
from guirl.actors.zsock import AsyncSocket
from guirl.messages import Codec, CodecError, CodecLimits, DiagChannel, Header, IdGen, make_header
from guirl.messages.types import ErrorReply, Heartbeat, Message, Shutdown, StatsReply, StatsRequest

log = logging.getLogger(__name__)


class Request:
    """An inbound message awaiting its handler: who sent it, its header and its typed body."""

    __slots__ = ("peer", "header", "msg", "received_at")

    def __init__(self, peer: list[bytes], header: Header, msg: Message, received_at: float) -> None:
        self.peer = peer  # routing ids to address the reply; peer[0] is the directly connected socket
        self.header = header
        self.msg = msg
        self.received_at = received_at

    @property
    def peer_name(self) -> str:
        return self.peer[0].decode("utf-8", "replace") if self.peer else ""


def _delimiter(frames: list) -> int:
    """Index of the empty frame that ends the routing ids, or -1."""
    for i, f in enumerate(frames):
        if len(f) == 0:
            return i
    return -1


class _PeerState:
    __slots__ = ("ident", "last_seen")

    def __init__(self, ident: bytes, last_seen: float) -> None:
        self.ident = ident
        self.last_seen = last_seen


class Actor:
    """Base class of every guirl actor. Subclasses set `channel`, override `handle` and/or `main`."""

    channel: ClassVar[Any] = DiagChannel
    """The union of message types this actor's mailbox accepts (control messages always included)."""

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
        self.peers: dict[bytes, _PeerState] = {}
        self.stopping = False
        self.ctx: zmq.Context | None = None
        self._mailbox: AsyncSocket | None = None
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._inbox: asyncio.Queue[Request] | None = None
        self._active = 0
        self._idle = asyncio.Event()
        self._drop_log_at = 0.0
        self._fatal: BaseException | None = None
        self._pushes: asyncio.Queue | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

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

    def request_shutdown(self, reason: str = "") -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            log.info("shutdown requested: %s", reason or "no reason given")
            self._stop.set()

    async def reply(self, req: Request, msg: Message) -> bool:
        """Send `msg` to the sender of `req`. Returns False (and counts) if it could not be routed."""
        return self._send_to(req.peer, msg, reply_to=req.header.msg_id)

    def push(self, peer_ident: bytes, msg: Message) -> bool:
        """Send an unsolicited message to a mailbox peer."""
        return self._send_to([peer_ident], msg)

    def stats(self) -> StatsReply:
        return StatsReply(
            actor=self.name,
            counters=self.counters.snapshot(),
            peers=[p.ident.decode("utf-8", "replace") for p in self.peers.values()],
        )

    # -- running -----------------------------------------------------------------------------------

    async def run(self, ready: Any = None) -> None:
        """Run until shutdown. `ready(endpoints)` is called once the mailbox is bound and setup is done."""
        self.loop = asyncio.get_running_loop()
        self.ctx = zmq.Context()
        self._inbox = asyncio.Queue(maxsize=self.runtime.inbox_max)
        self._pushes = asyncio.Queue(maxsize=self.runtime.inbox_max)
        self._idle.set()
        try:
            self._bind()
            try:
                self.loop.add_signal_handler(signal.SIGTERM, self.request_shutdown, "SIGTERM")
                self.loop.add_signal_handler(signal.SIGINT, self.request_shutdown, "SIGINT")
            except (RuntimeError, ValueError):  # not the main thread: the launcher handles signals
                pass
            async with asyncio.TaskGroup() as tg:
                await self.setup()
                tasks = [
                    tg.create_task(self._heartbeat_loop(), name="heartbeat"),
                    tg.create_task(self._push_loop(), name="pushes"),
                ]
                if self._mailbox is not None:
                    tasks += [
                        tg.create_task(self._worker(), name=f"worker{i}")
                        for i in range(self.runtime.max_concurrency)
                    ]
                tasks.append(tg.create_task(self._run_main(), name="main"))
                if ready is not None:
                    ready(self.endpoints)
                await self._stop.wait()
                self.stopping = True
                if self._fatal is None:
                    await self._drain()
                for t in tasks:
                    t.cancel()
        finally:
            self.stopping = True
            await self._close()
        if self._fatal is not None:
            raise self._fatal

    def crash(self, exc: BaseException) -> None:
        """An internal error in a socket callback: stop now and let `run` raise it (the supervisor
        restarts the process). A bug must not be logged and forgotten."""
        log.error("internal error, stopping: %r", exc, exc_info=exc)
        if self._fatal is None:
            self._fatal = exc
        self.request_shutdown(f"internal error: {exc!r}")

    async def _run_main(self) -> None:
        await self.main()
        self.request_shutdown("main returned")

    def _bind(self) -> None:
        if not self.bind_endpoints:
            return
        rt = self.runtime
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable replies raise (and are counted), not vanish
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting peer with the same identity takes over
        sock.setsockopt(zmq.SNDHWM, rt.sndhwm)
        sock.setsockopt(zmq.RCVHWM, rt.rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes * 2)
        try:
            for ep in self.bind_endpoints:
                if ep.startswith("tcp://") and ep.endswith((":0", ":*")):
                    port = sock.bind_to_random_port(ep.rsplit(":", 1)[0])
                    ep = f"{ep.rsplit(':', 1)[0]}:{port}"
                else:
                    sock.bind(ep)
                self.endpoints.append(sock.getsockopt_string(zmq.LAST_ENDPOINT) if "*" in ep else ep)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        self._mailbox = AsyncSocket(sock, self._on_mailbox_frames, self.crash, "mailbox")

    async def _drain(self) -> None:
        """Let queued and in-flight requests finish, up to `shutdown_timeout_s`."""
        try:
            await asyncio.wait_for(self._wait_idle(), self.runtime.shutdown_timeout_s)
        except TimeoutError:
            log.warning(
                "shutdown: %d requests still in flight after %.1f s; abandoning them",
                self._active + self._inbox.qsize(),
                self.runtime.shutdown_timeout_s,
            )

    async def _wait_idle(self) -> None:
        while self._active or not self._inbox.empty():
            self._idle.clear()
            await self._idle.wait()

    async def _close(self) -> None:
        for conn in self.connections.values():
            conn.close()
        if self._mailbox is not None:
            self._mailbox.close()
            for ep in self.endpoints:  # libzmq leaves ipc socket files behind; they are ours to remove
                path = ep[len("ipc://") :] if ep.startswith("ipc://") else ""
                if path and not path.startswith("@") and os.path.exists(path):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
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

    # -- mailbox -------------------------------------------------------------------------------------

    def _on_mailbox_frames(self, frames: list) -> None:
        """One inbound message, straight from the socket callback: control messages are answered here,
        the rest queued (bounded) for the handler tasks."""
        now = self.loop.time()
        self.counters["frames_in"] += 1
        split = 1 if len(frames) > 1 and len(frames[1]) == 0 else _delimiter(frames)
        if split < 0:
            self._reject([frames[0].bytes], None, CodecError("frames", "no empty delimiter frame"))
            return
        peer = [f.bytes for f in frames[:split]]
        if not peer:
            self.counters["dropped.frames"] += 1
            return
        self._touch(peer[0], now)
        try:
            header, msg = self.codec.decode(frames[split + 1 :], self.channel)
        except CodecError as exc:
            self._reject(peer, exc.header, exc)
            return
        match msg:
            case Heartbeat(leaving=True):
                if self.peers.pop(peer[0], None) is not None:
                    self.counters["peers.left"] += 1
                    log.info("mailbox peer %r left", peer[0].decode("utf-8", "replace"))
                return
            case Heartbeat():
                return
            case StatsRequest():
                self._send_to(peer, self.stats(), reply_to=header.msg_id)
                return
            case Shutdown(reason=reason):
                self.request_shutdown(reason or f"Shutdown from {peer[0]!r}")
                return
        self.counters["received"] += 1
        if self.recorder is not None:
            self.record("in", "mailbox", peer[0], [f.buffer for f in frames[split + 1 :]], msg)
        if self.stopping:
            err = ErrorReply(code="shutting_down", message=f"{self.name} is shutting down", retryable=True)
            self._send_to(peer, err, reply_to=header.msg_id)
            return
        try:
            self._inbox.put_nowait(Request(peer, header, msg, now))
            self._idle.clear()
        except asyncio.QueueFull:
            self.counters["dropped.overloaded"] += 1
            err = ErrorReply(code="overloaded", message=f"{self.name}'s inbox is full", retryable=True)
            self._send_to(peer, err, reply_to=header.msg_id)

    def _touch(self, ident: bytes, now: float) -> None:
        state = self.peers.get(ident)
        if state is None:
            self.peers[ident] = _PeerState(ident, now)
            self.counters["peers.joined"] += 1
            # answer a new peer at once, so a (re)connecting client learns we are alive without waiting
            self._send_to([ident], Heartbeat(incarnation=self.incarnation))
        else:
            state.last_seen = now

    def _reject(self, peer: list[bytes], header: Header | None, exc: CodecError) -> None:
        self.counters[f"dropped.{exc.code}"] += 1
        self.log_drop(peer[0].decode("utf-8", "replace") if peer else "?", exc)
        if peer:
            err = ErrorReply(code=exc.code, message=str(exc)[:500])
            self._send_to(peer, err, reply_to=header.msg_id if header else "")

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

    async def _worker(self) -> None:
        inbox = self._inbox
        while True:
            req = await inbox.get()
            self._active += 1
            try:
                reply = await self.handle(req)
            except Exception as exc:  # a handler bug answers the requester; the actor stays up
                self.counters["handler_errors"] += 1
                log.exception("handler failed on %s from %s", type(req.msg).__name__, req.peer_name)
                reply = ErrorReply(code="handler", message=f"{type(exc).__name__}: {exc}"[:500])
            finally:
                self._active -= 1
            if reply is not None:
                self._send_to(req.peer, reply, reply_to=req.header.msg_id)
            # Drop our references now: an idle worker must not pin its last message's frames (a
            # screenshot each, up to max_concurrency of them), or every new message lands in fresh,
            # page-faulting memory.
            req = reply = None
            self.counters["handled"] += 1
            if not self._active and inbox.empty():
                self._idle.set()

    def _send_to(self, peer: list[bytes], msg: Message, *, reply_to: str = "") -> bool:
        sock = self._mailbox
        if sock is None or sock.closed:
            return False
        header = make_header(self.ids, self.name, policy_version=self.policy_version, reply_to=reply_to)
        try:
            body = self.codec.encode(header, msg)
        except CodecError as exc:
            self.counters[f"dropped.out_{exc.code}"] += 1
            log.error("cannot send %s: %s", type(msg).__name__, exc)
            return False
        try:
            if not sock.try_send([*peer, b"", *body]):
                self.counters["dropped.hwm"] += 1
                return False
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone (ROUTER_MANDATORY)
            self.counters["dropped.unroutable"] += 1
            log.debug("unroutable reply to %r: %s", peer[0], exc)
            return False
        if not isinstance(msg, Heartbeat):
            self.counters["sent"] += 1
            self.record("out", "mailbox", peer[0], body, msg)
        return True

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
        rt = self.runtime
        while True:
            await asyncio.sleep(rt.heartbeat_interval_s)
            now = self.loop.time()
            limit = rt.heartbeat_interval_s * rt.heartbeat_liveness
            for ident, state in list(self.peers.items()):
                if now - state.last_seen > limit:
                    del self.peers[ident]
                    self.counters["peers.dead"] += 1
                    name = ident.decode("utf-8", "replace")
                    log.warning(
                        "mailbox peer %r missed %d heartbeats; declared dead", name, rt.heartbeat_liveness
                    )
                    self.on_peer_dead(name, TimeoutError(f"{name} silent for {now - state.last_seen:.2f} s"))
                else:
                    self._send_to([ident], Heartbeat(inflight=self._active, incarnation=self.incarnation))
            for conn in self.connections.values():
                conn.tick(now)

    # -- recording -----------------------------------------------------------------------------------

    def record(self, direction: str, sock: str, peer: Any, frames: Sequence[Any], msg: Message) -> None:
        """Tee one message into the message log, if recording is on (heartbeats are not recorded)."""
        rec = self.recorder
        if rec is None or isinstance(msg, Heartbeat):
            return
        if isinstance(peer, bytes):
            peer = peer.decode("utf-8", "replace")
        rec.record(direction, sock, peer, frames[0], frames[1], frames[2:])
