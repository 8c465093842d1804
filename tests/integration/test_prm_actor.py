"""The PRM actor over real sockets: a broker serving the policy and the judge, scores to a learner's mailbox,
a bounded queue, redeliveries, and transitions or judges that fail."""

from __future__ import annotations

import asyncio
import io
import json

import msgspec
import pytest
from PIL import Image as PILImage

from guirl.actors.broker import BrokerOptions, InferenceBroker, JudgeModel
from guirl.actors.prm import PRMActor, PRMOptions
from guirl.config.schema import InferenceConfig, PRMConfig
from guirl.inference.scripted import ScriptedEngine, scripted_verdict
from guirl.messages import Blob, LearnerChannel, PRMChannel
from guirl.messages.types import Ack, Image, StepScore, Transition, WeightsPublished
from guirl.messages.weights import WeightsFromDisk
from guirl.runtime.base import Actor
from guirl.runtime.errors import RemoteError
from tests.helpers import client_actor, fast_config, run


def png(color: str) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (64, 40), color).save(buf, format="PNG")
    return buf.getvalue()


def transition(episode: str, step: int, **kw) -> Transition:
    fields = {
        "episode_id": episode,
        "step": step,
        "instruction": "Sort the file",
        "previous_actions": [f"act {i}" for i in range(step)],
        "response": "Action: click\n<tool_call>{}</tool_call>",
        "before": Image(data=Blob(png("white"))),
        "after": Image(data=Blob(png("gray"))),
        "task_id": "t1",
    }
    fields.update(kw)
    return Transition(**fields)


class ScoreSink(Actor):
    """Stands in for the learner's mailbox: keeps every StepScore it is sent."""

    channel = LearnerChannel

    def __init__(self, name: str, **kwargs) -> None:
        super().__init__(name, **kwargs)
        self.scores: list[StepScore] = []
        self.arrived = asyncio.Event()

    async def handle(self, req):
        if isinstance(req.msg, StepScore):
            self.scores.append(req.msg)
            self.arrived.set()
            return Ack()
        return await super().handle(req)

    async def wait_for(self, n: int, timeout: float = 20.0) -> list[StepScore]:
        async with asyncio.timeout(timeout):
            while len(self.scores) < n:
                self.arrived.clear()
                await self.arrived.wait()
        return self.scores


