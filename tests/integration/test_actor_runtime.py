"""The actor runtime over real ZeroMQ sockets between real processes (spawned actors, random ports)."""

from __future__ import annotations

import asyncio
import os
import socket

import psutil
import pytest

from guirl.messages import Blob, DiagChannel
from guirl.messages.types import Echo, EchoReply, Shutdown, StatsReply, StatsRequest
from guirl.runtime.base import Actor
from guirl.runtime.errors import FatalError, PeerDead, RemoteError, RequestTimeout
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor
from tests.helpers import client_actor, fast_config, run

ECHO = "guirl.actors.echo:EchoActor"


def _endpoint(transport: str, tmp_path) -> str:
    return "tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{tmp_path}/echo.sock"


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_request_reply_round_trips(transport, tmp_path):
    cfg = fast_config()

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=[_endpoint(transport, tmp_path)]))
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            shots = [os.urandom(n) for n in (1, 1000, 300_000)]
            for i in range(30):
                payload = shots[i % 3]
                reply = await conn.request(Echo(text=f"n{i}", blobs=[Blob(payload)]), timeout=10)
                assert isinstance(reply, EchoReply)
                assert reply.text == f"n{i}" and reply.sizes == [len(payload)]
                assert bytes(reply.blobs[0]) == payload
            # concurrent requests are correlated by id, whatever order the replies come in
            replies = await asyncio.gather(
                *(conn.request(Echo(text=str(i), delay_s=0.01 * (10 - i)), timeout=10) for i in range(10))
            )
            assert [r.text for r in replies] == [str(i) for i in range(10)]
            stats = await conn.request(StatsRequest())
            assert isinstance(stats, StatsReply) and stats.actor == "echo"
            assert stats.counters["handled"] == 40 and stats.counters.get("dropped.decode", 0) == 0

    run(main())


def test_request_timeout_and_handler_error():
    cfg = fast_config()

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            spec = ActorSpec(
                name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], options={"fail_on": "boom"}
            )
            echo = await sup.start(spec)
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            with pytest.raises(RequestTimeout, match="within 0.3 s"):
                await conn.request(Echo(text="slow", delay_s=5), timeout=0.3)
            with pytest.raises(RemoteError) as err:
                await conn.request(Echo(text="boom"))
            assert err.value.code == "handler" and "injected" in str(err.value) and not err.value.transient
            # the actor is still up and serving
            assert (await conn.request(Echo(text="after"))).text == "after"
            assert client.counters["requests.timeout"] == 1

    run(main())


def test_sigkill_detected_within_liveness_and_pending_requests_fail():
    # a long restart backoff keeps the killed actor down while we watch the client detect it
    cfg = fast_config("supervisor.restart_backoff_initial_s=30")
    rt = cfg.runtime

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            await conn.wait_alive(10)
            pending = [
                asyncio.create_task(conn.request(Echo(text="never", delay_s=60), timeout=60))
                for _ in range(3)
            ]
            await asyncio.sleep(0)  # let the requests go out
            loop = asyncio.get_running_loop()
            sup.kill("echo")
            killed_at = loop.time()
            for task in pending:
                with pytest.raises(PeerDead, match="missed 3 heartbeats"):
                    await task
            detected_after = loop.time() - killed_at
            window = rt.heartbeat_interval_s * rt.heartbeat_liveness
            # declared dead once silent for interval × liveness, at the next heartbeat tick after that
            assert conn.state == "dead"
            assert detected_after <= window + 2 * rt.heartbeat_interval_s, detected_after
            assert window <= conn.silence_at_death <= window + 2 * rt.heartbeat_interval_s
            with pytest.raises(PeerDead):  # new requests fail fast while the peer is dead
                await conn.request(Echo(text="x"))

    run(main())


def test_restarted_peer_is_reconnected():
    cfg = fast_config()

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            assert (await conn.request(Echo(text="before"))).text == "before"
            old_pid = echo.pid
            pending = asyncio.create_task(conn.request(Echo(text="lost", delay_s=60), timeout=60))
            await asyncio.sleep(0)
            mark = len(sup.history)
            sup.kill("echo")
            # whether the client noticed the silence or the new incarnation first, the request fails
            with pytest.raises(PeerDead):
                await pending
            ev = await sup.wait_event("restarted", "echo", after=mark, timeout=60)
            assert ev.pid != old_pid and sup.actors["echo"].endpoints == echo.endpoints  # same port
            await conn.wait_alive(30)
            assert (await conn.request(Echo(text="after"))).text == "after"
            assert client.counters["peers.dead"] + client.counters["peers.restarted"] >= 1

    run(main())


