"""The server side of an actor: a ROUTER mailbox that decodes, answers control messages, queues
requests for the handler tasks (bounded), tracks and heartbeats its peers, and routes replies.

A peer is dead when its connection is gone (the ROUTER can no longer route to it: ZeroMQ's I/O thread
dropped it, its heartbeats unanswered or its socket closed) and it has said nothing for the transport
deadline; hung when it is still connected but silent past the progress deadline it announced. See
`connection.py` for the client side of the same rules.

Every message that cannot be served is answered with an `ErrorReply` where the sender can be addressed,
and always counted under `dropped.<reason>`: a flood of garbage costs counters, never the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

import zmq

from guirl.log import log_fields
from guirl.messages import CodecError, Header, make_header
from guirl.messages.types import ErrorReply, Heartbeat, HoldGil, Message, Shutdown, StatsRequest
from guirl.runtime.connection import GOODBYE_LINGER_MS
from guirl.runtime.errors import FatalError
from guirl.runtime.sockets import AsyncSocket, peer_label, transport_heartbeats

if TYPE_CHECKING:
    from guirl.runtime.base import Actor

log = logging.getLogger(__name__)


class Request:
    """An inbound message awaiting its handler: who sent it, its header and its typed body."""

    __slots__ = ("peer", "header", "msg", "received_at", "nbytes")

    def __init__(
        self, peer: list[bytes], header: Header, msg: Message, received_at: float, nbytes: int = 0
    ) -> None:
        self.peer = peer  # routing ids to address the reply; peer[0] is the directly connected socket
        self.header = header
        self.msg = msg
        self.received_at = received_at
        self.nbytes = nbytes  # size of its frames, held until the handler is done with it

    @property
    def peer_name(self) -> str:
        return peer_label(self.peer[0]) if self.peer else ""


MAX_ROUTING_IDS = 8
"""Routing frames (proxy hops) a message may carry before its empty delimiter."""


def _delimiter(frames: list) -> int:
    """Index of the empty frame that ends the routing ids, or -1."""
    for i, f in enumerate(frames):
        if len(f) == 0:
            return i
    return -1


class Mailbox:
    """The bound ROUTER socket of one actor and everything that serves it."""

    def __init__(self, actor: Actor, endpoints: list[str]) -> None:
        self.actor = actor
        rt = actor.runtime
        sock = actor.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable replies raise (and are counted), not vanish
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting peer with the same identity takes over
        sock.setsockopt(zmq.SNDHWM, rt.sndhwm)
        sock.setsockopt(zmq.RCVHWM, rt.rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, actor.limits.max_frame_bytes * 2)
        transport_heartbeats(sock, rt.heartbeat_interval_s, rt.heartbeat_interval_s * rt.heartbeat_liveness)
        if actor.security is not None:  # before bind: no peer may get in unauthenticated
            actor.security.secure_server(sock)
        self.endpoints: list[str] = []  # as actually bound (a tcp port 0 resolved)
        try:
            for ep in endpoints:
                if ep.startswith("tcp://") and ep.endswith((":0", ":*")):
                    base = ep.rsplit(":", 1)[0]
                    ep = f"{base}:{sock.bind_to_random_port(base)}"
                else:
                    sock.bind(ep)
                self.endpoints.append(ep)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise FatalError(f"{actor.name}: cannot bind its mailbox to {ep}: {exc}") from None
        self.sock = AsyncSocket(
            sock,
            self._on_frames,
            actor.crash,
            "mailbox",
            max_parts=actor.limits.max_frames + MAX_ROUTING_IDS + 1,
            on_oversized=self._on_oversized,
        )
        self.peers: dict[bytes, float] = {}  # directly connected peer id -> last heard (loop time)
        self.announced: dict[bytes, tuple[float, str]] = {}  # peer id -> its progress deadline, busy with
        self.inbox: asyncio.Queue[Request] = asyncio.Queue(maxsize=rt.inbox_max)
        self.held_bytes = 0  # frames of queued and in-flight requests
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- inbound ---------------------------------------------------------------------------------------

    def _on_frames(self, frames: list) -> None:
        """One inbound message, straight from the socket callback: control messages are answered here,
        the rest queued (bounded) for the handler tasks."""
        a = self.actor
        now = a.loop.time()
        a.counters["frames_in"] += 1
        split = 1 if len(frames) > 1 and len(frames[1]) == 0 else _delimiter(frames)
        if split < 0:
            self._reject([frames[0].bytes], None, CodecError("frames", "no empty delimiter frame"))
            return
        peer = [f.bytes for f in frames[:split]]
        if not peer:
            a.counters["dropped.frames"] += 1
            return
        try:
            header, msg = a.codec.decode(frames[split + 1 :], a.channel)
        except CodecError as exc:
            self._touch(peer[0], now, exc.header)
            self._reject(peer, exc.header, exc)
            return
        self._touch(peer[0], now, header)
        match msg:
            case Heartbeat(leaving=True):
                self.announced.pop(peer[0], None)
                if self.peers.pop(peer[0], None) is not None:
                    a.counters["peers.left"] += 1
                    log.info("mailbox peer %r left", peer_label(peer[0]))
                    a.on_peer_left(peer_label(peer[0]))
                return
            case Heartbeat(patience_s=patience, busy=busy):
                self.announced[peer[0]] = (patience, busy)
                return
            case StatsRequest():
                self.send(peer, a.stats(), reply_to=header.msg_id)
                return
            case Shutdown(reason=reason):
                a.request_shutdown(reason or f"Shutdown from {peer[0]!r}")
                return
            case HoldGil(seconds=seconds):
                if not a.runtime.fault_injection:
                    a.counters["dropped.unsupported"] += 1
                    err = ErrorReply(code="unsupported", message="fault injection is off in this run")
                    self.send(peer, err, reply_to=header.msg_id)
                    return
                a.hold_gil(seconds)
                self.send(peer, a.stats(), reply_to=header.msg_id)
                return
        a.counters["received"] += 1
        if a.recorder is not None:
            a.record("in", "mailbox", peer[0], [f.buffer for f in frames[split + 1 :]], msg)
        if a.stopping:
            err = ErrorReply(code="shutting_down", message=f"{a.name} is shutting down", retryable=True)
            self.send(peer, err, reply_to=header.msg_id)
            return
        nbytes = sum(len(f) for f in frames)
        if self.held_bytes + nbytes > a.runtime.inbox_max_bytes or self.inbox.full():
            a.counters["dropped.overloaded"] += 1
            err = ErrorReply(code="overloaded", message=f"{a.name}'s inbox is full", retryable=True)
            self.send(peer, err, reply_to=header.msg_id)
            return
        self.held_bytes += nbytes
        self.inbox.put_nowait(Request(peer, header, msg, now, nbytes))
        self._idle.clear()

    def _on_oversized(self, first: Any) -> None:
        """A message with more frames than any valid one: its rest was discarded unread."""
        self.actor.counters["frames_in"] += 1
        err = CodecError("frames", f"message has more than {self.sock.max_parts} frames")
        self._reject([first.bytes], None, err)

    def _touch(self, ident: bytes, now: float, header: Header | None) -> None:
        if ident not in self.peers:
            self.actor.counters["peers.joined"] += 1
            # answer a new peer at once, so a (re)connecting client learns we are alive without waiting,
            # and which of its messages was the first to reach this incarnation of us
            first = header.msg_id if header is not None else ""
            self.send([ident], self.actor.heartbeat(first_seen=first))
        self.peers[ident] = now

    def _reject(self, peer: list[bytes], header: Header | None, exc: CodecError) -> None:
        self.actor.counters[f"dropped.{exc.code}"] += 1
        self.actor.log_drop(peer_label(peer[0]) if peer else "?", exc)
        if peer:
            err = ErrorReply(code=exc.code, message=str(exc)[:500])
            self.send(peer, err, reply_to=header.msg_id if header else "")

    # -- handlers --------------------------------------------------------------------------------------

    async def worker(self) -> None:
        """One of `max_concurrency` handler tasks."""
        a, inbox = self.actor, self.inbox
        while True:
            req = await inbox.get()
            self.active += 1
            try:
                reply = await a.handle(req)
            except Exception as exc:  # a handler bug answers the requester; the actor stays up
                a.counters["handler_errors"] += 1
                log.exception("handler failed on %s from %s", type(req.msg).__name__, req.peer_name)
                reply = ErrorReply(code="handler", message=f"{type(exc).__name__}: {exc}"[:500])
            finally:
                self.active -= 1
                self.held_bytes -= req.nbytes
            if reply is not None:
                self.send(req.peer, reply, reply_to=req.header.msg_id)
            # Drop our references now: an idle worker must not pin its last message's frames (a
            # screenshot each, up to max_concurrency of them), or every new message lands in fresh,
            # page-faulting memory.
            req = reply = None
            a.counters["handled"] += 1
            if not self.active and inbox.empty():
                self._idle.set()

    async def drain(self, timeout: float) -> None:
        """Let queued and in-flight requests finish, up to `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                while self.active or not self.inbox.empty():
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            n = self.active + self.inbox.qsize()
            log.warning("shutdown: %d requests still in flight after %.1f s; abandoning them", n, timeout)

    # -- outbound --------------------------------------------------------------------------------------

    def send(self, peer: list[bytes], msg: Message, *, reply_to: str = "") -> bool:
        """Route `msg` to `peer`. Returns False, and counts why, when it cannot go out."""
        a, sock = self.actor, self.sock
        if sock.closed:
            return False
        header = make_header(a.ids, a.name, policy_version=a.policy_version, reply_to=reply_to)
        try:
            body = a.codec.encode(header, msg)
        except CodecError as exc:
            a.counters[f"dropped.out_{exc.code}"] += 1
            log.error("cannot send %s: %s", type(msg).__name__, exc)
            if reply_to and not isinstance(msg, ErrorReply):  # the requester must not wait in vain
                err = ErrorReply(code=exc.code, message=f"the reply could not be sent: {exc}"[:500])
                return self.send(peer, err, reply_to=reply_to)
            return False
        try:
            if not sock.try_send([*peer, b"", *body]):
                a.counters["heartbeats.unsent" if isinstance(msg, Heartbeat) else "dropped.hwm"] += 1
                return False
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone (ROUTER_MANDATORY)
            a.counters["heartbeats.unsent" if isinstance(msg, Heartbeat) else "dropped.unroutable"] += 1
            log.debug("unroutable message to %r: %s", peer[0], exc)
            return False
        if not isinstance(msg, Heartbeat):
            a.counters["sent"] += 1
            a.record("out", "mailbox", peer[0], body, msg)
        return True

    def tick(self, now: float, stall: float = 0.0) -> None:
        """Every heartbeat interval: heartbeat every peer, and declare dead the ones whose connection is gone
        and that have been silent for the transport deadline, or hung the ones silent past their progress
        deadline. `stall`: how long our own loop was stalled since the last tick (no one's silence)."""
        a, rt = self.actor, self.actor.runtime
        deadline = rt.heartbeat_interval_s * rt.heartbeat_liveness
        beat = a.heartbeat(inflight=self.active)
        for ident, last_seen in list(self.peers.items()):
            if stall:
                last_seen = self.peers[ident] = min(now, last_seen + stall)
            silent = now - last_seen
            connected = self._beat(ident, beat) and rt.liveness == "transport"
            patience, busy = self.announced.get(ident, (0.0, ""))
            if (connected or silent <= deadline) and silent <= (patience or rt.progress_timeout_s):
                continue
            del self.peers[ident]
            self.announced.pop(ident, None)
            a.counters["peers.dead"] += 1
            name = peer_label(ident)
            if connected:
                a.counters["peers.hung"] += 1
                why = f"{name} is hung: connected, but silent for {silent:.2f} s"
                why += f" ({busy})" if busy else ""
            elif rt.liveness == "heartbeats":
                why = f"{name} missed {rt.heartbeat_liveness} heartbeats ({silent:.2f} s silent)"
            else:
                why = f"{name} is gone: its connection is lost and it has been silent for {silent:.2f} s"
            fields = log_fields(peer_dead=name.split("/", 1)[0], hung=connected, silent_s=round(silent, 3))
            log.warning("mailbox peer declared dead: %s", why, extra=fields)
            a.on_peer_dead(name, TimeoutError(why))

    def beat_all(self) -> None:
        """A heartbeat to every peer now (a busy announcement must not wait for the next tick)."""
        beat = self.actor.heartbeat(inflight=self.active)
        for ident in list(self.peers):
            self._beat(ident, beat)

    def _beat(self, ident: bytes, beat: Heartbeat) -> bool:
        """Heartbeat one peer; False when the ROUTER has no connection to it any more (`EHOSTUNREACH`). A
        full queue (a peer that does not read) is a slow peer, not a lost one."""
        try:
            if not self.sock.try_send([ident, b"", *self.actor.codec.encode(self._beat_header(), beat)]):
                self.actor.counters["heartbeats.unsent"] += 1
        except zmq.ZMQError as exc:
            self.actor.counters["heartbeats.unsent"] += 1
            return exc.errno != zmq.EHOSTUNREACH
        return True

    def _beat_header(self) -> Header:
        a = self.actor
        return make_header(a.ids, a.name, policy_version=a.policy_version)

    def close(self) -> None:
        """Say goodbye to every peer (their requests fail now, not a deadline later), then close."""
        goodbye = Heartbeat(leaving=True, incarnation=self.actor.incarnation)
        said = [self._beat(ident, goodbye) for ident in list(self.peers)] if not self.sock.closed else []
        self.sock.close(GOODBYE_LINGER_MS if any(said) else 0)
        for ep in self.endpoints:  # libzmq leaves ipc socket files behind; they are ours to remove
            path = ep[len("ipc://") :] if ep.startswith("ipc://") else ""
            if path and not path.startswith("@") and os.path.exists(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
