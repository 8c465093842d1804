"""The broker feeding engines that batch continuously (SGLang, OpenAI-compatible servers), over real
sockets: each request is sent alone as soon as an engine has a free slot (no batch barrier), in flight per
engine stays under its cap, load goes to the least-loaded engine, failures and timeouts are per request,
and a weight update drains the engines. Engines that batch statically keep their batches.

The engines here are in-test stand-ins whose latency is per request: a request the test holds (`gates`)
finishes when the test releases it, so "a short request overtakes a long one" is an order of events, not
a race of timers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.actors.routing import stream_limit
from guirl.config.schema import InferenceConfig
from guirl.inference.base import EngineDead, EngineError, GenRequest, GenResult
from guirl.inference.openai import OpenAIEngine
from guirl.messages import PolicyChannel
from guirl.messages.types import (
    ChatMessage,
    PolicyRequest,
    PolicyResponse,
    SamplingParams,
    StatsRequest,
    TextPart,
    WeightsPublished,
)
from guirl.messages.weights import WeightsFromDisk, WeightSource
from guirl.runtime.errors import RemoteError
from guirl.testing.fakes import FakeOpenAIServer
from tests.helpers import client_actor, fast_config, run


class StreamEngine:
    """Batches continuously, as an SGLang server does: requests in one `generate` call run side by side and
    each takes its own time. A request whose text is in `gates` waits for that event; one starting with
    `bad` is refused as a bad request; one in `fail_once` fails that way once. Each result is tagged with
    the version the engine served when the request started (a request that straddled an update shows)."""

    supports_tokens = False
    max_batch = 8

    def __init__(
        self,
        name: str,
        gates: dict[str, asyncio.Event],
        *,
        max_inflight: int = 4,
        latency_s: float = 0.0,
    ) -> None:
        self.name = name
        self.gates = gates
        self.max_inflight = max_inflight
        self.latency_s = latency_s
        self.policy_version = -1
        self.dead = False
        self.fail_once: dict[str, Exception] = {}
        self.inflight = 0  # requests inside `generate`
        self.peak = 0
        self.calls = 0  # `generate` calls running
        self.peak_calls = 0
        self.batches: list[int] = []  # size of each call
        self.started: list[str] = []
        self.finished: list[str] = []
        self.straddled: list[str] = []  # served across a weight update (must stay empty)
        self.updates: list[tuple[int, int]] = []  # (version, requests in flight when it began)

    async def start(self) -> None:
        pass

    async def health(self) -> bool:
        return not self.dead

    async def close(self) -> None:
        pass

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        self.updates.append((version, self.inflight))
        self.policy_version = version

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        self.batches.append(len(batch))
        self.calls += 1
        self.peak_calls = max(self.peak_calls, self.calls)
        self.inflight += len(batch)
        self.peak = max(self.peak, self.inflight)
        # started as they enter (not when gather first runs each one): whoever sees `inflight` sees them too
        self.started.extend(r.messages[0].parts[0].text for r in batch)
        try:
            return list(await asyncio.gather(*(self._one(r) for r in batch)))
        finally:
            self.inflight -= len(batch)
            self.calls -= 1

    async def _one(self, req: GenRequest) -> GenResult:
        text = req.messages[0].parts[0].text
        version = self.policy_version
        if text.startswith("bad"):
            raise EngineError(f"{text}: prompt too long", retryable=False)
        if text in self.fail_once:
            raise self.fail_once.pop(text)
        if text in self.gates:
            await self.gates[text].wait()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)  # simulated generation time, not synchronisation
        if self.dead:
            raise EngineDead(f"{self.name} is gone")
        if version != self.policy_version:
            self.straddled.append(text)
        self.finished.append(text)
        return GenResult(text=f"{self.name}:{text}", engine=self.name, policy_version=version)


class StaticEngine(StreamEngine):
    """Batches statically, as the hf engine does (one `generate` call at a time, batches of `max_batch`)."""

    def __init__(self, name: str, gates: dict[str, asyncio.Event], *, max_batch: int = 3) -> None:
        super().__init__(name, gates, max_inflight=0)
        self.max_batch = max_batch


def _request(text: str, max_new_tokens: int = 16) -> PolicyRequest:
    return PolicyRequest(
        episode_id=f"ep-{text}",
        step=0,
        messages=[ChatMessage(role="user", parts=[TextPart(text)])],
        sampling=SamplingParams(max_new_tokens=max_new_tokens),
    )


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Poll a condition of the broker or an engine until it holds (or fail after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def _broker(engines: list, **inference) -> AsyncIterator[tuple[InferenceBroker, object]]:
    """A broker over `engines` and a client connection to it. On the way out: every request was answered
    exactly once (an answer stops counting its bytes, so a missing one leaves bytes and a second one makes
    them negative; a second answer would also reach the client as a late reply)."""
    cfg = fast_config()
    inf = InferenceConfig(**{"max_wait_ms": 0.0, "health_interval_s": 0.1, **inference})
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
            yield broker, conn
            assert broker.pending_bytes == 0
            assert client.counters["late_replies"] == 0
    finally:
        broker.request_shutdown("test done")
        await asyncio.wait_for(task, 15)


@pytest.mark.parametrize("dispatch", ["auto", "batch"])
def test_a_short_request_overtakes_a_long_one_sent_earlier_to_the_same_engine(dispatch):
    """Streaming: a short request sent while a long one runs on the same engine is answered first, the long
    one still running. The same engine under `dispatch = "batch"` (the barrier) answers it only after."""
    gates = {"long": asyncio.Event()}
    engine = StreamEngine("s0", gates)

    async def scenario():
        async with _broker([engine], dispatch=dispatch) as (broker, conn):
            long = asyncio.create_task(conn.request(_request("long", max_new_tokens=512)))
            await _until(lambda: engine.inflight == 1, "the long request runs")
            short = asyncio.create_task(conn.request(_request("short")))
            if dispatch == "auto":
                reply = await asyncio.wait_for(short, 5)
                assert reply.text == "s0:short" and not long.done()
                gates["long"].set()
                assert (await long).text == "s0:long"
                assert engine.peak == 2 and engine.batches == [1, 1]
                assert broker.counters["requests.streamed"] == 2 and broker.counters["batches"] == 0
            else:
                await _until(lambda: broker.counters["requests"] == 2, "the short request is queued")
                gates["long"].set()
                await asyncio.gather(long, short)
                assert engine.peak == 1 and broker.counters["batches"] == 2
            return engine.finished

    order = run(scenario(), timeout=30)
    assert order == (["short", "long"] if dispatch == "auto" else ["long", "short"])


def test_inflight_is_capped_per_engine_and_goes_to_the_least_loaded():
    """Two engines with caps 2 and 3: of 8 held requests, 5 are in flight (each engine at its cap), 3 wait
    at the broker; none ever exceeds its cap. Then load is tokens in flight: with a 2000-token request on
    one engine, short requests go to the other even when it has more requests in flight."""
    gates = {f"g{i}": asyncio.Event() for i in range(8)}
    a, b = StreamEngine("a", gates, max_inflight=2), StreamEngine("b", gates, max_inflight=3)

    async def capped():
        async with _broker([a, b]) as (broker, conn):
            tasks = [asyncio.create_task(conn.request(_request(f"g{i}"))) for i in range(8)]
            await _until(lambda: broker.counters["requests"] == 8, "all 8 are at the broker")
            await _until(lambda: a.inflight + b.inflight == 5, "both engines are full")
            assert (a.inflight, b.inflight) == (2, 3)
            stats = await conn.request(StatsRequest())
            assert stats.counters["requests.inflight"] == 5 and stats.counters["requests.queued"] == 3
            for gate in gates.values():
                gate.set()
            replies = await asyncio.gather(*tasks)
            assert all(isinstance(r, PolicyResponse) for r in replies)
            assert (a.peak, b.peak) == (2, 3)
            assert {r.engine for r in replies} == {"a", "b"}

    run(capped(), timeout=30)

    gates = {t: asyncio.Event() for t in ("big", "s1", "s2", "s3")}
    a, b = StreamEngine("a", gates), StreamEngine("b", gates)

    async def by_tokens():
        async with _broker([a, b]) as (broker, conn):
            tasks = [asyncio.create_task(conn.request(_request("big", max_new_tokens=2000)))]
            await _until(lambda: a.inflight == 1, "the big request runs on a (both idle: the first)")
            for n, text in enumerate(("s1", "s2", "s3"), start=1):
                tasks.append(asyncio.create_task(conn.request(_request(text))))
                await _until(lambda n=n: b.inflight == n, f"{text} runs on b")
            assert a.started == ["big"] and b.started == ["s1", "s2", "s3"]
            for gate in gates.values():
                gate.set()
            await asyncio.gather(*tasks)

    run(by_tokens(), timeout=30)


def test_failures_are_per_request_retried_elsewhere_or_answered_alone():
    """A retryable failure sends that request to the other engine; a request refused as bad is answered alone
    with a non-retryable error and does not count against the engine (three in a row leave it in service);
    the requests in flight beside them on the same engine are untouched."""
    gates = {"held-a": asyncio.Event(), "held-b": asyncio.Event()}
    a, b = StreamEngine("a", gates), StreamEngine("b", gates)
    a.fail_once["flaky"] = EngineError("429 rate limited", retryable=True)

    async def scenario():
        async with _broker([a, b]) as (broker, conn):
            held = [asyncio.create_task(conn.request(_request("held-a")))]
            await _until(lambda: a.inflight == 1, "held-a runs on a")
            held.append(asyncio.create_task(conn.request(_request("held-b"))))
            await _until(lambda: b.inflight == 1, "held-b runs on b")
            reply = await asyncio.wait_for(conn.request(_request("flaky")), 5)
            assert reply.text == "b:flaky" and a.started[-1] == "flaky"
            assert broker.counters["requests.retried"] == 1 and broker.counters["streamed.failed"] == 1
            for i in range(3):
                with pytest.raises(RemoteError) as err:
                    await asyncio.wait_for(conn.request(_request(f"bad{i}")), 5)
                assert not err.value.transient and "prompt too long" in err.value.remote_message
            assert broker.counters["engines.marked_dead"] == 0
            assert all(s.healthy for s in broker.models["policy"].slots)
            assert not any(t.done() for t in held)
            for gate in gates.values():
                gate.set()
            assert [r.text for r in await asyncio.gather(*held)] == ["a:held-a", "b:held-b"]

    run(scenario(), timeout=30)


def test_a_request_that_hangs_times_out_alone():
    """A request still running after `request_timeout_s` fails (retryable) on its own; requests sent to the
    same engine after it are answered meanwhile, and one timeout does not take the engine out."""
    gates = {"hang": asyncio.Event()}  # never set
    engine = StreamEngine("s0", gates)

    async def scenario():
        async with _broker([engine], request_timeout_s=0.5, max_attempts=1) as (broker, conn):
            hang = asyncio.create_task(conn.request(_request("hang")))
            await _until(lambda: engine.inflight == 1, "the hanging request runs")
            quick = await asyncio.wait_for(
                asyncio.gather(*(conn.request(_request(f"q{i}")) for i in range(3))), 5
            )
            assert [r.text for r in quick] == ["s0:q0", "s0:q1", "s0:q2"] and not hang.done()
            with pytest.raises(RemoteError) as err:
                await hang
            assert err.value.transient and "within 0.5 s" in err.value.remote_message
            assert broker.counters["engines.marked_dead"] == 0
            assert (await conn.request(_request("after"))).text == "s0:after"

    run(scenario(), timeout=30)


def test_a_dead_engines_requests_go_elsewhere_and_none_healthy_answers_the_queue():
    """An engine dies with two requests in flight: both are retried on the other one (it is marked dead
    once). When that one dies too, its queued requests are answered `overloaded` by the health loop and
    its requests in flight with the engine's error: each exactly once."""
    gates = {f"r{i}": asyncio.Event() for i in range(8)}
    a, b = StreamEngine("a", gates, max_inflight=2), StreamEngine("b", gates, max_inflight=2)

    async def scenario():
        async with _broker([a, b]) as (broker, conn):
            tasks = [asyncio.create_task(conn.request(_request(f"r{i}"))) for i in range(4)]
            await _until(lambda: a.inflight == 2 and b.inflight == 2, "both engines are full")
            a.dead = True
            for i in range(4):
                gates[f"r{i}"].set()
            replies = await asyncio.wait_for(asyncio.gather(*tasks), 5)
            assert {r.engine for r in replies} == {"b"}
            assert broker.counters["engines.marked_dead"] == 1 and broker.counters["requests.retried"] == 2
            await _until(lambda: not broker.models["policy"].slots[0].healthy, "a is out")

            tasks = [asyncio.create_task(conn.request(_request(f"r{i}"))) for i in range(4, 8)]
            await _until(lambda: b.inflight == 2 and broker.counters["requests"] == 8, "b full, 2 queued")
            b.dead = True  # its health check fails: the health loop answers the queue
            await _until(lambda: broker.counters["engines.marked_dead"] == 2, "the health loop marks b")
            for i in range(4, 8):
                gates[f"r{i}"].set()
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
            assert all(isinstance(r, RemoteError) and r.transient for r in results), results
            assert sum("no healthy engine" in r.remote_message for r in results) == 2
            with pytest.raises(RemoteError, match="no healthy engine"):
                await conn.request(_request("later"))

    run(scenario(), timeout=30)


