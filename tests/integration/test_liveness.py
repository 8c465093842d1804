"""Dead, hung or busy, between real processes: a peer holding the GIL (as a Python-heavy checkpoint save does)
is busy — never declared dead, its requests wait for it; a SIGKILLed one is dead within the transport
deadline even while busy; a SIGSTOPped one is handled as a host cut off (dead, then back when it wakes);
one silent past the progress deadline it announced is hung."""

from __future__ import annotations

import asyncio
import signal

import pytest

from guirl.messages import DiagChannel
from guirl.messages.types import Echo, HoldGil, StatsReply, StatsRequest
from guirl.runtime.errors import PeerDead, RemoteError
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor
from tests.helpers import client_actor, fast_config, run

ECHO = "guirl.actors.echo:EchoActor"
HOLD_S = 3.0
"""Five transport deadlines (0.2 s × 3) of the fast config: far past what used to be taken for a death."""


def _deadline(cfg) -> float:
    return cfg.runtime.heartbeat_interval_s * cfg.runtime.heartbeat_liveness


async def _echo(sup, cfg):
    echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
    return echo.endpoints[0]


def test_a_peer_holding_the_gil_is_busy_not_dead_and_its_requests_wait():
    cfg = fast_config("runtime.fault_injection=true", "supervisor.restart_backoff_initial_s=30")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            conn = client.connect("echo", await _echo(sup, cfg), DiagChannel)
            await conn.wait_alive(10)
            # the echo holds the GIL: its own heartbeats stop, its handler cannot run; both requests time out
            # at half the hold (time enough for the silence to show: two heartbeat intervals after the hold
            # began) and are answered after it, neither fails
            held = asyncio.create_task(conn.request(HoldGil(seconds=HOLD_S), timeout=HOLD_S / 2))
            queued = asyncio.create_task(conn.request(Echo(text="queued"), timeout=HOLD_S / 2))
            stats = await held
            assert isinstance(stats, StatsReply) and stats.counters["faults.gil_held"] == 1
            assert (await queued).text == "queued"
            assert client.counters["requests.waited_busy"] >= 2 and client.counters["peers.dead"] == 0
            assert conn.state == "alive"
            # the echo measured its own stall
            assert (await conn.request(Echo(text="after"))).text == "after"
            after = await conn.request(StatsRequest())
            assert after.counters["loop.stall_max_ms"] >= HOLD_S * 1000 * 0.9
            assert after.counters["loop.stalls_over_1s"] == 1

            # the other way round: this process holds the GIL; the echo must not take it for dead, and
            # this side must not take its own stall for the echo's silence
            client.hold_gil(HOLD_S)
            assert (await conn.request(Echo(text="back"))).text == "back"
            stats = await conn.request(StatsRequest())
            assert stats.counters.get("peers.dead", 0) == 0, stats.counters
            assert client.counters["peers.dead"] == 0 and client.stall_max_s >= HOLD_S * 0.9

    run(main())


def test_a_busy_peer_killed_is_dead_within_the_transport_deadline():
    """Busy is not a shelter: SIGKILL the echo while it holds the GIL (and its heartbeats have long
    stopped), and its connection closes with it: declared dead at the next heartbeat tick."""
    cfg = fast_config("runtime.fault_injection=true", "supervisor.restart_backoff_initial_s=30")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            conn = client.connect("echo", await _echo(sup, cfg), DiagChannel)
            await conn.wait_alive(10)
            loop = asyncio.get_running_loop()
            held = asyncio.create_task(conn.request(HoldGil(seconds=60), timeout=5))
            async with asyncio.timeout(10):  # until its heartbeats have stopped: it is holding the GIL
                while not conn.busy(loop.time()):
                    await asyncio.sleep(cfg.runtime.heartbeat_interval_s / 4)
            sup.kill("echo")
            killed_at = loop.time()
            with pytest.raises(PeerDead, match="is gone: its connection is lost"):
                await held
            detected_after = loop.time() - killed_at
            # once silent past the deadline, at the next tick: not after its progress deadline (120 s)
            assert detected_after <= _deadline(cfg) + 2 * cfg.runtime.heartbeat_interval_s, detected_after
            assert client.counters.get("peers.hung", 0) == 0

    run(main())


