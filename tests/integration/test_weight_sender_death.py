"""A weight update whose sender dies is abandoned at once: the engines keep serving their weights, and the
requests queued meanwhile are answered, instead of every engine waiting for the weight group's timeout.

The learner here is a process of its own that asks the broker to join a weight group and is SIGKILLed
before it ever opens it (as a learner killed mid-publish); the broker runs the `hf` engine on the tiny
Qwen3-VL. The group's transfer timeout (which joining used to wait for) is far beyond the test's deadline;
its join time is 15 s, and a join that times out fails the update rather than abandoning it, so only the
abandonment passes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import socket
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.config.schema import InferenceConfig
from guirl.messages import PolicyChannel
from guirl.messages.types import (
    ChatMessage,
    PolicyRequest,
    PolicyResponse,
    SamplingParams,
    TextPart,
    WeightsPublished,
)
from guirl.messages.weights import WeightGroupSpec, WeightsFromBroadcast
from tests.helpers import client_actor, fast_config, run, shared_tiny

NEVER_S = 600.0  # the group's transfer timeout (which joining waited for before): far past the deadline
JOIN_S = 15.0  # joining the group now waits this long; the update must be abandoned well before


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def learner_process(endpoint: str, group: WeightGroupSpec, conn: Connection) -> None:
    """Tell the broker to join `group` (which this process never opens), say so on `conn`, and wait for
    the answer, until it is killed."""
    import uvloop

    async def main() -> None:
        cfg = fast_config()
        async with client_actor(cfg, "learner") as learner:
            broker = learner.connect("broker", endpoint, PolicyChannel)
            await broker.wait_alive(30)
            conn.send("publishing")
            await broker.request(
                WeightsPublished(version=1, source=WeightsFromBroadcast(group=group)), timeout=NEVER_S
            )

    uvloop.run(main())


def _request(i: int) -> PolicyRequest:
    return PolicyRequest(
        episode_id=f"ep{i}",
        step=0,
        task_id="t",
        messages=[ChatMessage(role="user", parts=[TextPart("click the button")])],
        sampling=SamplingParams(max_new_tokens=4),
    )


def test_an_update_whose_sender_dies_is_abandoned_and_queued_requests_are_served(ckpt):
    from guirl.inference.hf import HFEngine

    cfg = fast_config()
    group = WeightGroupSpec(
        host="127.0.0.1",
        port=_unused_port(),
        world_size=2,
        group_name="guirl-weights-test",
        timeout_s=NEVER_S,
        join_timeout_s=JOIN_S,
    )

    async def main() -> None:
        engine = HFEngine("hf0", ckpt)
        inf = InferenceConfig(max_wait_ms=10.0, health_interval_s=0.2)
        broker = InferenceBroker(
            "broker",
            BrokerOptions(inference=inf),
            engines=[engine],
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        task = await broker.start()
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=learner_process, args=(broker.endpoints[0], group, child), daemon=True)
        proc.start()
        try:
            assert await asyncio.to_thread(parent.poll, 60) and parent.recv() == "publishing"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            slot = broker.models["policy"].slots[0]
            while not slot.draining:  # the update has reached the broker, which drained the engine for it
                assert loop.time() < deadline, "the update never reached the broker"
                await asyncio.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
            async with client_actor(cfg) as client:
                conn = client.connect("broker", broker.endpoints[0], PolicyChannel)
                reply = await conn.request(_request(0), timeout=60)  # queued behind the update
            # answered because the update was abandoned (the counter below): a join that timed out
            # instead would have failed it, not abandoned it
            assert isinstance(reply, PolicyResponse)
            assert reply.policy_version == -1 and engine.policy_version == -1  # the weights it had
            assert broker.counters["weights.abandoned"] == 1 and not slot.draining
        finally:
            proc.kill()
            proc.join(10)
            broker.request_shutdown("test done")
            await asyncio.wait_for(task, 30)

    run(main(), timeout=120)