def test_backpressure_holds_with_streaming():
    """In flight at the engine's cap and the queue full, a new request is refused `overloaded` at once."""
    gates = {"g0": asyncio.Event(), "g1": asyncio.Event()}
    engine = StreamEngine("s0", gates, max_inflight=1)

    async def scenario():
        async with _broker([engine], max_queue=1) as (broker, conn):
            tasks = [asyncio.create_task(conn.request(_request("g0")))]
            await _until(lambda: engine.inflight == 1, "g0 runs")
            tasks.append(asyncio.create_task(conn.request(_request("g1"))))
            await _until(lambda: broker.counters["requests"] == 2, "g1 waits at the broker")
            with pytest.raises(RemoteError) as err:
                await conn.request(_request("g2"))
            assert err.value.code == "overloaded" and err.value.transient
            for gate in gates.values():
                gate.set()
            await asyncio.gather(*tasks)
            assert engine.peak == 1

    run(scenario(), timeout=30)


def test_a_weight_update_drains_the_engines_first():
    """An update waits for the requests in flight on every engine to end; nothing new starts meanwhile (a
    request arriving waits); the engines update with nothing in flight, together; every answer after the
    update's ack carries the new version, and requests keep being answered."""
    gates = {"old-a": asyncio.Event(), "old-b": asyncio.Event()}
    a, b = StreamEngine("a", gates), StreamEngine("b", gates)
    order: list[tuple[str, int]] = []  # (what, version) in the order the client got the answers

    async def scenario():
        async with _broker([a, b]) as (broker, conn):

            async def ask(text: str) -> None:
                reply = await conn.request(_request(text))
                order.append((text, reply.policy_version))

            async def update() -> None:
                await conn.request(WeightsPublished(version=1, source=WeightsFromDisk(path="/weights/1")))
                order.append(("update", 1))

            old = [asyncio.create_task(ask("old-a"))]
            await _until(lambda: a.inflight == 1, "old-a runs on a")
            old.append(asyncio.create_task(ask("old-b")))
            await _until(lambda: b.inflight == 1, "old-b runs on b")
            updating = asyncio.create_task(update())
            slots = broker.models["policy"].slots
            await _until(lambda: all(s.draining for s in slots), "both engines drain")
            new = asyncio.create_task(ask("new"))
            await _until(lambda: broker.counters["requests"] == 3, "the new request is queued")
            assert not updating.done() and a.updates == b.updates == []
            gates["old-a"].set()
            await old[0]
            assert not updating.done() and a.updates == []  # b still has old-b in flight
            gates["old-b"].set()
            await asyncio.wait_for(asyncio.gather(updating, new, *old), 5)
            await asyncio.gather(*(ask(f"after{i}") for i in range(6)))
            assert not any(s.draining for s in slots) and broker.policy_version == 1
            assert broker.counters["weights.updates"] == 1

    run(scenario(), timeout=30)
    assert a.updates == b.updates == [(1, 0)]  # each updated with nothing in flight
    assert a.straddled == b.straddled == []
    acked = order.index(("update", 1))
    assert {v for _, v in order[:acked]} == {-1} and {t for t, _ in order[:acked]} == {"old-a", "old-b"}
    assert {v for _, v in order[acked + 1 :]} == {1} and len(order) == 10


