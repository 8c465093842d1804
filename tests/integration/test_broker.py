"""The inference broker over real sockets: batching, routing, backpressure, dead engines, bad requests."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.config.schema import InferenceConfig
from guirl.inference.openai import OpenAIEngine
from guirl.inference.scripted import ScriptedEngine
from guirl.messages import Blob, PolicyChannel
from guirl.messages.types import (
    ChatMessage,
    Image,
    PolicyRequest,
    PolicyResponse,
    StatsRequest,
    TextPart,
    WeightsPublished,
)
from guirl.messages.weights import SGLangBucket, WeightGroupSpec, WeightsFromBroadcast, WeightsFromDisk
from guirl.runtime.errors import RemoteError
from guirl.testing.fakes import FakeOpenAIServer
from tests.helpers import client_actor, fast_config, run


def _request(i: int, task: str = "t1", step: int = 0, model: str = "policy") -> PolicyRequest:
    return PolicyRequest(
        episode_id=f"ep{i}",
        step=step,
        task_id=task,
        model=model,
        messages=[ChatMessage(role="user", parts=[TextPart(f"request {i}")])],
    )


@pytest.fixture
def script_dir(tmp_path):
    (tmp_path / "t1.jsonl").write_text(
        json.dumps({"type": "click", "x": 10, "y": 20}) + "\n" + json.dumps({"type": "done"}) + "\n"
    )
    return tmp_path


async def _with_broker(cfg, engines, body, **inference):
    inf = InferenceConfig(**{"max_wait_ms": 50.0, "health_interval_s": 0.2, **inference})
    broker = InferenceBroker(
        "broker",
        BrokerOptions(inference=inf),
        engines=engines,
        runtime=cfg.runtime,
        bind=["tcp://127.0.0.1:0"],
    )
    task = await broker.start()
    try:
        async with client_actor(cfg) as client:
            conn = client.connect("broker", broker.endpoints[0], PolicyChannel)
            return await body(broker, conn)
    finally:
        broker.request_shutdown("test done")
        await asyncio.wait_for(task, 15)


def test_batches_concurrent_requests_and_tags_versions(script_dir):
    cfg = fast_config()
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), latency_s=0.05, max_batch=8)

    async def body(broker, conn):
        replies = await asyncio.gather(*(conn.request(_request(i)) for i in range(8)))
        assert all(isinstance(r, PolicyResponse) for r in replies)
        assert all(r.engine == "s0" and r.policy_version == -1 for r in replies)
        assert all("left_click" in r.text for r in replies)
        # 8 requests arriving together are served in far fewer batches than 8
        assert broker.counters["batched_requests"] == 8
        assert broker.counters["batches"] <= 3
        # weights: the version a response carries is the engine's
        ack = await conn.request(WeightsPublished(version=7, source=WeightsFromDisk(path="")))
        assert ack.ok
        again = await conn.request(_request(9, step=1))
        assert again.policy_version == 7 and "terminate" in again.text

    run(_with_broker(cfg, [engine], body))


def test_batching_off_serves_one_at_a_time(script_dir):
    cfg = fast_config()
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), latency_s=0.01, max_batch=8)

    async def body(broker, conn):
        await asyncio.gather(*(conn.request(_request(i)) for i in range(4)))
        assert broker.counters["batches"] == 4

    run(_with_broker(cfg, [engine], body, max_batch=1))


def test_routes_over_engines_least_loaded(script_dir):
    cfg = fast_config()
    engines = [
        ScriptedEngine(f"s{i}", str(script_dir), screen=(1000, 1000), latency_s=0.1, max_batch=2)
        for i in range(3)
    ]

    async def body(broker, conn):
        replies = await asyncio.gather(*(conn.request(_request(i)) for i in range(6)))
        used = {r.engine for r in replies}
        assert used == {"s0", "s1", "s2"}  # three free engines, three batches: each takes one

    run(_with_broker(cfg, engines, body, max_batch=2, max_wait_ms=0.0))


def test_backpressure_answers_overloaded(script_dir):
    cfg = fast_config()
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), latency_s=0.3, max_batch=1)

    async def body(broker, conn):
        results = await asyncio.gather(*(conn.request(_request(i)) for i in range(8)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, RemoteError)]
        served = [r for r in results if isinstance(r, PolicyResponse)]
        assert refused and all(r.code == "overloaded" and r.transient for r in refused)
        assert len(served) + len(refused) == 8
        assert broker.counters["requests.overloaded"] == len(refused)

    run(_with_broker(cfg, [engine], body, max_batch=1, max_queue=2, max_wait_ms=0.0))


def test_bad_requests_fail_alone(script_dir):
    cfg = fast_config()
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), max_batch=8)

    async def body(broker, conn):
        with pytest.raises(RemoteError) as err:
            await conn.request(_request(0, model="judge"))
        assert err.value.code == "unsupported"
        with pytest.raises(RemoteError) as err:
            await conn.request(_request(1, task="no-such-task"))
        assert not err.value.transient
        ok = await conn.request(_request(2))
        assert isinstance(ok, PolicyResponse)

    run(_with_broker(cfg, [engine], body))


def test_routes_around_a_dead_engine():
    """Two OpenAI-compatible engines on two real servers; one server goes away mid-run: its batch is
    retried on the other engine, later requests avoid it, and it is revived when it answers again."""
    cfg = fast_config()

    async def scenario():
        async with FakeOpenAIServer(lambda req: "from A") as a, FakeOpenAIServer(lambda req: "from B") as b:
            engines = [
                OpenAIEngine("a", base_url=a.base_url, model="m", timeout_s=5),
                OpenAIEngine("b", base_url=b.base_url, model="m", timeout_s=5),
            ]

            async def body(broker, conn):
                first = await asyncio.gather(*(conn.request(_request(i)) for i in range(4)))
                assert {r.text for r in first} <= {"from A", "from B"}
                # A goes down: every request fails, and so do its health checks (were they to pass,
                # the health loop could revive A between a failed batch and its retry)
                a.fail_next(100, status=503)
                a.unhealthy = True
                later = await asyncio.gather(*(conn.request(_request(i)) for i in range(4, 12)))
                assert all(r.text == "from B" for r in later)
                assert broker.counters["batches.failed"] >= 1 or broker.counters["engines.marked_dead"] >= 1
                return True

            return await _with_broker(cfg, engines, body, max_batch=2, max_wait_ms=0.0)

    assert run(scenario())


def test_a_bad_request_does_not_fail_its_batch_mates(script_dir):
    """The scripted engine rejects a whole batch for one request without a script (not retryable): the
    broker serves that batch again one request at a time, so only the bad request fails."""
    cfg = fast_config()
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), latency_s=0.05, max_batch=8)

    async def body(broker, conn):
        requests = [_request(0), _request(1, task="no-such-task"), _request(2), _request(3)]
        results = await asyncio.gather(*(conn.request(r) for r in requests), return_exceptions=True)
        assert isinstance(results[1], RemoteError) and not results[1].transient
        assert all(isinstance(results[i], PolicyResponse) for i in (0, 2, 3)), results
        assert broker.counters["batches.split"] >= 1

    run(_with_broker(cfg, [engine], body, max_wait_ms=200.0))


def test_an_engine_that_hangs_fails_its_batch_after_the_request_timeout(script_dir):
    """A batch still running after `request_timeout_s` counts as the engine failing (nobody waits for
    it): its requests are answered with a retryable error rather than left waiting forever."""
    cfg = fast_config()
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), latency_s=30.0, max_batch=8)

    async def body(broker, conn):
        with pytest.raises(RemoteError) as err:
            await conn.request(_request(0), timeout=4.0)
        assert err.value.transient and "within 0.3 s" in err.value.remote_message
        assert broker.counters["engines.marked_dead"] == 1

    run(_with_broker(cfg, [engine], body, request_timeout_s=0.3, health_interval_s=60.0))


def test_pending_requests_are_bounded_in_bytes(script_dir):
    """Queued and in-flight requests hold their images until answered: past `runtime.inbox_max_bytes`
    of them, a new request is refused as overloaded however short the queue is."""
    cfg = fast_config("runtime.inbox_max_bytes=250000")
    engine = ScriptedEngine("s0", str(script_dir), screen=(1000, 1000), latency_s=0.5, max_batch=1)
    png = Blob(b"\x89PNG" + bytes(100_000))

    def big(i: int) -> PolicyRequest:
        return msgspec.structs.replace(_request(i), images=[Image(data=png, width=1, height=1)])

    async def enqueued(broker, n: int) -> None:
        queue = broker.models["policy"]
        while broker.counters["requests"] < n:  # `changed` is set at every enqueue
            queue.changed.clear()
            await asyncio.wait_for(queue.changed.wait(), 5)

    async def body(broker, conn):
        first = asyncio.create_task(conn.request(big(1)))
        await enqueued(broker, 1)  # being served
        second = asyncio.create_task(conn.request(big(2)))
        await enqueued(broker, 2)  # queued: ~200 KB pending
        with pytest.raises(RemoteError) as err:
            await conn.request(big(3))
        assert err.value.code == "overloaded" and err.value.transient and "bytes" in err.value.remote_message
        assert all(isinstance(r, PolicyResponse) for r in await asyncio.gather(first, second))
        assert broker.pending_bytes == 0  # every answered request stopped counting
        assert isinstance(await conn.request(big(4)), PolicyResponse)

    run(_with_broker(cfg, [engine], body, max_batch=1, max_wait_ms=0.0))


def test_one_passing_fault_is_retried_without_taking_the_engine_out():
    """A rate limit (429) is retried (on the only engine there is) and the engine stays in service;
    an engine that keeps failing is taken out until its health check passes."""
    cfg = fast_config()

    async def scenario():
        async with FakeOpenAIServer(lambda req: "ok") as server:
            engine = OpenAIEngine("a", base_url=server.base_url, model="m", timeout_s=5)

            async def body(broker, conn):
                server.fail_next(1, status=429)
                reply = await conn.request(_request(0))
                assert reply.text == "ok" and broker.counters["requests.retried"] == 1
                assert broker.counters["engines.marked_dead"] == 0
                server.fail_next(3, status=500)  # three failures in a row: out until healthy again
                with pytest.raises(RemoteError) as err:
                    await conn.request(_request(1))
                assert err.value.transient and broker.counters["engines.marked_dead"] == 1
                return True

            return await _with_broker(
                cfg, [engine], body, max_batch=1, max_wait_ms=0.0, health_interval_s=30.0
            )

    assert run(scenario())


def test_weight_group_ranks_are_offset_by_each_engines_tensor_parallel_size(script_dir):
    """An SGLang server with tp GPUs takes tp ranks of the learner's group: engine i's first rank is 1 plus
    the ranks before it; the bucket plan reaches every engine with the group."""
    cfg = fast_config()
    seen: dict[str, tuple[WeightsFromBroadcast, int]] = {}

    class TP(ScriptedEngine):
        def __init__(self, name: str, tp: int) -> None:
            super().__init__(name, script_dir, screen=(1920, 1080))
            self.weight_ranks = tp

        async def update_weights(self, version, source, *, epoch=0, rank=1):
            seen[self.name] = (source, rank)
            self.policy_version = version

        async def health(self):
            return self.name not in down_engines

    down_engines: set[str] = set()
    engines = [TP("a", 2), TP("b", 4), TP("c", 1)]
    group = WeightGroupSpec(host="127.0.0.1", port=1234, world_size=8, layout="sglang")
    buckets = [SGLangBucket(names=["w"], dtypes=["bfloat16"], shapes=[[2, 2]])]
    source = WeightsFromBroadcast(group=group, buckets=buckets)

    async def body(broker, conn):
        await conn.request(WeightsPublished(version=3, source=source))
        return broker.policy_version

    assert run(_with_broker(cfg, engines, body)) == 3
    assert {n: rank for n, (_, rank) in seen.items()} == {"a": 1, "b": 3, "c": 7}
    assert all(s == source and s.buckets == buckets and s.group == group for s, _ in seen.values())

    # engine b goes down: the broker says 3 live ranks; a group sized for all is refused, one sized for the
    # live engines is joined by them alone (c moves up to rank 3)
    seen.clear()

    async def down(broker, conn):
        down_engines.add("b")  # its health check fails from now on: the health loop takes it down
        deadline = asyncio.get_running_loop().time() + 10
        while broker.models["policy"].slots[1].healthy:  # the loop's verdict, polled (it runs every 0.2 s)
            assert asyncio.get_running_loop().time() < deadline, "the health loop never marked b down"
            await asyncio.sleep(0.05)
        stats = await conn.request(StatsRequest())
        assert stats.counters["weights.live_ranks"] == 3
        with pytest.raises(RemoteError, match="healthy engines take 4"):
            await conn.request(WeightsPublished(version=4, source=source))
        assert not seen
        await conn.request(
            WeightsPublished(
                version=4,
                source=WeightsFromBroadcast(
                    group=msgspec.structs.replace(group, world_size=4), buckets=buckets
                ),
            )
        )
        return True

    engines = [TP("a", 2), TP("b", 4), TP("c", 1)]
    assert run(_with_broker(cfg, engines, down))
    assert {n: rank for n, (_, rank) in seen.items()} == {"a": 1, "c": 3}


def test_judge_sglang_engines_launch_on_the_prm_gpus(tmp_path):
    from guirl.actors.broker import make_judge_engines
    from guirl.config.schema import PRMConfig, SGLangBackendConfig

    prm = PRMConfig(
        enabled=True, backend="sglang", engines=2, sglang=SGLangBackendConfig(tp_size=2, port=31000)
    )
    engines = make_judge_engines(
        prm, ckpt="/models/judge", gpus=[["6", "7"], ["4", "5"]], log_dir=str(tmp_path)
    )
    assert [e.name for e in engines] == ["judge-sglang0", "judge-sglang1"]
    assert [e.launch.gpus for e in engines] == [["6", "7"], ["4", "5"]]
    assert [e.weight_ranks for e in engines] == [2, 2]
    argv = engines[1].launch.argv(31050)
    assert argv[argv.index("--model-path") + 1] == "/models/judge"
    assert argv[argv.index("--port") + 1] == "31050" and argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.8" and "--context-length" not in argv
    assert engines[1].launch.port == 31050 and engines[1].launch.log_path.endswith("judge-sglang1.log")


def test_requests_wait_for_an_update_and_a_half_updated_engine_serves_nothing(script_dir):
    """An engine whose update writes its live weights piece by piece (SGLang's buckets) holds no version's
    weights until the update lands: a request arriving meanwhile waits in the queue and is served by the
    new version; an update that fails half-way leaves the engine serving nothing (requests are answered
    `overloaded` at once, retryable) until an update lands whole."""
    from guirl.inference.base import EngineError, took_weights

    cfg = fast_config()
    gates: dict[str, asyncio.Event] = {}

    class Piecewise(ScriptedEngine):
        async def update_weights(self, version, source, *, epoch=0, rank=1):
            self.weights_intact = False  # the first piece is written
            gates["entered"].set()
            await gates["open"].wait()
            if source.path == "broken":
                raise EngineError("piece 2 of 3 failed")
            took_weights(self, version, epoch)

    async def queued(conn) -> int:
        return (await conn.request(StatsRequest())).counters["requests.queued"]

    async def body(broker, conn):
        gates.update(entered=asyncio.Event(), open=asyncio.Event())
        update = asyncio.create_task(
            conn.request(WeightsPublished(version=1, source=WeightsFromDisk(path="ok")))
        )
        await asyncio.wait_for(gates["entered"].wait(), 10)
        request = asyncio.create_task(conn.request(_request(1)))
        while await queued(conn) < 1:  # the broker's own answer: the request waits in its queue
            assert not request.done(), request.result()
        gates["open"].set()
        await update
        served = await request
        assert isinstance(served, PolicyResponse) and served.policy_version == 1

        gates.update(entered=asyncio.Event(), open=asyncio.Event())
        broken = asyncio.create_task(
            conn.request(WeightsPublished(version=2, source=WeightsFromDisk(path="broken")))
        )
        await asyncio.wait_for(gates["entered"].wait(), 10)
        gates["open"].set()
        with pytest.raises(RemoteError, match="piece 2 of 3"):
            await broken
        with pytest.raises(RemoteError, match="no healthy engine") as refused:
            await conn.request(_request(2))
        assert refused.value.transient and refused.value.code == "overloaded"
        stats = await conn.request(StatsRequest())
        assert stats.counters["engine.s0.weights_intact"] == 0 and stats.counters["engine.s0.healthy"] == 1
        await conn.request(
            WeightsPublished(version=3, source=WeightsFromDisk(path="ok"))
        )  # still takes the next update
        again = await conn.request(_request(3))
        assert isinstance(again, PolicyResponse) and again.policy_version == 3

    run(_with_broker(cfg, [Piecewise("s0", script_dir, screen=(1920, 1080))], body))