def test_a_stopped_peer_is_dead_after_the_deadline_and_back_when_it_wakes():
    """SIGSTOP (a hung process, or a host cut off): its ZeroMQ threads stop too, so the transport deadline
    applies: declared dead, its requests failed; SIGCONT, and it is the same process back again."""
    cfg = fast_config("supervisor.restart_backoff_initial_s=30")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            conn = client.connect("echo", await _echo(sup, cfg), DiagChannel)
            await conn.wait_alive(10)
            pending = asyncio.create_task(conn.request(Echo(text="stopped", delay_s=0.5), timeout=60))
            await asyncio.sleep(0)  # sent
            pid = sup.kill("echo", signal.SIGSTOP)
            try:
                with pytest.raises(PeerDead, match="is gone"):
                    await pending
            finally:
                sup.kill("echo", signal.SIGCONT)
            await conn.wait_alive(30)
            assert (await conn.request(Echo(text="awake"))).text == "awake"
            assert sup.actors["echo"].pid == pid and client.counters["peers.reconnected"] == 1

    run(main())


def test_a_peer_silent_past_its_progress_deadline_is_hung_unless_it_said_it_was_busy():
    cfg = fast_config("runtime.fault_injection=true", "runtime.progress_timeout_s=1.0")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            conn = client.connect("echo", await _echo(sup, cfg), DiagChannel)
            await conn.wait_alive(10)
            # this process announces heavy work, then holds the GIL past the progress deadline: the echo
            # waits for it (busy_timeout_s, 900 s), the client is not taken for hung
            with client.busy("checkpoint"):
                client.hold_gil(2.0)
            stats = await conn.request(StatsRequest())
            assert stats.counters.get("peers.dead", 0) == 0, stats.counters
            assert client.counters["busy.checkpoint"] == 1
            # the echo holds the GIL past its progress deadline, unannounced: hung, its request failed
            with pytest.raises(PeerDead, match="is hung: its connection is alive"):
                await conn.request(HoldGil(seconds=4.0), timeout=30)
            assert client.counters["peers.hung"] == 1
            assert 1.0 <= conn.silence_at_death < 4.0
            # it is not dead: it answers again once it is done
            await conn.wait_alive(30)
            assert (await conn.request(Echo(text="done"))).text == "done"

    run(main())


def test_fault_injection_is_refused_unless_configured():
    cfg = fast_config()

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            conn = client.connect("echo", await _echo(sup, cfg), DiagChannel)
            with pytest.raises(RemoteError, match="fault injection is off") as err:
                await conn.request(HoldGil(seconds=1.0))
            assert err.value.code == "unsupported"
            stats = await conn.request(StatsRequest())
            assert stats.counters["dropped.unsupported"] == 1 and "faults.gil_held" not in stats.counters

    run(main())


def test_a_peer_that_shuts_down_says_so_and_is_not_counted_dead():
    """A graceful stop (SIGTERM, the end of a run) says goodbye both ways: the client's requests in flight
    fail at once, not a transport deadline later, and neither side counts a death."""
    cfg = fast_config(
        "supervisor.restart_backoff_initial_s=30",
        "runtime.heartbeat_liveness=50",
        "runtime.shutdown_timeout_s=0.5",
    )

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            conn = client.connect("echo", await _echo(sup, cfg), DiagChannel)
            await conn.wait_alive(10)
            pending = asyncio.create_task(conn.request(Echo(text="cut", delay_s=60), timeout=60))
            await conn.request(StatsRequest())  # answered after the echo took "cut" (one pipe, in order)
            stopping = asyncio.create_task(sup.stop("echo"))
            # the goodbye, not 10 s of silence (0.2 s x 50), ends the request
            with pytest.raises(PeerDead, match="shut down"):
                await pending
            await stopping
            assert client.counters["peers.left"] == 1 and client.counters.get("peers.dead", 0) == 0

    run(main())