async def _stack(cfg, tmp_path, body, *, judge: dict | None, prm: dict):
    """broker (scripted policy + the judge) <- PRM actor -> score sink; `body(broker, prm, sink, conn)`."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    broker = InferenceBroker(
        "broker",
        BrokerOptions(
            inference=InferenceConfig(max_wait_ms=5.0, health_interval_s=0.2),
            judge=msgspec.convert(judge, JudgeModel) if judge is not None else None,
        ),
        engines=[ScriptedEngine("s0", str(tmp_path / "scripts"), screen=(64, 40))],
        runtime=cfg.runtime,
        bind=["tcp://127.0.0.1:0"],
    )
    sink = ScoreSink("learner", runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
    tasks = [await broker.start(), await sink.start()]
    actor = PRMActor(
        "prm",
        PRMOptions(
            broker=broker.endpoints[0],
            learner=sink.endpoints[0],
            run_dir=str(tmp_path),
            prm=msgspec.convert(prm, PRMConfig),
        ),
        runtime=cfg.runtime,
        bind=["tcp://127.0.0.1:0"],
    )
    tasks.append(await actor.start())
    try:
        async with client_actor(cfg) as client:
            conn = client.connect("prm", actor.endpoints[0], PRMChannel)
            return await body(broker, actor, sink, conn)
    finally:
        for a in (actor, sink, broker):
            a.request_shutdown("test done")
        await asyncio.wait_for(asyncio.gather(*tasks), 15)


SCRIPTED = {"prm": {"backend": "scripted", "votes": 2}, "ckpt": ""}


def test_scores_reach_the_learner_and_are_recorded(tmp_path):
    cfg = fast_config()

    async def body(broker, prm, sink, conn):
        for step in range(3):
            ack = await conn.request(transition("ep7", step))
            assert isinstance(ack, Ack) and ack.note == "queued"
        scores = sorted(await sink.wait_for(3), key=lambda s: s.step)
        for s in scores:
            assert s.score == float(scripted_verdict("ep7", s.step))
            assert (s.votes, s.invalid, s.error) == (2, 0, "")
            assert s.template.startswith("guirl-prm-v1@")
        lines = [json.loads(x) for x in (tmp_path / "episodes/t1/ep7/prm.jsonl").read_text().splitlines()]
        assert sorted(line["step"] for line in lines) == [0, 1, 2]
        assert all(len(line["answers"]) == 2 and "\\boxed{" in line["answers"][0] for line in lines)
        # the policy's engines take new weights; the judge's are never touched
        assert (await conn_broker(broker, prm)).ok
        assert broker.models["policy"].slots[0].engine.policy_version == 5
        assert broker.models["judge"].slots[0].engine.policy_version == -1

    async def conn_broker(broker, prm):
        return await prm.broker.request(WeightsPublished(version=5, source=WeightsFromDisk(path="")))

    run(_stack(cfg, tmp_path, body, judge=SCRIPTED, prm={"backend": "scripted", "votes": 2}))


def test_a_redelivered_transition_is_judged_once(tmp_path):
    cfg = fast_config()

    async def body(broker, prm, sink, conn):
        assert (await conn.request(transition("ep1", 0))).note == "queued"
        assert (await conn.request(transition("ep1", 0))).note == "already have it"
        await conn.request(transition("ep1", 1))
        await sink.wait_for(2)
        assert sorted(s.step for s in sink.scores) == [0, 1]
        assert prm.counters["transitions.duplicate"] == 1

    run(_stack(cfg, tmp_path, body, judge=SCRIPTED, prm={"backend": "scripted"}))


def test_the_queue_is_bounded_and_refusals_are_retryable(tmp_path):
    cfg = fast_config()
    slow = {"prm": {"backend": "scripted", "scripted": {"latency_s": 1.0}}, "ckpt": ""}

    async def body(broker, prm, sink, conn):
        refused = 0
        for step in range(6):
            try:
                await conn.request(transition("ep2", step))
            except RemoteError as exc:
                assert exc.code == "overloaded" and exc.transient
                refused += 1
        # one being judged, two queued: the rest are refused (the worker keeps them and tries again)
        assert refused == 3 and prm.counters["transitions.refused_full"] == 3
        assert len(await sink.wait_for(3)) == 3

    prm_cfg = {"backend": "scripted", "max_concurrency": 1, "max_queue": 2}
    run(_stack(cfg, tmp_path, body, judge=slow, prm=prm_cfg))


def test_bad_transitions_are_counted_and_judging_goes_on(tmp_path):
    cfg = fast_config()

    async def body(broker, prm, sink, conn):
        await conn.request(transition("ep3", 0, before=Image(data=Blob(b"\x89PNG garbage"))))
        await conn.request(transition("../../etc", 0, task_id="../x"))  # judged, but named nowhere on disk
        await conn.request(transition("ep3", 1, response="x" * 100_000 + "{after}<|im_end|>"))
        scores = await sink.wait_for(3)
        assert sorted((s.episode_id, s.step) for s in scores) == [("../../etc", 0), ("ep3", 0), ("ep3", 1)]
        # the step that cannot be judged is answered at once, as an error (the learner need not wait)
        bad = next(s for s in scores if (s.episode_id, s.step) == ("ep3", 0))
        assert bad.score is None and bad.error.startswith("bad input") and "before" in bad.error
        assert prm.counters["transitions.bad"] == 1 and prm.counters["records.unnamed"] == 1
        assert not (tmp_path / "etc").exists() and not (tmp_path.parent / "x").exists()

    # one judging loop: the transitions are taken in order, so the bad one is done before the others
    run(_stack(cfg, tmp_path, body, judge=SCRIPTED, prm={"backend": "scripted", "max_concurrency": 1}))


def test_a_judge_the_broker_does_not_serve_gives_an_error_score(tmp_path):
    cfg = fast_config()

    async def body(broker, prm, sink, conn):
        await conn.request(transition("ep4", 0))
        [s] = await sink.wait_for(1)
        assert s.score is None and s.votes == 0 and "judge" in s.error
        assert prm.counters["steps.error"] == 1

    # no judge behind the broker: the broker refuses the model name (not retryable)
    run(_stack(cfg, tmp_path, body, judge=None, prm={"backend": "scripted"}))


@pytest.mark.parametrize("votes", [1, 3])
def test_invalid_votes_are_counted(tmp_path, votes):
    cfg = fast_config()
    judge = {"prm": {"backend": "scripted", "scripted": {"invalid_every": 1}}, "ckpt": ""}

    async def body(broker, prm, sink, conn):
        await conn.request(transition("ep5", 0))
        [s] = await sink.wait_for(1)
        assert s.score is None and (s.votes, s.invalid) == (votes, votes) and s.error == ""
        assert prm.counters["votes.invalid"] == votes and prm.counters["steps.invalid"] == 1

    run(_stack(cfg, tmp_path, body, judge=judge, prm={"backend": "scripted", "votes": votes}))