def test_a_weight_update_is_not_starved_by_a_steady_load():
    """Eight clients keep both engines full, each sending its next request the moment it has an answer: an
    update still completes promptly (nothing new starts once it waits), no answer after its ack carries the
    old version, and the clients are served after it."""
    gates: dict[str, asyncio.Event] = {}
    a, b = (StreamEngine(n, gates, max_inflight=2, latency_s=0.005) for n in ("a", "b"))
    stop = asyncio.Event()
    versions_after_ack: list[int] = []
    acked = False

    async def scenario():
        nonlocal acked
        async with _broker([a, b]) as (broker, conn):

            async def client(c: int) -> None:
                k = 0
                while not stop.is_set():
                    reply = await conn.request(_request(f"c{c}-{k}"))
                    if acked:
                        versions_after_ack.append(reply.policy_version)
                    k += 1

            clients = [asyncio.create_task(client(c)) for c in range(8)]
            await _until(lambda: broker.counters["requests.streamed"] >= 40, "the load runs")
            # under load, the update is not starved: it is answered (the deadline only guards a hang)
            await asyncio.wait_for(
                conn.request(WeightsPublished(version=1, source=WeightsFromDisk(path="/weights/1"))), 20
            )
            acked = True
            served = broker.counters["requests.streamed"]
            await _until(lambda: broker.counters["requests.streamed"] >= served + 40, "served after it")
            stop.set()
            await asyncio.wait_for(asyncio.gather(*clients), 5)

    run(scenario(), timeout=60)
    assert versions_after_ack and set(versions_after_ack) == {1}
    assert a.updates == b.updates == [(1, 0)] and a.straddled == b.straddled == []
    assert a.peak <= 2 and b.peak <= 2


