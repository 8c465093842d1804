"""The `sglang` engine against the SGLang stand-in (SGLang's own HTTP server process on loopback: its routes,
request checks, multimodal processing and weight-update code, the tiny Qwen3-VL behind it): generation equal
to the `hf` engine's, weight updates through SGLang's weight-group routes, a launched server killed and routed
around, and broken replies. One stand-in serves the module (started once: SGLang's import takes seconds);
each test leaves it as it found it (faults off, the checkpoint's weights)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

import asyncio
import base64
import signal
import sys
from pathlib import Path

import pytest
import torch

from guirl.actors.broker import BrokerOptions, InferenceBroker, make_engines
from guirl.config.schema import InferenceConfig, SGLangBackendConfig
from guirl.inference.base import EngineDead, EngineError, GenRequest
from guirl.inference.hf import HFEngine
from guirl.inference.openai import error_message
from guirl.inference.sglang import LaunchSpec, SGLangEngine
from guirl.messages import PolicyChannel
from guirl.messages.types import ChatMessage, PolicyRequest, SamplingParams, TextPart
from guirl.messages.weights import SGLangBucket, WeightsFromBroadcast, WeightsFromDisk
from guirl.testing.fakes import FakeSGLangServer
from guirl.weights.broadcast import WeightGroupSpec, WeightSender, sglang_buckets, unique_group_name
from tests.helpers import client_actor, fast_config, run, shared_tiny
from tests.integration.test_hf_engine import png, screenshot_request

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)
TOOL = '{"type": "function", "function": {"name": "computer_use", "description": "A mouse."}}'
STANDIN = [sys.executable, "-m", "guirl.testing.fakes", "sglang"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def shared(ckpt: Path):
    """A stand-in started as a deterministic server (seeds honoured), joining weight groups for 5 s at most
    (SGLang's own wait is 30 minutes)."""
    with FakeSGLangServer(
        str(ckpt), args=["--enable-deterministic-inference", "--standin-group-timeout", "5"]
    ) as server:
        yield server


@pytest.fixture
def server(shared, ckpt: Path):
    yield shared
    shared.set_faults(healthy=True, generate_status=None, generate_raw=None, hang=False)
    if shared.get_state()["weight_version"] not in (None, "0"):  # a test changed the weights: undo it

        async def restore():
            engine = SGLangEngine("restore", ckpt, url=shared.url, request_timeout_s=60)
            await engine.start()
            try:
                await engine.update_weights(0, WeightsFromDisk(path=str(ckpt)))
            finally:
                await engine.close()

        run(restore())
        assert shared.get_state()["weight_version"] == "0"


def _requests() -> list[GenRequest]:
    return [
        screenshot_request("click the button", png(224, 160), GREEDY, rid="greedy"),
        screenshot_request(
            "type hello",
            png(320, 200, seed=3),
            SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=7),
            rid="sampled",
        ),
        GenRequest(
            messages=[ChatMessage(role="user", parts=[TextPart("no image here")])],
            sampling=SamplingParams(temperature=0.0, max_new_tokens=6),
            request_id="text-only",
        ),
        GenRequest(  # a tool schema for the template's tools block (GUI-RL's prompt style)
            messages=[
                ChatMessage(role="system", parts=[TextPart("sys")], tools=[TOOL]),
                ChatMessage(role="user", parts=[TextPart("use the tool")]),
            ],
            sampling=SamplingParams(temperature=0.0, max_new_tokens=6),
            request_id="tools",
        ),
    ]


async def _one_by_one(engine, requests):
    return [(await engine.generate([r]))[0] for r in requests]