def test_overload_is_answered_and_counted():
    cfg = fast_config("runtime.inbox_max=2", "runtime.max_concurrency=1")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            results = await asyncio.gather(
                *(conn.request(Echo(text=str(i), delay_s=0.2), timeout=30) for i in range(12)),
                return_exceptions=True,
            )
            overloaded = [r for r in results if isinstance(r, RemoteError) and r.code == "overloaded"]
            served = [r for r in results if isinstance(r, EchoReply)]
            assert overloaded and served and len(overloaded) + len(served) == 12
            assert all(r.transient for r in overloaded)
            stats = await conn.request(StatsRequest())
            assert stats.counters["dropped.overloaded"] == len(overloaded)

    run(main())


def test_reply_to_departed_peer_is_counted_as_unroutable():
    cfg = fast_config()

    async def main():
        async with Supervisor(cfg) as sup:
            echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
            async with client_actor(cfg, "leaver") as leaver:
                conn = leaver.connect("echo", echo.endpoints[0], DiagChannel)
                with pytest.raises(RequestTimeout):  # sent and received; we leave before the reply
                    await conn.request(Echo(text="reply to nobody", delay_s=1.0), timeout=0.3)
            async with client_actor(cfg, "observer") as observer:
                conn = observer.connect("echo", echo.endpoints[0], DiagChannel)
                # the slow echo finishes after its sender left; its reply cannot be routed
                await conn.request(Echo(text="wait", delay_s=1.2))
                stats = await conn.request(StatsRequest())
                assert stats.counters["dropped.unroutable"] == 1

    run(main())


