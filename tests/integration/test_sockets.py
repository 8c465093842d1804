"""The fd-driven socket adapter: writers waiting for room, oversized multipart messages, closing."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from guirl.runtime.sockets import AsyncSocket, SocketClosed
from tests.helpers import run


def _full_dealer(ctx: zmq.Context, tmp_path) -> tuple[zmq.Socket, AsyncSocket, str]:
    """A DEALER whose queue (HWM 1) is full, because the ROUTER it connects to is not bound yet.
    ipc, not tcp: a tcp port left unbound may be taken before we bind it."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/router.sock"
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 1)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    sock = AsyncSocket(dealer, lambda f: None, lambda e: pytest.fail(repr(e)))
    while sock.try_send([b"fill"]):
        pass
    return router, sock, endpoint


def test_every_waiting_writer_is_woken_when_room_appears(tmp_path):
    async def main():
        ctx = zmq.Context()
        router, sock, endpoint = _full_dealer(ctx, tmp_path)
        writers = [asyncio.create_task(sock.send([name], timeout=20)) for name in (b"A", b"B", b"C")]
        await asyncio.sleep(0)  # all three are now waiting for room
        router.bind(endpoint)
        received: list[bytes] = []
        while len(received) < 3:
            if await asyncio.to_thread(router.poll, 5000):
                body = router.recv_multipart()[-1]
                if body != b"fill":
                    received.append(body)
            else:
                pytest.fail(f"only {received} arrived")
        assert await asyncio.gather(*writers) == [True, True, True]
        assert sorted(received) == [b"A", b"B", b"C"]
        sock.close()
        router.close(linger=0)
        ctx.term()

    run(main())


def test_a_writer_gets_socket_closed_not_cancelled(tmp_path):
    async def main():
        ctx = zmq.Context()
        router, sock, _ = _full_dealer(ctx, tmp_path)
        writer = asyncio.create_task(sock.send([b"late"], timeout=20))
        await asyncio.sleep(0)
        sock.close()
        with pytest.raises(SocketClosed):
            await writer
        router.close(linger=0)
        ctx.term()

    run(main())


def test_a_message_with_too_many_frames_is_discarded_and_the_next_one_read():
    async def main():
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        got: list[list[bytes]] = []
        oversized: list[bytes] = []
        done = asyncio.Event()

        def on_message(frames):
            got.append([f.bytes for f in frames])
            done.set()

        sock = AsyncSocket(
            pull,
            on_message,
            lambda e: pytest.fail(repr(e)),
            max_parts=10,
            on_oversized=lambda first: oversized.append(first.bytes),
        )
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send_multipart([b"huge"] + [b"x"] * 100_000)  # far beyond max_parts and the per-turn budget
        push.send_multipart([b"ok", b"1"])
        await asyncio.wait_for(done.wait(), 30)
        assert oversized == [b"huge"] and got == [[b"ok", b"1"]]
        push.close()
        sock.close()
        ctx.term()

    run(main())