def test_generation_equals_the_hf_engine(ckpt: Path, server) -> None:
    """Same weights, same requests (one at a time, so seeded samples are drawn alike): the same prompt ids,
    response ids, log-probs, finish reasons and text; the request on the wire is SGLang's."""

    async def scenario():
        hf = HFEngine("hf", ckpt)
        await hf.start()
        try:
            want = await _one_by_one(hf, _requests())
        finally:
            await hf.close()
        engine = SGLangEngine("sg", ckpt, url=server.url, request_timeout_s=60)
        await engine.start()
        try:
            assert await engine.health() and engine.deterministic  # the server says so in /server_info
            got = await _one_by_one(engine, _requests())
        finally:
            await engine.close()
        return want, got, (await server.state())["requests"][-len(want) :]

    want, got, sent = run(scenario())
    for w, g in zip(want, got, strict=True):
        assert g.prompt_ids == w.prompt_ids
        assert g.response_ids == w.response_ids
        assert g.finish_reason == w.finish_reason
        assert g.text == w.text
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
        assert g.engine == "sg" and g.policy_version == -1
    body = sent[1]
    assert set(body) == {
        "rid",
        "input_ids",
        "sampling_params",
        "return_logprob",
        "return_prompt_token_ids",
        "image_data",
    }
    assert body["sampling_params"]["sampling_seed"] == 7 and body["sampling_params"]["top_k"] == -1
    assert body["return_logprob"] is True and len(body["image_data"]) == 1
    assert body["image_data"][0].startswith("data:image/png;base64,")
    pad = 915  # <|image_pad|> of the tiny tokenizer: one per image on the wire, expanded by SGLang
    assert body["input_ids"].count(pad) == 1 and want[1].prompt_ids.count(pad) > 1
    assert "sampling_seed" not in sent[0]["sampling_params"]  # greedy: no seed
    assert "image_data" not in sent[2]
    assert (
        sent[3]["input_ids"] == want[3].prompt_ids and len(want[3].prompt_ids) > len(want[2].prompt_ids) + 20
    )


def _perturbed(ckpt: Path, seed: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        state.update(load_file(str(f)))
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
        for k, v in state.items()
    }


@pytest.mark.parametrize("load_format", ["flattened_bucket", "per_tensor"])
def test_weight_updates_through_the_sglang_routes(
    ckpt: Path, tmp_path: Path, load_format: str, server
) -> None:
    """The learner (rank 0) broadcasts in small buckets while the engine asks its server for each bucket:
    twice, through one group joined once. The server serves the new version, flushed its cache, and its
    log-probs equal those of an hf engine that loaded the same weights."""
    from safetensors.torch import save_file

    states = {1: _perturbed(ckpt, 1), 2: _perturbed(ckpt, 2)}
    request = screenshot_request("click the button", png(224, 160), GREEDY)

    async def scenario():
        sender = WeightSender()
        flushed = (await server.state())["flushes"]
        engine = SGLangEngine(
            "sg", ckpt, url=server.url, request_timeout_s=60, weight_load_format=load_format
        )
        await engine.start()
        before = (await engine.generate([request]))[0]
        spec = _group()
        flattened = load_format == "flattened_bucket"
        results = {}
        for version, state in states.items():
            buckets = sglang_buckets(state, 64 << 10)  # small buckets: several requests per update

            def send(state=state, buckets=buckets) -> None:
                if not sender.is_open:
                    sender.open(spec)
                for b in buckets:
                    sender.send_sglang_bucket(state, b, flattened=flattened)

            learner = asyncio.create_task(asyncio.to_thread(send))
            await engine.update_weights(version, WeightsFromBroadcast(group=spec, buckets=buckets), rank=1)
            await learner
            assert len(buckets) > 3
            results[version] = (await engine.generate([request]))[0]
            state = await server.state()
            assert engine.policy_version == version and state["weight_version"] == str(version)
            assert set(engine.last_update) == {"join", "receive", "flush"}
        flushes = (await server.state())["flushes"] - flushed
        await engine.close()
        await asyncio.to_thread(sender.close)
        return before, results, flushes

    before, results, flushes = run(scenario(), timeout=180)
    assert flushes == 2
    for version, state in states.items():
        path = tmp_path / f"v{version}"
        path.mkdir()
        save_file(state, str(path / "model.safetensors"))

        async def reference(path=path, version=version):
            hf = HFEngine("hf", ckpt)
            await hf.start()
            await hf.update_weights(version, WeightsFromDisk(path=str(path)))
            try:
                return (await hf.generate([request]))[0]
            finally:
                await hf.close()

        want = run(reference())
        got = results[version]
        assert got.policy_version == version
        assert got.response_ids == want.response_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        assert got.logprobs != pytest.approx(before.logprobs, abs=1e-3)  # the weights did change


