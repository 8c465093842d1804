"""The env worker in one process with a real coordinator, a real broker (scripted engine) and a real local
VM: how an episode holds its VM while the policy is slow."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec

from guirl.actors.broker import BrokerOptions, InferenceBroker
from guirl.actors.coordinator import Coordinator
from guirl.actors.env_worker import EnvWorker, EnvWorkerOptions
from guirl.agent.actions import Wait
from guirl.agent.parse import parse_response
from guirl.config.schema import InferenceConfig
from guirl.inference.scripted import ScriptedEngine
from guirl.messages import LearnerChannel
from guirl.messages.types import Ack, EpisodeEnded, ErrorReply, Trajectory
from guirl.runtime.base import Actor, Request
from guirl.vmpool.client import PYAUTOGUI_TIMEOUT_S
from guirl.vmpool.tasks.suite import SuiteTask
from tests.helpers import fast_config, run

PATIENT = "runtime.heartbeat_liveness=25"
"""None of these tests is about detecting a dead peer: 5 s of silence before one is declared dead, so a test
process starved of CPU by a heavy test beside it (a chaos run on the other xdist worker) is not taken for
dead mid-episode, and the episode retried."""

INFEASIBLE = {"id": "t-infeasible", "instruction": "Do the impossible.", "evaluator": {"func": "infeasible"}}


def test_a_slow_policy_keeps_its_vm(tmp_path):
    """The policy thinks for longer than the VM lease's TTL (a real model under load does, for minutes):
    the episode keeps its VM and is scored, rather than losing it mid-episode to the pool (which resets it
    and lends it to another episode) and ending as an environment error."""
    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "t-infeasible.jsonl").write_text(json.dumps({"type": "fail"}) + "\n")
    ttl = 0.5

    async def scenario():
        coord = Coordinator(
            "coordinator",
            tasks=[SuiteTask("t-infeasible", "d", INFEASIBLE)],
            max_steps=3,
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        engine = ScriptedEngine("s0", scripts, screen=(640, 480), latency_s=3 * ttl)
        broker = InferenceBroker(
            "broker",
            BrokerOptions(inference=InferenceConfig(max_wait_ms=0.0)),
            engines=[engine],
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        coord_task, broker_task = await coord.start(), await broker.start()
        worker = EnvWorker(
            "worker0",
            msgspec.convert(
                dict(
                    coordinator=coord.endpoints[0],
                    broker=broker.endpoints[0],
                    run_dir=str(tmp_path / "run"),
                    env={"provider": "local", "screen_width": 640, "screen_height": 480, "prewarm_envs": 1},
                    agent={"max_pixels": 640 * 480},
                    lease_ttl_s=ttl,
                    pool_health_interval_s=ttl / 3,
                ),
                EnvWorkerOptions,
            ),
            runtime=cfg.runtime,
        )
        try:
            worker_task = await worker.start()
            await asyncio.wait_for(coord.all_done.wait(), 30)
            await asyncio.wait_for(worker_task, 30)  # its slots are told "done": it finishes by itself
        finally:
            for actor, task in ((broker, broker_task), (coord, coord_task)):
                actor.request_shutdown("test done")
                await asyncio.wait_for(task, 15)
        return coord

    coord = run(scenario(), timeout=60)
    result = coord.results[("t-infeasible#g", 0)]
    assert result.env_errors == [] and result.attempts == 1, result
    assert result.status == "completed" and result.outcome == "fail" and result.score == 1.0


def test_the_longest_wait_fits_in_the_execute_timeout():
    """In OSWorld's pyautogui action space a `wait` runs on the VM as `time.sleep` through `/execute`:
    the longest wait the parser lets through must finish well within that call's timeout, or a policy that
    waits is scored as a VM fault."""
    longest = parse_response(
        '{"action": "wait", "time": 1e9}', screen=(640, 480), coordinates="relative"
    ).actions
    assert longest == [Wait(seconds=longest[0].seconds)]
    assert PYAUTOGUI_TIMEOUT_S >= longest[0].seconds + 20


def test_train_mode_sends_the_exact_engine_tokens_to_the_learner(tmp_path_factory, tmp_path):
    """In train mode an episode's steps reach the learner as one `Trajectory`: the engine's exact prompt
    and response token ids and behaviour log-probs per step, each prompt image once, the outcome reward."""
    from guirl.inference.hf import HFEngine
    from tests.helpers import shared_tiny

    cfg = fast_config(PATIENT)
    ckpt = shared_tiny(tmp_path_factory)
    received: list[Trajectory] = []

    async def scenario():
        coord = Coordinator(
            "coordinator",
            tasks=[SuiteTask("t-infeasible", "d", INFEASIBLE)],
            mode="train",
            n_samples=1,
            max_groups=1,
            max_steps=2,
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        broker = InferenceBroker(
            "broker",
            BrokerOptions(inference=InferenceConfig(max_wait_ms=0.0)),
            engines=[HFEngine("hf0", ckpt)],
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        learner = _Learner(received, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        tasks = [await a.start() for a in (coord, broker, learner)]
        worker = EnvWorker(
            "worker0",
            msgspec.convert(
                dict(
                    coordinator=coord.endpoints[0],
                    broker=broker.endpoints[0],
                    learner=learner.endpoints[0],
                    run_dir=str(tmp_path / "run"),
                    env={"provider": "local", "screen_width": 640, "screen_height": 480, "prewarm_envs": 1},
                    agent={"max_pixels": 320 * 240, "max_new_tokens": 16, "temperature": 1.0},
                ),
                EnvWorkerOptions,
            ),
            runtime=cfg.runtime,
        )
        try:
            worker_task = await worker.start()
            await asyncio.wait_for(coord.all_done.wait(), 60)
            await asyncio.wait_for(worker_task, 30)
        finally:
            for actor, task in zip((coord, broker, learner), tasks, strict=True):
                actor.request_shutdown("test done")
                await asyncio.wait_for(task, 15)
        return coord

    coord = run(scenario(), timeout=120)
    (result,) = coord.results.values()
    assert result.status == "completed" and result.env_errors == []
    (traj,) = received
    assert traj.group_id == "t-infeasible@0" and traj.sample_index == 0 and traj.status == "completed"
    assert traj.reward in (-1.0, 1.0) and traj.score == result.score and traj.outcome == result.outcome
    assert 1 <= len(traj.steps) <= 2 and traj.screens
    for step in traj.steps:
        n = step.response_ids.shape[0]
        assert 0 < n <= 16 and step.logprobs.shape == [n] and step.prompt_ids.shape[0] > n
        assert all(lp <= 0.0 for lp in step.logprobs.tolist())
        assert step.image_refs and all(0 <= i < len(traj.screens) for i in step.image_refs)
        assert step.policy_version == -1 and not step.images
    # each screenshot travels once, however many prompts it is in
    assert len(traj.screens) == len({bytes(s.data.data) for s in traj.screens})


class _TokenScripted(ScriptedEngine):
    """The scripted policy with token ids attached (made-up ones: the worker only carries them), so that a
    multi-step episode can run in train mode and stream its steps to the PRM."""

    supports_tokens = True

    async def generate(self, batch):
        results = await super().generate(batch)
        for r in results:
            r.prompt_ids, r.response_ids, r.logprobs = [1, 2, 3], [4, 5], [-0.5, -0.7]
        return results


class _Learner(Actor):
    """A learner's mailbox: it keeps every trajectory offered (in `offered`) and refuses the first `refuse`
    with an error not worth retrying."""

    channel = LearnerChannel

    def __init__(self, offered: list, *, refuse: int = 0, **kwargs) -> None:
        super().__init__("learner", **kwargs)
        self.offered, self.refuse = offered, refuse

    async def handle(self, req: Request):
        if isinstance(req.msg, Trajectory):
            self.offered.append(req.msg)
            if len(self.offered) <= self.refuse:
                return ErrorReply(code="schema", message="not this one", retryable=False)
            return Ack()
        return await super().handle(req)


async def _one_task(
    tmp_path,
    cfg,
    engine,
    body,
    *,
    learner=None,
    prm=None,
    mode="train",
    max_steps=5,
    agent=None,
    coordinator=Coordinator,
    worker_cls=EnvWorker,
    **worker_options,
):
    """The infeasible task, once, in this process: a real coordinator (of class `coordinator`; `mode` train:
    one sample of one group), a broker with `engine`, `learner` and `prm` (actors on those channels, made by
    the test), and an env worker with one 640x480 local VM (of class `worker_cls`, with `agent` settings on
    top of a small image budget); returns `body(coord, worker, worker_task)`, then stops every actor."""
    train = {"n_samples": 1, "max_groups": 1} if mode == "train" else {}
    coord = coordinator(
        "coordinator",
        tasks=[SuiteTask("t-infeasible", "d", INFEASIBLE)],
        mode=mode,
        **train,
        max_steps=max_steps,
        runtime=cfg.runtime,
        bind=["tcp://127.0.0.1:0"],
    )
    broker = InferenceBroker(
        "broker",
        BrokerOptions(inference=InferenceConfig(max_wait_ms=0.0)),
        engines=[engine],
        runtime=cfg.runtime,
        bind=["tcp://127.0.0.1:0"],
    )
    actors = (coord, broker, *(a for a in (learner, prm) if a is not None))
    tasks = [await a.start() for a in actors]
    options = {
        "coordinator": coord.endpoints[0],
        "broker": broker.endpoints[0],
        **({"learner": learner.endpoints[0]} if learner is not None else {}),
        **({"prm": prm.endpoints[0]} if prm is not None else {}),
        "run_dir": str(tmp_path / "run"),
        "env": {"provider": "local", "screen_width": 640, "screen_height": 480, "prewarm_envs": 1},
        "agent": {"max_pixels": 320 * 240, **(agent or {})},
        **worker_options,
    }  # as a spec's options are: converted to the worker's typed options
    worker = worker_cls("worker0", msgspec.convert(options, worker_cls.Options), runtime=cfg.runtime)
    try:
        return await body(coord, worker, await worker.start())
    finally:
        for actor, task in zip(actors, tasks, strict=True):
            actor.request_shutdown("test done")
            await asyncio.wait_for(task, 15)


def _prm_episode(tmp_path, prm_handler, **worker_options):
    """One 3-step train episode (click, click, done) on a local VM; the PRM's mailbox is `prm_handler`.
    Returns (the trajectory the learner got, the episode's folder)."""
    from guirl.messages import PRMChannel
    from guirl.runtime.base import Actor

    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    lines = [{"type": "click", "x": 100, "y": 100}, {"type": "click", "x": 200, "y": 150}, {"type": "done"}]
    (scripts / "t-infeasible.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    received: list[Trajectory] = []

    class PRM(Actor):
        channel = PRMChannel

        async def handle(self, req: Request):
            return prm_handler(req.msg)

    async def scenario():
        async def body(coord, worker, worker_task):
            await asyncio.wait_for(coord.all_done.wait(), 60)
            await asyncio.wait_for(worker_task, 30)

        engine = _TokenScripted("s0", str(scripts), screen=(640, 480))
        learner = _Learner(received, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        prm = PRM("prm", runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        await _one_task(tmp_path, cfg, engine, body, learner=learner, prm=prm, **worker_options)

    run(scenario(), timeout=120)
    (traj,) = received
    (folder,) = (tmp_path / "run" / "episodes" / "t-infeasible").iterdir()
    return traj, folder


def test_every_train_step_streams_to_the_prm_with_its_screens(tmp_path):
    """Each step goes to the PRM with the screen the policy saw and the screen its action led to (the
    final screen after the last, terminal, step), the earlier action lines, and the earlier screens asked
    for; the trajectory reaches the learner as usual."""
    from guirl.messages.types import Ack, Transition

    got: list[Transition] = []

    def prm(msg):
        got.append(msg)
        return Ack(note="queued")

    traj, folder = _prm_episode(tmp_path, prm, prm_history_images=1)
    assert [t.step for t in got] == [0, 1, 2] and [s.step for s in traj.steps] == [0, 1, 2]
    assert traj.prm_dropped == []
    shots = [(folder / f"step_{i:03d}.png").read_bytes() for i in range(3)] + [
        (folder / "final.png").read_bytes()
    ]
    for t in got:
        assert bytes(t.before.data) == shots[t.step] and bytes(t.after.data) == shots[t.step + 1]
        assert len(t.previous_actions) == t.step and t.instruction == "Do the impossible."
        assert [bytes(h.data) for h in t.history] == shots[max(0, t.step - 1) : t.step]
        assert (t.task_id, t.group_id) == ("t-infeasible", "t-infeasible@0")
    assert got[1].previous_actions == ["Click at (100, 100)"] and "terminate" in got[2].response


def test_a_prm_that_refuses_everything_stalls_no_episode(tmp_path):
    """The PRM answers `overloaded` to everything: the worker keeps the first transition (retrying it) and,
    past its bound of one, marks the other steps unjudged; the episode is played and delivered as ever."""
    from guirl.messages.types import ErrorReply

    calls = []

    def prm(msg):
        calls.append(msg.step)
        return ErrorReply(code="overloaded", message="full", retryable=True)

    traj, _ = _prm_episode(tmp_path, prm, prm_queue=1)
    assert [s.step for s in traj.steps] == [0, 1, 2] and traj.prm_dropped == [1, 2]
    assert calls and set(calls) == {0}  # only the kept one was offered, again and again


def test_a_gui_r1_policy_acts_on_a_desktop(tmp_path):
    """`agent.response_format = "gui_r1"`: the policy is asked with GUI-R1's prompt and its answers (a click
    in pixels of the image it saw, then `complete`) become typed actions on the real desktop."""
    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    answers = [
        "<think>the terminal</think> <answer>[{'action': 'click', 'point': [160, 120], 'input_text': "
        "'no input text'}]</answer>",
        "<think>done</think> <answer>[{'action': 'complete', 'point': [-100, -100], 'input_text': "
        "'no input text'}]</answer>",
    ]
    (scripts / "t-infeasible.jsonl").write_text("".join(json.dumps({"response": a}) + "\n" for a in answers))

    coord = run(
        _one_episode(
            cfg,
            tmp_path,
            ScriptedEngine("s0", str(scripts), screen=(640, 480)),
            {"response_format": "gui_r1"},
        ),
        timeout=120,
    )
    (result,) = coord.results.values()
    assert result.status == "completed" and result.outcome == "done" and result.steps == 2
    (folder,) = (tmp_path / "run" / "episodes" / "t-infeasible").iterdir()
    lines = [json.loads(x) for x in (folder / "traj.jsonl").read_text().splitlines()]
    # the image shown was 320x224 (smart_resize, factor 32) for a 640x480 screen: the click is scaled
    assert lines[0]["prompt_images"] == [[320, 224]] and lines[0]["refused"] == []
    x, y = round(160 * 640 / 320), round(120 * 480 / 224)
    assert lines[0]["actions"] == [{"type": "click", "x": x, "y": y, "button": "left", "clicks": 1}]
    assert lines[1]["actions"] == [{"type": "done"}]
    text = lines[1]["prompt"][0]["parts"][1]["text"]
    assert "GUI-R1" in text and "Step 1: [{'action': 'click'" in text  # the history, as text


def test_gui_rl_prompt_style_reaches_the_engine(tmp_path_factory, tmp_path):
    """`agent.prompt_style = "gui-rl"`: what the engine receives through the broker is GUI-RL's prompt —
    the tool schema on the system message for the template's second tools block, past responses with the
    end-of-turn token they stopped on, "Execute the tool call" for a step without an `Action:` line — and
    traj.jsonl keeps the schema, so behaviour cloning rebuilds the very prompt."""
    from guirl.inference.chat import ChatRenderer
    from guirl.sft import episode_samples
    from tests.helpers import shared_tiny

    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()

    def call(arguments: dict) -> str:
        return (
            "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": arguments}) + "\n</tool_call>"
        )

    answers = [
        "The desktop.\n</think>\n\n" + call({"action": "left_click", "coordinate": [100, 100]}),
        "Again.\n</think>\n\nAction: Click once more.\n"
        + call({"action": "left_click", "coordinate": [300, 300]}),
        "Action: Give up.\n" + call({"action": "terminate", "status": "failure"}),
    ]
    (scripts / "t-infeasible.jsonl").write_text("".join(json.dumps({"response": a}) + "\n" for a in answers))
    received = []

    class Recording(ScriptedEngine):
        async def generate(self, batch):
            received.extend(batch)
            return await super().generate(batch)

    coord = run(
        _one_episode(
            cfg, tmp_path, Recording("s0", str(scripts), screen=(640, 480)), {"prompt_style": "gui-rl"}
        ),
        timeout=120,
    )
    (result,) = coord.results.values()
    assert result.status == "completed" and result.outcome == "fail" and result.steps == 3
    last = received[-1].messages
    (tool,) = last[0].tools
    assert "(mapped to regular scroll)" in tool and tool in last[0].parts[0].text  # type: ignore[union-attr]
    shown = [m.parts[0].text for m in last if m.role == "assistant"]  # type: ignore[union-attr]
    assert shown == [answers[0] + "<|im_end|>", answers[1] + "<|im_end|>"]
    assert (
        last[-1]
        .parts[-1]
        .text.endswith(  # type: ignore[union-attr]
            "Previous actions:\nStep 1: Execute the tool call\nStep 2: Click once more."
        )
    )
    (folder,) = (tmp_path / "run" / "episodes" / "t-infeasible").iterdir()
    lines = [json.loads(x) for x in (folder / "traj.jsonl").read_text().splitlines()]
    assert [line["prompt"][0]["tools"] for line in lines][-1] == [tool]
    renderer = ChatRenderer.load(shared_tiny(tmp_path_factory, thinking=True))
    samples = episode_samples(tmp_path / "run", renderer, min_score=0.0)
    assert [s.step for s in samples] == [0, 1, 2]
    rebuilt = renderer.tokenizer.decode(samples[-1].prompt_ids, skip_special_tokens=False)
    assert rebuilt.count("\n<tools>\n") == 2 and rebuilt.endswith("<|im_start|>assistant\n<think>\n")


async def _one_episode(cfg, tmp_path: Path, engine, agent: dict) -> Coordinator:
    """One eval episode of the infeasible task, the policy's answers from `engine`, the worker's agent
    settings `agent`: returns the coordinator once the worker is done."""

    async def body(coord, worker, worker_task):
        await asyncio.wait_for(coord.all_done.wait(), 60)
        await asyncio.wait_for(worker_task, 30)
        return coord

    return await _one_task(tmp_path, cfg, engine, body, mode="eval", agent=agent)


def test_a_worker_taken_for_dead_never_delivers_the_episode_it_finishes_anyway(tmp_path):
    """A hung worker (SIGSTOPped, starved, partitioned) is declared dead mid-episode and its episode played
    again; when it wakes and finishes the old one, the coordinator refuses that end and the worker never
    delivers its trajectory: the learner gets the retry's sample only, and the old episode's folder says it
    was refused (the chaos soak found the old order — deliver, then report — training an episode the
    ledger ended in a fault)."""

    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    lines = [{"type": "click", "x": 100, "y": 100}, {"type": "fail"}]
    (scripts / "t-infeasible.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    received: list[Trajectory] = []

    asked: list[asyncio.Event] = []  # made in the test's loop

    class Signalling(_TokenScripted):
        async def generate(self, batch):
            asked[0].set()
            return await super().generate(batch)

    async def scenario():
        asked.append(asyncio.Event())

        async def body(coord, worker, worker_task):
            await asyncio.wait_for(asked[0].wait(), 60)  # the first episode is under way
            ((first, running),) = coord.running.items()
            # what missed heartbeats do: the coordinator ends the episode `retried` and queues it again
            coord.on_peer_dead(running.peer, ConnectionError("missed heartbeats"))
            await asyncio.wait_for(coord.all_done.wait(), 60)
            await asyncio.wait_for(worker_task, 30)
            return coord, worker, first

        engine = Signalling("s0", str(scripts), screen=(640, 480), latency_s=0.5)
        learner = _Learner(received, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        return await _one_task(tmp_path, cfg, engine, body, learner=learner)

    coord, worker, first = run(scenario(), timeout=120)
    (result,) = coord.results.values()
    assert result.status == "completed" and result.attempts == 2 and result.episode_id != first
    (traj,) = received
    assert traj.episode_id == result.episode_id and traj.attempt == 1
    assert coord.ended[first].status == "retried" and coord.counters["episodes.duplicate_end"] == 1
    assert worker.counters["episodes.end_refused"] == 1 and worker.counters["trajectories.sent"] == 1
    old = json.loads((tmp_path / "run" / "episodes" / "t-infeasible" / first / "result.json").read_text())
    assert old["status"] == "refused" and "already ended retried" in old["refused"]


def test_a_trajectory_the_learner_will_not_take_goes_back_and_its_sample_out_again(tmp_path):
    """The learner refuses the first trajectory (an error reply that is not worth retrying): the worker hands
    the episode back to the coordinator, which hands the same sample out again; the second one is
    delivered, and the coordinator holds no sample for delivery at the end."""

    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "t-infeasible.jsonl").write_text(json.dumps({"type": "fail"}) + "\n")
    offered: list[Trajectory] = []

    async def scenario():
        async def body(coord, worker, worker_task):
            await asyncio.wait_for(worker_task, 90)  # two episodes, then "done"
            return coord, worker

        engine = _TokenScripted("s0", str(scripts), screen=(640, 480))
        learner = _Learner(offered, refuse=1, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        return await _one_task(tmp_path, cfg, engine, body, learner=learner, max_steps=3)

    coord, worker = run(scenario(), timeout=120)
    first, second = offered
    assert (first.group_id, first.sample_index) == (second.group_id, second.sample_index)
    assert first.episode_id != second.episode_id
    assert worker.counters["trajectories.undelivered"] == 1 and worker.counters["trajectories.sent"] == 1
    assert coord.counters["episodes.reissued_undelivered"] == 1 and coord.delivering == {}
    (result,) = coord.results.values()
    assert result.episode_id == second.episode_id and result.status == "completed"


def test_a_shutdown_while_the_end_is_reported_lets_the_report_finish(tmp_path):
    """The run's last end ends the run, and the supervisor stops the workers while the coordinator's answer
    is on its way (a CI run found an eval's last episode left `unreported`): the stopping worker waits for the
    answer, records it and hands the sample over before it closes its sockets. Here the coordinator answers
    only once the worker's main loop is cancelled and it is settling."""

    cfg = fast_config(PATIENT)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "t-infeasible.jsonl").write_text(json.dumps({"type": "fail"}) + "\n")
    offered: list[Trajectory] = []
    reported, settling = [], []  # events, made in the test's loop

    class Answering(Coordinator):
        async def handle(self, req: Request):
            if isinstance(req.msg, EpisodeEnded):
                reported[0].set()
                await settling[0].wait()
            return await super().handle(req)

    class Settling(EnvWorker):
        async def settle(self, timeout):
            settling[0].set()
            await super().settle(timeout)

    async def scenario():
        reported.append(asyncio.Event())
        settling.append(asyncio.Event())

        async def body(coord, worker, worker_task):
            await asyncio.wait_for(reported[0].wait(), 60)  # the end is on its way ...
            worker.request_shutdown("test: the run is over")  # ... and the worker is asked to stop
            await asyncio.wait_for(worker_task, 30)
            return coord, worker

        engine = _TokenScripted("s0", str(scripts), screen=(640, 480))
        learner = _Learner(offered, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        return await _one_task(
            tmp_path,
            cfg,
            engine,
            body,
            learner=learner,
            max_steps=3,
            coordinator=Answering,
            worker_cls=Settling,
        )

    coord, worker = run(scenario(), timeout=120)
    (result,) = coord.results.values()
    (traj,) = offered
    assert traj.episode_id == result.episode_id and coord.delivering == {}
    assert worker.counters["episodes.report_cut"] == 0 and worker.counters["trajectories.sent"] == 1
    folder = tmp_path / "run" / "episodes" / "t-infeasible" / result.episode_id
    assert json.loads((folder / "result.json").read_text())["status"] == "completed"
    assert coord.settle_unreported(tmp_path / "run" / "episodes") == 0
