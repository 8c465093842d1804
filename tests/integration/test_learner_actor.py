"""The learner actor over real sockets: trajectories in (as env workers send them), one GRPO update, the
new weights published to a real broker whose hf engine then serves the new version."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.actors.learner import Learner, LearnerOptions
from guirl.config.schema import InferenceConfig
from guirl.inference.hf import HFEngine
from guirl.messages import LearnerChannel, PolicyChannel
from guirl.messages.types import (
    Ack,
    ChatMessage,
    PolicyRequest,
    PolicyResponse,
    SamplingParams,
    StepSample,
    TextPart,
    Trajectory,
)
from tests.helpers import client_actor, fast_config, run, shared_tiny


def _ask(i: int) -> PolicyRequest:
    return PolicyRequest(
        episode_id=f"ep{i}",
        step=0,
        messages=[ChatMessage(role="user", parts=[TextPart(f"Open the file number {i}.")])],
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=i),
    )


def _trajectory(i: int, reply: PolicyResponse, reward: float) -> Trajectory:
    step = StepSample(
        step=0,
        prompt_ids=reply.prompt_ids,
        response_ids=reply.response_ids,
        logprobs=reply.logprobs,
        policy_version=reply.policy_version,
        response_text=reply.text,
    )
    return Trajectory(
        episode_id=f"ep{i}",
        task_id="t",
        group_id="t@0",
        sample_index=i,
        status="completed",
        reward=reward,
        steps=[step],
        score=1.0 if reward > 0 else 0.0,
    )


@pytest.mark.parametrize("weight_sync", ["broadcast", "disk"])
def test_one_update_reaches_the_engines(tmp_path_factory, tmp_path, weight_sync):
    cfg = fast_config()
    ckpt = str(shared_tiny(tmp_path_factory))

    async def scenario():
        broker = InferenceBroker(
            "broker",
            BrokerOptions(inference=InferenceConfig(max_wait_ms=0.0)),
            engines=[HFEngine("hf0", ckpt)],
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        broker_task = await broker.start()
        learner = Learner(
            "learner",
            msgspec.convert(
                dict(
                    train={"lr": 1e-3, "updates": 1, "tis_cap": 2.0, "weight_sync": weight_sync},
                    ckpt=ckpt,
                    run_dir=str(tmp_path / "run"),
                    n_samples=2,
                    batch_size=1,
                    broker=broker.endpoints[0],
                ),
                LearnerOptions,
            ),
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        learner_task = await learner.start()
        try:
            async with client_actor(cfg) as client:
                policy = client.connect("broker", broker.endpoints[0], PolicyChannel)
                to_learner = client.connect("learner", learner.endpoints[0], LearnerChannel)
                replies = [await policy.request(_ask(i)) for i in range(2)]
                assert all(r.policy_version == -1 for r in replies)
                first = _trajectory(0, replies[0], 1.0)
                acks = [await to_learner.request(first), await to_learner.request(first)]
                assert [a.note for a in acks] == ["accepted", "already had it, or not trainable"]
                assert isinstance(await to_learner.request(_trajectory(1, replies[1], -1.0)), Ack)
                await asyncio.wait_for(learner.updates_done.wait(), 60)
                after = await policy.request(_ask(5))
                return after, learner.counters.snapshot()
        finally:
            for actor, task in ((learner, learner_task), (broker, broker_task)):
                actor.request_shutdown("test done")
                await asyncio.wait_for(task, 30)

    after, counters = run(scenario(), timeout=180)
    assert after.policy_version == 1  # the engine serves the learner's first update
    (line,) = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    m = json.loads(line)
    assert m["version"] == 1 and m["trajectories"] == 2 and m["groups"] == 1 and m["reward_mean"] == 0.0
    assert m["samples"] == 2 and m["tokens"] > 0 and m["grad_norm"] > 0 and 0 <= m["learner_idle_frac"] <= 1
    assert m["buffer.trajectories.duplicate"] == 1
    if weight_sync == "broadcast":  # over the weight group: nothing written to disk
        assert counters["publish.broadcast_bytes"] > 0 and not (tmp_path / "run" / "weights").exists()
    else:
        assert [w.name for w in (tmp_path / "run" / "weights").iterdir()] == ["v000001"]
    assert counters.get("publish.failed", 0) == 0