def test_update_from_disk_and_bad_weight_updates(ckpt: Path, tmp_path: Path, server) -> None:
    from safetensors.torch import save_file

    save_file(_perturbed(ckpt, 3), str(tmp_path / "model.safetensors"))

    async def scenario():
        engine = SGLangEngine("sg", ckpt, url=server.url, request_timeout_s=30)
        await engine.start()
        await engine.update_weights(5, WeightsFromDisk(path=str(tmp_path)))
        assert engine.policy_version == 5 and (await server.state())["weight_version"] == "5"
        with pytest.raises(EngineError, match="update_weights_from_disk"):
            await engine.update_weights(6, WeightsFromDisk(path=str(tmp_path / "nowhere")))
        assert engine.policy_version == 5
        spec = _group(timeout_s=2)
        with pytest.raises(EngineError, match="init_weights_update_group"):  # no learner shows up
            plan = [SGLangBucket(names=["x"], dtypes=["float32"], shapes=[[1]])]
            await engine.update_weights(6, WeightsFromBroadcast(group=spec, buckets=plan), rank=1)
        with pytest.raises(EngineError, match="bucket"):  # spelled as a dtype, but not one torch has
            plan = [SGLangBucket(names=["x"], dtypes=["float99"], shapes=[[1]])]
            await engine.update_weights(6, WeightsFromBroadcast(group=spec, buckets=plan), rank=1)
        guirl = WeightGroupSpec(host="127.0.0.1", port=_port(), world_size=2, timeout_s=2)
        with pytest.raises(EngineError, match="layout"):
            await engine.update_weights(6, WeightsFromBroadcast(group=guirl), rank=1)
        assert engine.policy_version == 5
        await engine.close()

    run(scenario(), timeout=120)


def test_an_update_abandoned_half_way_serves_nothing_until_one_lands_whole(
    ckpt: Path, tmp_path: Path, server
) -> None:
    """Each bucket overwrites the server's live weights: an update abandoned after some of them (its sender
    died, a newer one superseded it) leaves weights that are no version's. The engine says so, the broker's
    slot takes no request (its samples would be labelled with a version they were not played by), and an
    update that lands whole (here from disk) makes it serve again."""
    from safetensors.torch import save_file

    from guirl.actors.routing import EngineSlot

    state = _perturbed(ckpt, 4)
    buckets = sglang_buckets(state, 64 << 10)
    spec = _group(timeout_s=30)
    sender = WeightSender()

    def send_two() -> None:
        sender.open(spec)
        for b in buckets[:2]:
            sender.send_sglang_bucket(state, b, flattened=True)

    async def scenario():
        engine = SGLangEngine("sg", ckpt, url=server.url, request_timeout_s=60)
        await engine.start()
        slot = EngineSlot(engine, healthy=True)
        assert engine.weights_intact and slot.free
        update = asyncio.create_task(
            engine.update_weights(7, WeightsFromBroadcast(group=spec, buckets=buckets), rank=1)
        )
        await asyncio.to_thread(send_two)  # two buckets landed; the engine waits for the third
        update.cancel()
        with pytest.raises(asyncio.CancelledError):
            await update
        await asyncio.to_thread(sender.close)
        assert len(buckets) > 3 and not engine.weights_intact and engine.policy_version == -1
        assert not slot.free
        save_file(state, str(tmp_path / "model.safetensors"))
        await engine.update_weights(8, WeightsFromDisk(path=str(tmp_path)))
        assert engine.weights_intact and engine.policy_version == 8 and slot.free
        await engine.close()

    run(scenario(), timeout=120)


