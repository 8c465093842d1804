"""The client side of a mailbox: a DEALER connection with request/reply, liveness and reconnection.

Liveness has two parts (see docs/runtime.md, "Liveness"):

- **dead**: the connection is lost — ZeroMQ's own heartbeats, run by its I/O threads without the GIL, went
  unanswered, or the peer's socket closed (its process was killed) — and the peer has said nothing for the
  transport deadline (`heartbeat_interval_s × heartbeat_liveness`). A peer that restarts within it is a
  restart (its new incarnation fails exactly the requests the old one took), not a death.
- **hung**: the connection is alive but the peer's own heartbeats stopped for longer than the progress
  deadline it announced (`patience_s`: its role's, or `busy_timeout_s` while it said it was busy). Handled
  as dead. A peer silent for less is **busy**: its requests wait for it rather than time out.

A dead peer fails every request in flight to it with `PeerDead` (never a silent hang); the socket is
replaced (dropping queued messages) and reconnected with capped exponential backoff until it speaks again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from guirl.log import log_fields
from guirl.messages import CodecError, Header, make_header
from guirl.messages.types import ErrorReply, Heartbeat, Message
from guirl.runtime.errors import Overloaded, PeerDead, RemoteError, RequestTimeout
from guirl.runtime.sockets import AsyncSocket, SocketClosed, transport_heartbeats

if TYPE_CHECKING:
    from guirl.runtime.base import Actor

log = logging.getLogger(__name__)


GOODBYE_LINGER_MS = 100
"""How long a closing socket keeps its goodbye (`Heartbeat(leaving=True)`) to send."""


class _Expired(Exception):
    pass


_TRANSPORT_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class Connection:
    """A named connection from an actor to another actor's mailbox (`channel` types its replies)."""

    def __init__(self, actor: Actor, name: str, endpoint: str, channel: Any) -> None:
        self.actor = actor
        self.name = name
        self.endpoint = endpoint
        self.channel = channel
        self.identity = f"{actor.name}/{os.urandom(3).hex()}".encode()
        self.state = "connecting"  # connecting -> alive <-> dead
        self.last_heard = 0.0
        self.declared_dead_at: float | None = None
        self.silence_at_death = 0.0  # how long the peer had been silent when declared dead
        self.reconnects = 0
        self.incarnation = ""  # the peer process's random id, from its heartbeats
        self._death_reported = False  # declared dead since the last heartbeat
        self.transport_up = False  # the ZMTP handshake done and the connection not lost since
        self.left = False  # the peer said goodbye (shut down) and has not spoken since
        self.peer_patience = 0.0  # the peer's announced progress deadline (0: ours)
        self.peer_busy = ""  # heavy work the peer announced
        self._pending: dict[str, asyncio.Future] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._sock: AsyncSocket | None = None
        self._monitor: zmq.Socket | None = None
        self._alive = asyncio.Event()
        self._backoff = actor.runtime.reconnect_backoff_initial_s
        self._next_reconnect = 0.0

    # -- socket lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        rt = self.actor.runtime
        sock = self.actor.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.SNDHWM, rt.sndhwm)
        sock.setsockopt(zmq.RCVHWM, rt.rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, max(1, int(rt.reconnect_backoff_initial_s * 1000)))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(1, int(rt.reconnect_backoff_max_s * 1000)))
        transport_heartbeats(sock, rt.heartbeat_interval_s, rt.heartbeat_interval_s * rt.heartbeat_liveness)
        if self.actor.security is not None:
            self.actor.security.secure_client(sock)
        self.transport_up = False
        self._monitor = sock.get_monitor_socket(_TRANSPORT_EVENTS)
        sock.connect(self.endpoint)
        self._sock = AsyncSocket(
            sock,
            self._on_frames,
            self.actor.crash,
            self.name,
            max_parts=self.actor.limits.max_frames + 1,
            on_oversized=self._on_oversized,
        )
        self.last_heard = self.actor.loop.time()
        self.send_heartbeat()  # introduce ourselves so the server starts heartbeating back

    def close(self) -> None:
        self._alive.clear()
        linger = 0
        if self._sock is not None and self.state == "alive":
            _, frames = self._frames(Heartbeat(leaving=True))
            if self._sock.try_send(frames):  # a goodbye: the peer must not wait a deadline to know
                linger = GOODBYE_LINGER_MS
        self._close_socket(linger)
        self._fail_pending(PeerDead(f"connection {self.name!r} closed"))

    def _close_socket(self, linger_ms: int = 0) -> None:
        if self._monitor is not None:
            if self._sock is not None:
                self._sock.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        if self._sock is not None:
            self._sock.close(linger_ms)
            self._sock = None
        self.transport_up = False

    def _read_transport(self) -> None:
        """What ZeroMQ's I/O thread saw of the connection since the last look (its monitor's events)."""
        while self._monitor is not None:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.transport_up = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.transport_up = False
                self.actor.counters["transport.disconnects"] += 1

    async def wait_alive(self, timeout: float) -> None:
        """Until the peer has answered at least once (a heartbeat is enough)."""
        await asyncio.wait_for(self._alive.wait(), timeout)

    # -- sending ---------------------------------------------------------------------------------

    def _frames(self, msg: Message, reply_to: str = "") -> tuple[Header, list[Any]]:
        a = self.actor
        header = make_header(a.ids, a.name, policy_version=a.policy_version, reply_to=reply_to)
        return header, [b"", *a.codec.encode(header, msg)]

    def send_heartbeat(self) -> None:
        if self._sock is None:
            return
        _, frames = self._frames(self.actor.heartbeat(inflight=len(self._pending)))
        if not self._sock.try_send(frames):  # the peer is not reading (dead or slow): not a message loss
            self.actor.counters["heartbeats.unsent"] += 1

    async def send(self, msg: Message, *, timeout: float | None = None) -> Header:
        """One-way send; raises `Overloaded` if the queue stays full for `timeout`, `PeerDead` if dead."""
        if self.state == "dead" or self._sock is None:
            raise PeerDead(f"peer {self.name!r} at {self.endpoint} is dead")
        header, frames = self._frames(msg)
        t = self.actor.runtime.request_timeout_s if timeout is None else timeout
        try:
            sent = await self._sock.send(frames, t)
        except SocketClosed:  # the connection was rebuilt (peer dead) or closed while we waited
            raise PeerDead(f"connection to {self.name!r} was reset while sending") from None
        if not sent:
            self.actor.counters["dropped.hwm"] += 1
            raise Overloaded(f"send queue to {self.name!r} full for {t:.3g} s")
        self.actor.counters["sent"] += 1
        self.actor.record("out", self.name, self.name, frames[1:], msg)
        return header

    async def request(self, msg: Message, *, timeout: float | None = None) -> Message:
        """Send `msg` and await the correlated reply. An `ErrorReply` is raised as `RemoteError`."""
        t = self.actor.runtime.request_timeout_s if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + t
        header = await self.send(msg, timeout=t)
        fut = loop.create_future()
        msg_id = header.msg_id
        self._pending[msg_id] = fut
        # a timer handle is much cheaper than asyncio.wait_for on this hot path
        asked = deadline - t
        self._timers[msg_id] = loop.call_later(
            max(0.0, deadline - loop.time()), self._expire, msg_id, asked, t
        )
        try:
            return await fut
        except _Expired:
            self.actor.counters["requests.timeout"] += 1
            raise RequestTimeout(
                f"no reply from {self.name!r} to {type(msg).__name__} {msg_id} within {t:.3g} s"
            ) from None
        finally:
            timer = self._timers.pop(msg_id, None)
            if timer is not None:
                timer.cancel()
            self._pending.pop(msg_id, None)

    def _expire(self, msg_id: str, asked: float, t: float) -> None:
        """A request's time `t` is up; but while its peer is busy (below) it waits on, a heartbeat interval
        at a time: until the answer, until the peer is declared hung or dead (which fails it), or until the
        peer's progress deadline has passed since it was asked (a peer busy with other work that keeps
        heartbeating must not hold a request forever)."""
        fut = self._pending.get(msg_id)
        if fut is None or fut.done():
            return
        now = self.actor.loop.time()
        rt = self.actor.runtime
        if self.busy(now) and now < asked + max(t, self.peer_patience or rt.progress_timeout_s):
            self.actor.counters["requests.waited_busy"] += 1
            self._timers[msg_id] = self.actor.loop.call_later(
                rt.heartbeat_interval_s, self._expire, msg_id, asked, t
            )
            return
        fut.set_exception(_Expired())

    def busy(self, now: float) -> bool:
        """The peer is alive but cannot answer now: its connection is up while its own heartbeats have
        stopped for over two intervals (its event loop is starved; its `busy` announcement, if any, says
        with what, and how long it may take)."""
        if self.state != "alive" or self.actor.runtime.liveness == "heartbeats":
            return False
        self._read_transport()
        return self.transport_up and now - self.last_heard > 2 * self.actor.runtime.heartbeat_interval_s

    def _fail_pending(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()

    # -- receiving (called from the socket's fd callback) ----------------------------------------

    def _on_oversized(self, first: Any) -> None:
        self.actor.counters["dropped.frames"] += 1
        self.actor.log_drop(self.name, CodecError("frames", "message with too many frames discarded"))

    def _on_frames(self, frames: list) -> None:
        a = self.actor
        self.last_heard = a.loop.time()
        header = msg = None
        if len(frames) >= 3 and len(frames[0]) == 0:
            try:
                header, msg = a.codec.decode(frames[1:], self.channel)
            except CodecError as exc:
                a.counters[f"dropped.{exc.code}"] += 1
                a.log_drop(self.name, exc)
        else:
            a.counters["dropped.frames"] += 1
        if isinstance(msg, Heartbeat) and msg.leaving:  # a goodbye is not the peer being back
            self._peer_left()
            return
        if self.state != "alive":  # the peer spoke, even if garbled
            self._mark_alive()
        if msg is None:
            return
        if isinstance(msg, Heartbeat):
            self.peer_patience, self.peer_busy = msg.patience_s, msg.busy
            self._check_incarnation(msg)
            return
        a.counters["received"] += 1
        if a.recorder is not None:
            a.record("in", self.name, self.name, [f.buffer for f in frames[1:]], msg)
        if header.reply_to:
            fut = self._pending.get(header.reply_to)
            if fut is None:
                a.counters["late_replies"] += 1
            elif not fut.done():
                if isinstance(msg, ErrorReply):
                    fut.set_exception(RemoteError(msg.code, msg.message, msg.retryable, self.name))
                else:
                    fut.set_result(msg)
        else:
            a.enqueue_push(self, header, msg)

    def _check_incarnation(self, beat: Heartbeat) -> None:
        """A new incarnation of the peer (it restarted, maybe within the liveness window): requests sent
        before the first message it saw from us were lost with the old one, so fail exactly those."""
        incarnation, reported = beat.incarnation, self._death_reported
        self._death_reported = False
        if not incarnation or incarnation == self.incarnation:
            return
        old, self.incarnation = self.incarnation, incarnation
        if not old:
            return  # the first incarnation we meet
        if reported:  # already declared dead (its requests failed then): it is simply back
            fields = log_fields(peer_restarted=self.name)
            log.info("peer %r at %s is back as a new process", self.name, self.endpoint, extra=fields)
            self.actor.on_peer_restarted(self.name)
            return
        self.actor.counters["peers.restarted"] += 1
        first = self.actor.ids.sequence(beat.first_seen)
        lost = [
            (msg_id, fut)
            for msg_id, fut in self._pending.items()
            if first is None or (self.actor.ids.sequence(msg_id) or 0) < first
        ]
        err = PeerDead(
            f"peer {self.name!r} at {self.endpoint} restarted; {len(lost)} request(s) sent before the "
            "restart were lost with the old process"
        )
        log.warning("%s", err, extra=log_fields(peer_restarted=self.name))
        for msg_id, fut in lost:
            self._pending.pop(msg_id, None)
            if not fut.done():
                fut.set_exception(err)
        self.actor.on_peer_dead(self.name, err)
        self.actor.on_peer_restarted(self.name)

    def _peer_left(self) -> None:
        """The peer said goodbye (it shut down): gone now, no deadline to wait; not counted as a death.
        The next tick rebuilds the connection, which finds the peer again if it comes back."""
        if self.state == "dead":
            return
        now = self.actor.loop.time()
        self.state, self._death_reported, self.declared_dead_at = "dead", True, now
        self.left = True
        self.silence_at_death = 0.0
        self._alive.clear()
        self._next_reconnect = now
        self.actor.counters["peers.left"] += 1
        err = PeerDead(f"peer {self.name!r} at {self.endpoint} shut down; its requests in flight failed")
        log.info("%s", err)
        self._fail_pending(err)
        self.actor.on_peer_left(self.name)

    def _mark_alive(self) -> None:
        was = self.state
        self.state = "alive"
        self.left = False
        self.declared_dead_at = None
        self._backoff = self.actor.runtime.reconnect_backoff_initial_s
        self._alive.set()
        if was == "dead":
            self.reconnects += 1
            self.actor.counters["peers.reconnected"] += 1
            log.info("peer %r at %s is back", self.name, self.endpoint)

    # -- heartbeats and reconnection -------------------------------------------------------------

    def tick(self, now: float, stall: float = 0.0) -> None:
        """Called every heartbeat interval by the actor: heartbeat, detect death, reconnect. `stall`: how
        long the actor's own loop was stalled since the last tick (nothing could be heard meanwhile)."""
        rt = self.actor.runtime
        self._read_transport()
        if stall:
            self.last_heard = min(now, self.last_heard + stall)
        silent = now - self.last_heard
        deadline = rt.heartbeat_interval_s * rt.heartbeat_liveness
        patience = self.peer_patience or rt.progress_timeout_s
        lost = not self.transport_up or rt.liveness == "heartbeats"
        if self.state != "dead" and ((lost and silent > deadline) or silent > patience):
            self.state = "dead"
            self._death_reported = True
            self.declared_dead_at = now
            self.silence_at_death = silent
            self._alive.clear()
            self.actor.counters["peers.dead"] += 1
            if not lost:
                self.actor.counters["peers.hung"] += 1
                busy = f" (busy: {self.peer_busy})" if self.peer_busy else ""
                what = f"is hung: its connection is alive but it has said nothing for {silent:.2f} s{busy}"
            elif self.incarnation:
                gone = "is gone: its connection is lost and it " if not self.transport_up else ""
                what = f"{gone}missed {rt.heartbeat_liveness} heartbeats ({silent:.2f} s silent)"
            else:
                what = f"has not answered in {silent:.2f} s (never reached)"
            err = PeerDead(f"peer {self.name!r} at {self.endpoint} {what}; its requests in flight failed")
            log.warning(
                "%s", err, extra=log_fields(peer_dead=self.name, hung=not lost, silent_s=round(silent, 3))
            )
            self._fail_pending(err)
            self.actor.on_peer_dead(self.name, err)
            self._reconnect(now)
        elif self.state == "dead" and now >= self._next_reconnect:
            self._reconnect(now)
        self.send_heartbeat()

    def _reconnect(self, now: float) -> None:
        self._close_socket()  # drops what was queued for the dead peer
        self.peer_patience, self.peer_busy = 0.0, ""
        self.open()
        self.last_heard = self.declared_dead_at or now  # stay dead until the peer speaks
        self._next_reconnect = now + self._backoff
        self._backoff = min(self._backoff * 2, self.actor.runtime.reconnect_backoff_max_s)
        self.actor.counters["reconnect_attempts"] += 1

    def __repr__(self) -> str:
        return f"Connection({self.name!r}, {self.endpoint!r}, {self.state})"