def test_static_engines_keep_their_batches():
    """An engine that batches statically (as hf does) gets batches of up to its `max_batch`, one call at a
    time; `inference.dispatch` picks the mode of each engine (`auto`: what the engine declares)."""
    gates = {"first": asyncio.Event()}
    engine = StaticEngine("hf0", gates, max_batch=3)

    async def scenario():
        async with _broker([engine], max_wait_ms=0.0) as (broker, conn):
            first = asyncio.create_task(conn.request(_request("first")))
            await _until(lambda: engine.inflight == 1, "the first batch runs")
            rest = [asyncio.create_task(conn.request(_request(f"r{i}"))) for i in range(6)]
            await _until(lambda: broker.counters["requests"] == 7, "six wait behind it")
            gates["first"].set()
            await asyncio.gather(first, *rest)
            assert engine.batches == [1, 3, 3] and engine.peak_calls == 1
            assert broker.counters["batches"] == 3 and broker.counters["requests.streamed"] == 0

    run(scenario(), timeout=30)
    streaming = StreamEngine("sg", {}, max_inflight=5)
    assert [stream_limit(engine, d) for d in ("auto", "batch", "stream")] == [0, 0, 3]
    assert [stream_limit(streaming, d) for d in ("auto", "batch", "stream")] == [5, 0, 5]