def test_malformed_and_failed_replies_are_clear_errors(ckpt: Path, server) -> None:
    """Every broken reply ends in a clear error (or the request's own abort), never a hang."""
    request = screenshot_request("click", png(64, 64), GREEDY)

    async def scenario():
        engine = SGLangEngine("sg", ckpt, url=server.url, request_timeout_s=3)
        await engine.start()
        await server.faults(generate_raw=b"<html>not json")
        with pytest.raises(EngineError, match="not JSON") as e:
            await engine.generate([request])
        assert e.value.retryable
        miscounted = b'{"text": "x", "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 3}}'
        await server.faults(generate_raw=miscounted)
        with pytest.raises(EngineError, match="not the one guirl rendered") as e:
            await engine.generate([request])
        assert not e.value.retryable
        await server.faults(generate_raw=b'{"text": "x", "meta_info": {"finish_reason": {"type": "weird"}}}')
        with pytest.raises(EngineError, match="finish_reason"):
            await engine.generate([request])
        await server.faults(generate_raw=None, generate_status=503)
        with pytest.raises(EngineError, match="503") as e:
            await engine.generate([request])
        assert e.value.retryable
        await server.faults(generate_status=400)  # the request's fault: answered alone
        (aborted,) = await engine.generate([request])
        assert aborted.finish_reason == "abort" and "400" in aborted.error
        await server.faults(generate_status=None, hang=True)
        with pytest.raises(EngineError, match="no answer within 3 s"):
            await asyncio.wait_for(engine.generate([request]), 20)
        await server.faults(hang=False, healthy=False)
        assert not await engine.health()
        # a request that cannot be rendered is aborted alone, as by the hf engine
        bad = GenRequest(prompt_ids=[10**9], sampling=GREEDY)
        (res,) = await engine.generate([bad])
        assert res.finish_reason == "abort" and "token id" in res.error
        await engine.close()
        gone = SGLangEngine(
            "gone", ckpt, url=f"http://127.0.0.1:{_port()}", request_timeout_s=3, start_timeout_s=1
        )
        with pytest.raises(EngineError, match="not serving"):
            await gone.start()
        gone._renderer = engine._renderer  # started enough to send: the server is not there
        import aiohttp

        gone._session = aiohttp.ClientSession()
        gone._slots = asyncio.Semaphore(1)
        with pytest.raises(EngineDead):
            await gone.generate([request])
        await gone.close()

    run(scenario(), timeout=120)


def test_the_stand_in_refuses_what_sglang_refuses(ckpt: Path, server) -> None:
    """SGLang's own checks answer: the /generate contract (unknown sampling parameters, wrong types),
    image strings that are not images, already-expanded pad runs (an error inside SGLang's processor:
    500), a weight update outside a session, a flush while a request runs (without a timeout)."""
    import aiohttp

    from guirl.inference.chat import ChatRenderer

    renderer = ChatRenderer.load(ckpt)
    req = screenshot_request("click", png(64, 64), GREEDY)
    expanded = renderer.render(req.messages, req.images).input_ids
    image = "data:image/png;base64," + base64.b64encode(png(64, 64)).decode()
    jpeg = base64.b64encode(_jpeg(64, 64)).decode()
    assert jpeg.startswith("/9j/")

    async def scenario():
        # a connection per request: the server drops one it answered with a 500
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            cases = [
                {"input_ids": [1, 2], "sampling_params": {"temprature": 0.5}},
                {"input_ids": "hello"},
                {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "ten"}},
            ]
            for body in cases:
                async with s.post(f"{server.url}/generate", json=body) as r:
                    assert r.status == 400, body
                    assert error_message(await r.read())  # the contract's words, which the client reports
            async with s.post(f"{server.url}/generate", data=b"{not json") as r:
                assert 400 <= r.status < 500
            for body, status in [
                ({"input_ids": expanded, "image_data": [image]}, 500),  # pads expanded twice: IndexError
                ({"input_ids": [1, 2], "image_data": ["%%%"]}, 400),  # not base64
                ({"input_ids": [1, 2], "image_data": [jpeg]}, 500),  # base64 JPEG read as a file path
            ]:
                async with s.post(f"{server.url}/generate", json=body) as r:
                    assert r.status == status, (body["image_data"], r.status, await r.text())
            bucket = {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "none"}
            async with s.post(f"{server.url}/update_weights_from_distributed", json=bucket) as r:
                reply = await r.json()
                assert r.status == 400 and reply["success"] is False
                assert "between begin_weight_update() and end_weight_update()" in reply["message"]

    run(scenario(), timeout=120)