def _actor_processes() -> list[psutil.Process]:
    """Our child processes, except multiprocessing's own resource tracker (shared by all spawns)."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if "resource_tracker" not in " ".join(p.cmdline())
    ]


def _port_free(endpoint: str) -> bool:
    port = int(endpoint.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.mark.parametrize("how", ["message", "sigterm"])
def test_graceful_shutdown_drains_and_leaves_nothing_behind(how, tmp_path):
    cfg = fast_config()
    ipc_path = tmp_path / "echo.sock"

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(
                ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0", f"ipc://{ipc_path}"])
            )
            proc = psutil.Process(echo.pid)
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            in_flight = asyncio.create_task(conn.request(Echo(text="drained", delay_s=0.5), timeout=30))
            await asyncio.sleep(0.1)  # the slow request is now inside the actor's handler
            mark = len(sup.history)
            if how == "message":
                await conn.send(Shutdown(reason="test"))
                ev = await sup.wait_event("shut_down", "echo", after=mark, timeout=30)
                assert ev.detail == "test"  # the Shutdown message's reason
            else:
                code = await sup.stop("echo")
                assert code == 0
                ev = sup.history[-1]
                assert ev.kind == "stopped"
            assert (await in_flight).text == "drained"  # drained before closing
            assert ev.exitcode == 0 and not proc.is_running()
            assert not ipc_path.exists()  # ipc endpoint unlinked
            assert _port_free(echo.endpoints[0])  # tcp port released
        assert _actor_processes() == []

    run(main())


def test_supervisor_restarts_crashes_then_gives_up():
    cfg = fast_config("supervisor.max_restarts=2", "supervisor.restart_window_s=120")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(
                ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], options={"crash_on": "crash"})
            )
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            for n in range(3):
                await conn.wait_alive(30)
                mark = len(sup.history)
                with pytest.raises(PeerDead):
                    await conn.request(Echo(text="crash"), timeout=30)
                kind = "restarted" if n < 2 else "gave_up"
                ev = await sup.wait_event(kind, "echo", after=mark, timeout=60)
                exited = [e for e in sup.history[mark:] if e.kind == "exited"]
                assert exited and exited[0].exitcode == 70
            assert ev.kind == "gave_up" and ev.restarts == 2

    run(main())


def test_restart_within_liveness_fails_only_the_requests_it_lost():
    # liveness far longer than the restart: the client learns of it from the new incarnation
    cfg = fast_config("runtime.heartbeat_liveness=50")

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            await conn.wait_alive(10)
            lost = asyncio.create_task(conn.request(Echo(text="lost", delay_s=60), timeout=60))
            await asyncio.sleep(0.1)  # it is inside the old process's handler
            mark = len(sup.history)
            sup.kill("echo")
            await sup.wait_event("exited", "echo", after=mark, timeout=30)
            # sent while no process listens: queued, then delivered to the new incarnation
            queued = asyncio.create_task(conn.request(Echo(text="queued"), timeout=60))
            await sup.wait_event("restarted", "echo", after=mark, timeout=60)
            with pytest.raises(PeerDead, match="1 request\\(s\\) sent before the restart were lost"):
                await lost
            assert (await queued).text == "queued"  # served by the new process, not failed
            assert conn.state == "alive" and client.counters["peers.restarted"] == 1
            assert client.counters.get("peers.dead", 0) == 0

    run(main())


class SlowSetup(Actor):
    """An actor whose setup never finishes (a model that takes forever to load)."""

    async def setup(self) -> None:
        await asyncio.Event().wait()


def test_shutdown_does_not_wait_for_setup():
    cfg = fast_config()

    async def main():
        actor = SlowSetup("slow", runtime=cfg.runtime, codec=cfg.codec, bind=["tcp://127.0.0.1:0"])
        task = asyncio.create_task(actor.run())
        await asyncio.sleep(0.2)  # setup is now stuck
        actor.request_shutdown("test")
        await asyncio.wait_for(task, 10)  # returns although setup never did
        assert not actor.completed and actor.stop_reason == "test"

    run(main())


def test_start_reports_a_mailbox_that_cannot_bind():
    cfg = fast_config()

    async def main():
        async with client_actor(cfg, "first", bind=["tcp://127.0.0.1:0"]) as first:
            second = Actor("second", runtime=cfg.runtime, codec=cfg.codec, bind=first.endpoints)
            with pytest.raises(FatalError, match="second: cannot bind its mailbox to tcp://127.0.0.1:"):
                await second.start()

    run(main())


class FullDisk:
    """A recorder whose every write fails as on a full disk (the fault injected through the constructor)."""

    def __init__(self) -> None:
        self.writes = 0
        self.closed = False

    def record(self, *args, **kwargs) -> None:
        self.writes += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        self.closed = True


def test_recorder_write_errors_never_stop_an_actor():
    cfg = fast_config()

    async def main():
        disk = FullDisk()
        async with client_actor(cfg, "server", bind=["tcp://127.0.0.1:0"]) as server:
            server.recorder = disk
            server.handle = _echo_handler
            async with client_actor(cfg) as client:
                conn = client.connect("server", server.endpoints[0], DiagChannel)
                for i in range(15):
                    assert (await conn.request(Echo(text=str(i)))).text == str(i)
            assert server.recorder is None and disk.closed  # gave up recording, kept serving
            assert server.counters["dropped.record"] == disk.writes == 10

    run(main())


async def _echo_handler(req):
    return EchoReply(text=req.msg.text)


def test_an_actor_pinned_to_cores_runs_only_there():
    """`ActorSpec.cpus` (from `cluster.learner_cpus` / `rollout_cpus`): the process, and what it starts,
    runs on those cores only; a core the machine lacks is a clear error before anything starts."""
    from guirl.errors import InputError
    from guirl.roles import cpu_set

    cfg = fast_config()
    core = max(os.sched_getaffinity(0))

    async def main():
        async with Supervisor(cfg) as sup:
            echo = await sup.start(
                ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], cpus=[core])
            )
            return psutil.Process(echo.pid).cpu_affinity()

    assert run(main()) == [core]
    assert cpu_set([core, core], "cluster.learner_cpus") == [core]
    with pytest.raises(InputError, match=r"cluster.rollout_cpus: core\(s\) \[4096\] not available"):
        cpu_set([4096], "cluster.rollout_cpus")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"crash_onn": "x"}, "unknown option 'crash_onn'"),  # misspelled
        ({"crash_on": 3}, "option 'crash_on': expected `str`, got `int`"),  # ill-typed
    ],
)
def test_a_bad_option_is_refused_naming_its_key_before_any_process_starts(options, said):
    from guirl.runtime.process import ActorOptionsError

    cfg = fast_config()
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    async def main():
        async with Supervisor(cfg) as sup:
            spec = ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], options=options)
            with pytest.raises(ActorOptionsError) as err:
                await sup.start(spec)
            assert str(err.value) == f"actor echo ({ECHO}): {said}"
            assert sup.actors == {} and sup.history == []
            assert {p.pid for p in psutil.Process().children(recursive=True)} == before  # nothing spawned

    run(main())
