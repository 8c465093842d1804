"""Checkpoint and resume of the learner: SIGKILLed after its second update, resumed from its checkpoint,
it makes the third update exactly as an uninterrupted learner does, never trains a trajectory twice, and
ignores a checkpoint that was cut short."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import msgspec
import torch
from safetensors.torch import load_file

from guirl.actors.learner import Learner, LearnerOptions
from guirl.inference.chat import ChatRenderer
from guirl.learner.checkpoint import latest_checkpoint
from guirl.messages import LearnerChannel
from guirl.messages.types import (
    ChatMessage,
    StatsRequest,
    TextPart,
    Trajectory,
)
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor
from tests.helpers import client_actor, fast_config, one_step_trajectory, run, shared_tiny

TRAIN = {"lr": 1e-3, "updates": 3, "checkpoint_every": 1, "weight_sync": "disk", "tis_cap": 2.0}


def _groups(ckpt: Path) -> list[list[Trajectory]]:
    """Three groups of two deterministic trajectories (fixed prompts, responses and behaviour log-probs)."""
    renderer = ChatRenderer.load(ckpt)
    groups = []
    for g in range(3):
        members = []
        for i in range(2):
            msgs = [ChatMessage(role="user", parts=[TextPart(f"Task {g}, attempt {i}: open the file.")])]
            prompt = renderer.render(msgs, []).input_ids
            response = [40 + g, 50 + i, 60, 70 + g]
            reward = 1.0 if i == 0 else -1.0
            members.append(one_step_trajectory(g, i, prompt, response, reward=reward, policy_version=g))
        groups.append(members)
    return groups


def _weights(run_dir: Path, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"v{version:06d}" / "model" / "model.safetensors"))


async def _send(conn, trajectories) -> list[str]:
    return [(await conn.request(t, timeout=60)).note for t in trajectories]


async def _send_in_step(conn, groups) -> None:
    """Each group once the learner has reached the version that played it (a learner never holds a
    trajectory of a version it has not made: it refuses one), waiting for its checkpoint in between."""
    for g, group in enumerate(groups):
        while (await conn.request(StatsRequest())).counters.get("checkpoints", 0) < g:
            await asyncio.sleep(0.05)  # polling a condition, with the test's deadline around it
        assert await _send(conn, group) == ["accepted"] * len(group)


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path_factory, tmp_path):
    cfg = fast_config()
    ckpt = shared_tiny(tmp_path_factory)
    groups = _groups(ckpt)
    straight, broken = tmp_path / "straight", tmp_path / "broken"

    async def uninterrupted():
        learner = Learner(
            "learner",
            msgspec.convert(
                dict(train=TRAIN, ckpt=str(ckpt), run_dir=str(straight), n_samples=2, batch_size=1),
                LearnerOptions,
            ),
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        task = await learner.start()
        try:
            async with client_actor(cfg) as client:
                conn = client.connect("learner", learner.endpoints[0], LearnerChannel)
                await _send_in_step(conn, groups)
                await asyncio.wait_for(learner.updates_done.wait(), 120)
        finally:
            learner.request_shutdown("test done")
            await asyncio.wait_for(task, 30)

    async def killed_and_resumed():
        async with Supervisor(cfg, run_dir=str(broken)) as sup:
            options = {
                "train": TRAIN,
                "ckpt": str(ckpt),
                "run_dir": str(broken),
                "n_samples": 2,
                "batch_size": 1,
            }

            def spec(name: str, **extra) -> ActorSpec:
                return ActorSpec(
                    name=name,
                    target="guirl.actors.learner:Learner",
                    bind=["tcp://127.0.0.1:0"],
                    options={**options, **extra},
                )

            first = await sup.start(spec("learner"))
            async with client_actor(cfg) as client:
                conn = client.connect("learner", first.endpoints[0], LearnerChannel)
                await _send_in_step(conn, groups[:2])
                while (await conn.request(StatsRequest())).counters.get("checkpoints", 0) < 2:
                    await asyncio.sleep(0.05)  # polling a condition, with the test's deadline around it
            sup.kill("learner")
            await sup.wait_event("exited", "learner", timeout=30)
            await sup.stop("learner")
            # a checkpoint cut short by a kill: a temporary directory and a v3 without its learner.json
            (broken / "checkpoints" / ".v000003.tmp" / "model").mkdir(parents=True)
            (broken / "checkpoints" / "v000003" / "model").mkdir(parents=True)
            resume = latest_checkpoint(broken)
            assert resume is not None and resume.name == "v000002"
            shutil.rmtree(broken / "checkpoints" / "v000003")
            second = await sup.start(spec("learner2", resume_from=str(resume)))
            async with client_actor(cfg) as client:
                conn = client.connect("learner", second.endpoints[0], LearnerChannel)
                notes = await _send(conn, groups[1] + groups[2])  # group 1 again: already trained
                await sup.wait_event("completed", "learner2", timeout=120)
            return notes

    run(uninterrupted(), timeout=200)
    notes = run(killed_and_resumed(), timeout=300)
    assert notes[:2] == ["already had it, or not trainable"] * 2 and notes[2:] == ["accepted"] * 2
    a, b = _weights(straight, 3), _weights(broken, 3)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6), name
    # and the update did something: version 3 differs from the starting weights
    start = load_file(str(ckpt / "model.safetensors"))
    assert any(not torch.equal(start[n], a[n]) for n in a if n in start)
    state = json.loads((broken / "checkpoints" / "v000003" / "learner.json").read_text())
    assert state["version"] == 3 and state["trained_episodes"] == sorted(
        f"ep{g}{i}" for g in range(3) for i in range(2)
    )
    lines = [json.loads(x) for x in (broken / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in lines] == [1, 2, 3]