def test_launched_servers_killed_one_is_routed_around(ckpt: Path, tmp_path: Path) -> None:
    """Two servers launched by the engines (the stand-in's process, SGLang's launch flags, logs in the
    run's log directory); one is SIGKILLed mid-run: the health check marks it dead, every later request is
    served by the other, and closing stops the survivor's process."""
    inference = InferenceConfig(
        backend="sglang",
        engines=2,
        max_batch=2,
        max_wait_ms=0.0,
        health_interval_s=0.2,
        request_timeout_s=30,
        sglang=SGLangBackendConfig(server_command=STANDIN, start_timeout_s=300),
    )
    engines = make_engines(
        inference, ckpt=str(ckpt), screen=(0, 0), coordinates="relative", log_dir=str(tmp_path)
    )
    cfg = fast_config()

    def req(i: int) -> PolicyRequest:
        return PolicyRequest(
            episode_id=f"ep{i}",
            step=0,
            task_id="t",
            messages=[ChatMessage(role="user", parts=[TextPart(f"request {i}")])],
            sampling=SamplingParams(temperature=0.0, max_new_tokens=4),
        )

    async def scenario():
        broker = InferenceBroker(
            "broker",
            BrokerOptions(inference=inference),
            engines=engines,
            runtime=cfg.runtime,
            bind=["tcp://127.0.0.1:0"],
        )
        task = await broker.start()
        pids = [e.pid for e in engines]
        try:
            async with client_actor(cfg) as client:
                conn = client.connect("broker", broker.endpoints[0], PolicyChannel)
                first = await asyncio.gather(*(conn.request(req(i)) for i in range(4)))
                assert {r.engine for r in first} == {"sglang0", "sglang1"}
                os.killpg(pids[0], signal.SIGKILL)
                later = await asyncio.gather(*(conn.request(req(i)) for i in range(4, 12)))
                assert all(r.engine == "sglang1" and r.response_ids is not None for r in later)
                while broker.counters["engines.marked_dead"] < 1:  # the health loop runs every 0.2 s
                    await asyncio.sleep(0.05)
        finally:
            broker.request_shutdown("test done")
            await asyncio.wait_for(task, 30)
        return pids

    pids = run(scenario(), timeout=240)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    log = (tmp_path / "sglang1.log").read_text()
    assert "--model-path" not in log and "sglang stand-in serving" in log


def test_a_server_that_dies_while_starting_fails_with_its_log(ckpt: Path, tmp_path: Path) -> None:
    launch = LaunchSpec(
        model_path=str(tmp_path / "no-such-model"),
        command=STANDIN,
        log_path=str(tmp_path / "sg.log"),
        start_timeout_s=240,
    )
    engine = SGLangEngine("sg", ckpt, launch=launch)

    async def scenario():
        try:
            with pytest.raises(EngineError, match="exited with code") as e:
                await engine.start()
            assert "sg.log" in str(e.value) and not e.value.retryable
        finally:
            await engine.close()

    run(scenario(), timeout=120)


def _jpeg(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.open(io.BytesIO(png(width, height))).convert("RGB").save(buf, "JPEG")
    return buf.getvalue()


def _port() -> int:
    from guirl.net import free_port

    return free_port()


def _group(timeout_s: float = 30) -> WeightGroupSpec:
    """A weight group of the learner and one engine, named as the learner names each group (uniquely)."""
    return WeightGroupSpec(
        host="127.0.0.1",
        port=_port(),
        world_size=2,
        group_name=unique_group_name(),
        layout="sglang",
        timeout_s=timeout_s,
    )
