"""A thin asyncio adapter over a plain (synchronous) ZeroMQ socket, in callback style.

Why not `zmq.asyncio`: it allocates a future per call, and a reader task costs one more trip through
the event loop per message. Here the socket's `ZMQ_FD` is watched with `loop.add_reader`, and when it
fires every waiting message is read with `NOBLOCK` calls and handed to `on_message` right in the
callback (bounded batches, so a flood cannot starve the loop). This measured well under half of
`zmq.asyncio`'s per-round-trip overhead here (bench/transport.py).

The one subtlety of `ZMQ_FD`: it signals edges, and any send may consume an edge, so after every send
we re-check `ZMQ_EVENTS` and schedule a drain ourselves when messages are waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import zmq
import zmq.backend

ZERO_COPY_BYTES = 65536
"""Parts at least this large are sent without copying (pyzmq's own default copy threshold)."""
BATCH = 256
"""Messages handled per wake-up before yielding to the loop."""

_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
# the Cython methods directly: pyzmq's Python-level wrappers cost more than the calls themselves here
_recv, _send, _get = zmq.backend.Socket.recv, zmq.backend.Socket.send, zmq.backend.Socket.get


class AsyncSocket:
    """One ZeroMQ socket on the running loop. Inbound messages go to `on_message(frames)` (frames not
    copied); an exception from it goes to `on_error` (the actor treats that as a crash)."""

    def __init__(
        self,
        sock: zmq.Socket,
        on_message: Callable[[list[zmq.Frame]], None],
        on_error: Callable[[BaseException], None],
        name: str = "",
    ) -> None:
        self.sock = sock
        self.name = name
        self.on_message = on_message
        self.on_error = on_error
        self._loop = asyncio.get_running_loop()
        self._fd = sock.getsockopt(zmq.FD)
        self._writer: asyncio.Future | None = None
        self._drain_scheduled = False
        self.closed = False
        self._loop.add_reader(self._fd, self._on_fd)
        self._schedule_drain()  # messages may already be waiting (no edge will tell us)

    def _on_fd(self) -> None:
        w = self._writer
        if w is not None and not w.done():
            w.set_result(None)
        self._drain()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        if self.closed:
            return
        sock = self.sock
        try:
            for _ in range(BATCH):
                if self.closed or not _get(sock, _EVENTS) & _POLLIN:
                    return
                frame = _recv(sock, _NOBLOCK, False)
                parts = [frame]
                while frame.more:
                    frame = _recv(sock, 0, False)
                    parts.append(frame)
                self.on_message(parts)
            self._schedule_drain()  # more may be waiting: let other callbacks run first
        except Exception as exc:
            self.on_error(exc)

    def try_send(self, frames: Sequence[Any]) -> bool:
        """Send without blocking; False when the high-water mark is reached (the caller counts a drop).

        Raises `zmq.ZMQError` (EHOSTUNREACH) for an unknown peer on a ROUTER with ROUTER_MANDATORY.
        """
        sock = self.sock
        last = len(frames) - 1
        try:
            # Part by part: small parts are copied (a zero-copy frame costs a free-callback round trip
            # through pyzmq's gc thread, far more than copying a few KB), large ones are not. Once the
            # first part is accepted, ZeroMQ accepts the rest of the multipart message.
            for i, part in enumerate(frames):
                big = memoryview(part).nbytes >= ZERO_COPY_BYTES
                _send(sock, part, (_NOBLOCK if i == 0 else 0) | (_SNDMORE if i < last else 0), not big)
            return True
        except zmq.Again:
            return False
        finally:
            if not self.closed and _get(sock, _EVENTS) & _POLLIN:
                self._schedule_drain()

    async def send(self, frames: Sequence[Any], timeout: float | None) -> bool:
        """Send, waiting up to `timeout` for room under the high-water mark; False if none came."""
        if self.try_send(frames):
            return True
        deadline = None if timeout is None else self._loop.time() + timeout
        while not self.closed:
            remaining = None if deadline is None else deadline - self._loop.time()
            if remaining is not None and remaining <= 0:
                return False
            if not _get(self.sock, _EVENTS) & _POLLOUT:
                self._writer = fut = self._loop.create_future()
                try:
                    await asyncio.wait_for(fut, remaining)
                except TimeoutError:
                    return False
                finally:
                    self._writer = None
            if self.try_send(frames):
                return True
        return False

    def close(self) -> None:
        """Stop watching the fd and close with linger 0 (queued messages are discarded)."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
        self.sock.close(linger=0)