def test_an_openai_engine_streams_up_to_its_concurrency_and_stays_healthy_when_full():
    """A real OpenAI-compatible engine over HTTP declares its `max_concurrency` as its in-flight cap: the
    broker keeps that many completions running and queues the rest, and the engine's health probe still
    answers while every completion slot is taken (a probe waiting behind them would take it out)."""
    gate = asyncio.Event()

    async def responder(request: dict) -> str:
        await gate.wait()
        return "ok"

    async def scenario():
        async with FakeOpenAIServer(responder) as server:
            engine = OpenAIEngine("oa", base_url=server.base_url, model="fake-model", max_concurrency=2)
            assert engine.max_inflight == 2
            async with _broker([engine]) as (broker, conn):
                tasks = [asyncio.create_task(conn.request(_request(f"r{i}"))) for i in range(3)]
                await _until(lambda: server.max_inflight == 2 and broker.counters["requests"] == 3, "2 run")
                assert broker.models["policy"].inflight == 2 and len(broker.models["policy"].queue) == 1
                assert await asyncio.wait_for(engine.health(), 2.0)
                gate.set()
                assert [r.text for r in await asyncio.gather(*tasks)] == ["ok"] * 3
                assert server.max_inflight == 2 and broker.counters["requests.streamed"] == 3

    run(scenario(), timeout=30)
    from guirl.inference.sglang import SGLangEngine  # the other engine that batches continuously

    sglang = SGLangEngine("sg", "/no/ckpt", url="http://127.0.0.1:1", max_concurrency=7)
    assert sglang.max_inflight == 7
