"""The inference broker over real sockets: batching, routing, backpressure, dead engines, bad requests."""

from __future__ import annotations

import asyncio
import json

import pytest

from guirl.actors.broker import InferenceBroker
from guirl.actors.errors import RemoteError
from guirl.config.schema import InferenceConfig
from guirl.inference.openai import OpenAIEngine
from guirl.inference.scripted import ScriptedEngine
from guirl.messages import PolicyChannel
from guirl.messages.types import ChatMessage, PolicyRequest, PolicyResponse, TextPart, WeightsPublished
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
        "broker", inference=inf, engines=engines, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"]
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
        ack = await conn.request(WeightsPublished(version=7, path=""))
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
                a.fail_next(100, status=503)  # A starts failing every request
                later = await asyncio.gather(*(conn.request(_request(i)) for i in range(4, 12)))
                assert all(r.text == "from B" for r in later)
                assert broker.counters["batches.failed"] >= 1 or broker.counters["engines.marked_dead"] >= 1
                return True

            return await _with_broker(cfg, engines, body, max_batch=2, max_wait_ms=0.0)

    assert run(scenario())
