"""A thin asyncio adapter over a plain (synchronous) ZeroMQ socket, in callback style.

Why not `zmq.asyncio`: it allocates a future per call, and a reader task costs one more trip through
the event loop per message. Here the socket's `ZMQ_FD` is watched with `loop.add_reader`, and when it
fires every waiting message is read with `NOBLOCK` calls and handed to `on_message` right in the
callback (bounded batches, so a flood cannot starve the loop). bench/transport.py measures a whole guirl
round trip within about 15 % of a bare `zmq.asyncio` echo that does no work at all.

The one subtlety of `ZMQ_FD`: it signals edges, and every call that reads `ZMQ_EVENTS` (any send or
recv does too) may consume an edge. So every such call goes through `_poll_events`, which acts on what
it saw: a drain is scheduled for POLLIN, and every writer waiting for room is woken for POLLOUT.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq
import zmq.backend

ZERO_COPY_BYTES = 65536
"""Read-only parts at least this large are sent without copying (pyzmq's default copy threshold)."""
BATCH = 256
"""Messages handled per wake-up before yielding to the loop."""
PART_BUDGET = 4096
"""Frames read per wake-up at most, so one message of a million frames cannot stall the loop."""

_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
# the Cython methods directly: pyzmq's Python-level wrappers cost more than the calls themselves here
_recv, _send, _get = zmq.backend.Socket.recv, zmq.backend.Socket.send, zmq.backend.Socket.get


def peer_label(ident: bytes) -> str:
    """A routing id as text: guirl's own ids are readable (`worker0/3fa2c1`); any other is shown in hex."""
    try:
        text = ident.decode("utf-8")
        if text and text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return "0x" + ident.hex()


def transport_heartbeats(sock: zmq.Socket, interval_s: float, deadline_s: float) -> None:
    """ZeroMQ's own (ZMTP) heartbeats on `sock`: its I/O thread pings the peer every `interval_s` and drops
    the connection when nothing has come back for `deadline_s` (and asks the peer to do the same, TTL). The
    I/O threads need no GIL: a peer whose Python is busy still answers, a killed or stopped one does not."""
    deadline_ms = max(100, min(int(deadline_s * 1000), 6_553_500))  # the TTL is sent in deciseconds
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(interval_s * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, deadline_ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, deadline_ms)


class SocketClosed(Exception):
    """The socket was closed while a send was waiting for room."""


class AsyncSocket:
    """One ZeroMQ socket on the running loop.

    Inbound messages go to `on_message(frames)` (frames not copied). A message with more than
    `max_parts` frames is read and discarded part by part, across loop turns, and reported once to
    `on_oversized(first_frame)`. An exception from a callback goes to `on_error` (a crash)."""

    def __init__(
        self,
        sock: zmq.Socket,
        on_message: Callable[[list[zmq.Frame]], None],
        on_error: Callable[[BaseException], None],
        name: str = "",
        *,
        max_parts: int = 1 << 30,
        on_oversized: Callable[[zmq.Frame], None] | None = None,
    ) -> None:
        self.sock = sock
        self.name = name
        self.on_message = on_message
        self.on_error = on_error
        self.max_parts = max_parts
        self.on_oversized = on_oversized
        self._loop = asyncio.get_running_loop()
        self._fd = sock.getsockopt(zmq.FD)
        self._writers: deque[asyncio.Future] = deque()
        self._partial: list[zmq.Frame] = []  # a message being read across wake-ups
        self._discarding = False  # the rest of an oversized message is being thrown away
        self._drain_scheduled = False
        self.closed = False
        self._loop.add_reader(self._fd, self._drain)
        self._schedule_drain()  # messages may already be waiting (no edge will tell us)

    # -- events ------------------------------------------------------------------------------------

    def _poll_events(self) -> int:
        """Read ZMQ_EVENTS (consuming the fd's edge) and act on it; returns the events."""
        events = _get(self.sock, _EVENTS)
        if events & _POLLIN:
            self._schedule_drain()
        if events & _POLLOUT and self._writers:
            self._wake_writers()
        return events

    def _wake_writers(self) -> None:
        writers, self._writers = self._writers, deque()
        for fut in writers:
            if not fut.done():
                fut.set_result(None)

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Read what is waiting: at most BATCH messages and PART_BUDGET frames per call."""
        self._drain_scheduled = False
        sock, budget, messages = self.sock, PART_BUDGET, 0
        try:
            while messages < BATCH and budget > 0 and not self.closed:
                if not self._partial and not self._discarding:  # between messages
                    events = _get(sock, _EVENTS)
                    if events & _POLLOUT and self._writers:
                        self._wake_writers()
                    if not events & _POLLIN:
                        return
                    frame = _recv(sock, _NOBLOCK, False)
                    budget -= 1
                    if not frame.more:
                        self.on_message([frame])
                        messages += 1
                        continue
                    self._partial = [frame]
                # the rest of a multipart message is already here once its first part is
                while budget > 0:
                    frame = _recv(sock, 0, False)
                    budget -= 1
                    if self._discarding:
                        if not frame.more:
                            self._discarding = False
                            break
                        continue
                    self._partial.append(frame)
                    if not frame.more:
                        parts, self._partial = self._partial, []
                        self.on_message(parts)
                        messages += 1
                        break
                    if len(self._partial) >= self.max_parts:  # more frames than any message may have
                        first, self._partial, self._discarding = self._partial[0], [], True
                        if self.on_oversized is not None:
                            self.on_oversized(first)
            if not self.closed:
                self._schedule_drain()  # more may be waiting: let other callbacks run first
        except Exception as exc:
            self.on_error(exc)

    # -- sending -----------------------------------------------------------------------------------

    def try_send(self, frames: Sequence[Any]) -> bool:
        """Send without blocking; False when the high-water mark is reached (the caller counts a drop).

        Raises `zmq.ZMQError` (EHOSTUNREACH) for an unknown peer on a ROUTER with ROUTER_MANDATORY,
        and `SocketClosed` once the socket is closed.
        """
        if self.closed:
            raise SocketClosed(f"socket {self.name!r} is closed")
        sock = self.sock
        last = len(frames) - 1
        try:
            # Part by part: small parts are copied (a zero-copy frame costs a free-callback round trip
            # through pyzmq's gc thread, far more than copying a few KB); large read-only ones are not.
            # A mutable buffer is always copied: the caller may reuse it as soon as we return. Once the
            # first part is accepted, ZeroMQ accepts the rest of the multipart message.
            for i, part in enumerate(frames):
                if type(part) is bytes:
                    zero_copy = len(part) >= ZERO_COPY_BYTES
                else:
                    view = memoryview(part)
                    zero_copy = view.nbytes >= ZERO_COPY_BYTES and view.readonly
                flags = (_NOBLOCK if i == 0 else 0) | (_SNDMORE if i < last else 0)
                _send(sock, part, flags, not zero_copy)
            return True
        except zmq.Again:
            return False
        finally:
            if not self.closed:
                self._poll_events()

    async def send(self, frames: Sequence[Any], timeout: float | None) -> bool:
        """Send, waiting up to `timeout` for room under the high-water mark; False if none came.
        Raises `SocketClosed` if the socket is closed meanwhile."""
        if self.try_send(frames):
            return True
        deadline = None if timeout is None else self._loop.time() + timeout
        while True:
            fut = self._loop.create_future()
            self._writers.append(fut)
            if self._poll_events() & _POLLOUT:  # room appeared before we registered
                if self.try_send(frames):
                    return True
                continue
            remaining = None if deadline is None else deadline - self._loop.time()
            try:
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                return self.try_send(frames)  # one last try at the deadline
            finally:
                if fut in self._writers:
                    self._writers.remove(fut)
            if self.try_send(frames):
                return True

    def close(self, linger_ms: int = 0) -> None:
        """Stop watching the fd and close with linger 0 (queued messages are discarded; `linger_ms` gives a
        goodbye that long to go out). Waiting writers wake up and get `SocketClosed`."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        writers, self._writers = self._writers, deque()
        for fut in writers:
            if not fut.done():
                fut.set_result(None)
        self._partial = []
        self.sock.close(linger=linger_ms)
