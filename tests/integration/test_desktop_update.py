"""One positive-advantage update on a desktop action, the whole path: a targets task set up on a real local
desktop, its screen put to the policy in GUI-R1's format (as an env worker of `guirl learn` asks it) through
a real broker (hf engine) over ZeroMQ; the greedy answer rewarded and a sampled one not, in one GRPO group,
sent as trajectories to the real learner; one update, its weights broadcast to the broker: the serving
engine now gives the rewarded answer a higher probability."""

from __future__ import annotations

import asyncio

import msgspec

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.actors.learner import Learner, LearnerOptions
from guirl.agent.gui_r1_desktop import build_gui_r1_prompt
from guirl.agent.prompt import PromptConfig
from guirl.config.schema import InferenceConfig
from guirl.inference.hf import HFEngine
from guirl.messages import LearnerChannel, PolicyChannel
from guirl.messages.blob import Blob
from guirl.messages.types import Image, PolicyRequest, PolicyResponse, SamplingParams, StepSample, Trajectory
from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.tasks.generate import GenerateSpec, generate
from guirl.vmpool.tasks.model import load_task
from guirl.vmpool.tasks.setup import TaskContext, run_setup
from tests.helpers import client_actor, fast_config, run, sharp_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def _trajectory(name: str, reply: PolicyResponse, reward: float, images: list[Image]) -> Trajectory:
    step = StepSample(
        step=0,
        images=images,
        prompt_ids=reply.prompt_ids,
        response_ids=reply.response_ids,
        logprobs=reply.logprobs,
        policy_version=reply.policy_version,
        response_text=reply.text,
    )
    return Trajectory(
        episode_id=name,
        task_id="targets",
        group_id="targets@0",
        sample_index=0 if reward > 0 else 1,
        status="completed",
        reward=reward,
        steps=[step],
        score=1.0 if reward > 0 else 0.0,
    )


def _total(reply: PolicyResponse) -> float:
    return float(sum(reply.logprobs.tolist()))


def test_a_rewarded_desktop_action_becomes_more_likely_in_the_serving_engine(tmp_path):
    cfg = fast_config()
    ckpt = str(sharp_tiny_checkpoint(tmp_path))  # a flat random model's greedy answer flips with any update
    suite = tmp_path / "suite"
    generate(GenerateSpec(str(suite), train=1, test=0))
    (path,) = (suite / "examples" / "targets").iterdir()
    task = load_task(path)

    async def scenario():
        provider = LocalProvider(tmp_path / "vms", width=640, height=400)
        vm = await provider.create("update")
        try:
            async with VMClient(provider.address(vm), timeout_s=60) as client:
                ctx = TaskContext(
                    task_id=task.id,
                    cache_dir=tmp_path / "c",
                    download_cache=tmp_path / "d",
                    width=640,
                    height=400,
                )
                ctx.cache_dir.mkdir()
                await run_setup(client, task.config, ctx)
                screen = await client.screenshot()
        finally:
            await provider.delete(vm)
        prompt = build_gui_r1_prompt(
            task.instruction, [], screen, cfg=PromptConfig(max_pixels=256 * 160, image_factor=32)
        )
        images = [
            Image(data=Blob(p), width=w, height=h) for p, (w, h) in zip(prompt.images, prompt.image_sizes)
        ]

        def ask(sampling: SamplingParams, name: str) -> PolicyRequest:
            return PolicyRequest(
                episode_id=name, step=0, messages=prompt.messages, images=images, sampling=sampling
            )

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
                    # the sharpened head is sensitive: Adam's first step of 1e-5 moves a log-prob a few nats
                    train={"lr": 1e-5, "updates": 1, "weight_sync": "broadcast"},
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
            async with client_actor(cfg) as me:
                policy = me.connect("broker", broker.endpoints[0], PolicyChannel)
                to_learner = me.connect("learner", learner.endpoints[0], LearnerChannel)
                rewarded = await policy.request(ask(GREEDY, "greedy"))
                for seed in range(1, 20):  # a sampled answer other than the greedy one
                    other = await policy.request(
                        ask(SamplingParams(temperature=1.0, max_new_tokens=16, seed=seed), "s")
                    )
                    if other.response_ids.tolist() != rewarded.response_ids.tolist():
                        break
                await to_learner.request(_trajectory("greedy", rewarded, 1.0, images))
                await to_learner.request(_trajectory("other", other, -1.0, images))
                await asyncio.wait_for(learner.updates_done.wait(), 120)
                again = await policy.request(ask(GREEDY, "again"))
                return rewarded, other, again, learner.counters.snapshot()
        finally:
            for actor, t in ((learner, learner_task), (broker, broker_task)):
                actor.request_shutdown("test done")
                await asyncio.wait_for(t, 30)

    rewarded, other, again, counters = run(scenario(), timeout=300)
    assert other.response_ids.tolist() != rewarded.response_ids.tolist()  # two answers, one rewarded
    assert counters["publish.broadcast_bytes"] > 0  # the new weights went over the weight group
    assert rewarded.policy_version == -1 and again.policy_version == 1
    # the engine, serving version 1, answers the same prompt with the rewarded answer, now more likely
    assert again.response_ids.tolist() == rewarded.response_ids.tolist()
    assert _total(again) > _total(rewarded) + 0.1, (_total(rewarded), _total(again))
