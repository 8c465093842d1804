"""guirl's `sglang` engine against SGLang's own HTTP server process (the stand-in: SGLang's FastAPI app,
TokenizerManager with Qwen3-VL's multimodal processing, its scheduler-side weight-update manager and flush
handling; only the model runs on guirl's hf engine). Each of the mismatches found against SGLang 0.5.23 has a
test here that the client before the fixes fails:

1. `input_ids` with expanded pad runs: SGLang's processor raises inside `build_input_ids` (HTTP 500);
2. a distributed update outside `begin_weight_update` / `end_weight_update`: refused;
3. a weight group name SGLang still holds after a failed update: refused;
4. a reply without `output_token_logprobs` when none were asked: must be accepted;
5. `sampling_seed` honoured only with `--enable-deterministic-inference`, which guirl must launch with;
6. base64 JPEG (`/9j/...`) read as a file path: images must go as `data:` URLs;
7. `/flush_cache` refused while a request runs: the client must ask SGLang to wait (`?timeout=`).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import asyncio
import io
import sys
from pathlib import Path

import msgspec
import pytest

from guirl.inference.base import EngineError, GenRequest
from guirl.inference.sglang import LaunchSpec, SGLangEngine
from guirl.messages.types import ChatMessage, ImagePart, SamplingParams, TextPart
from guirl.messages.weights import WeightsFromBroadcast
from guirl.net import free_port
from guirl.weights.broadcast import WeightGroupSpec, WeightSender, sglang_buckets, unique_group_name
from tests.helpers import run, shared_tiny
from tests.integration.test_hf_engine import png

STANDIN = [sys.executable, "-m", "guirl.testing.fakes", "sglang"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def url(ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server launched as guirl launches one (`inference.sglang.deterministic`: its flag goes through
    SGLang's own launch parser), kept for the module; each test attaches its own engine by URL."""
    log = tmp_path_factory.mktemp("logs") / "sglang.log"
    launch = LaunchSpec(
        model_path=str(ckpt),
        command=STANDIN,
        deterministic=True,
        extra_args=["--standin-group-timeout", "10"],
        log_path=str(log),
        start_timeout_s=300,
    )
    engine = SGLangEngine("launcher", ckpt, launch=launch)
    run(engine.start(), timeout=320)
    try:
        yield engine.url
    finally:
        run(engine.close())


def _engine(ckpt: Path, url: str, **kw) -> SGLangEngine:
    return SGLangEngine("sg", ckpt, url=url, request_timeout_s=60, **kw)


def _request(*images: bytes, sampling: SamplingParams = GREEDY, logprobs: bool = True) -> GenRequest:
    parts = [*(ImagePart(i) for i in range(len(images))), TextPart("Click the OK button.")]
    return GenRequest(
        messages=[
            ChatMessage(role="system", parts=[TextPart("You are a GUI agent.")]),
            ChatMessage(role="user", parts=parts),
        ],
        images=list(images),
        sampling=sampling,
        return_logprobs=logprobs,
    )


def _jpeg(width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.open(io.BytesIO(png(width, height))).convert("RGB").save(buf, "JPEG")
    return buf.getvalue()


async def _served(engine: SGLangEngine, req: GenRequest):
    await engine.start()
    try:
        (result,) = await engine.generate([req])
    finally:
        await engine.close()
    return result


def test_1_screenshots_are_expanded_by_sglang_as_guirl_expands_them(ckpt: Path, url: str) -> None:
    """One and two screenshots (a 1280x800 desktop; two of other sizes), sent as guirl's engine sends them
    (one pad per image): the ids SGLang's processor expands them to, which it echoes, equal guirl's
    expanded ids, which the learner trains on; the engine's round trip accepts them."""
    import json
    import urllib.request

    from guirl.actors.demo import synthetic_screen
    from guirl.inference.sglang_api import generate_body, load_renderer, render_request, wire_ids

    renderer = load_renderer(ckpt)
    desktop = synthetic_screen(1280, 800, 3)  # a desktop-like screenshot, resized by the image processor
    for req in (_request(desktop), _request(png(640, 400, seed=2), png(96, 64, seed=5))):
        expanded, images = render_request(renderer, req)
        sent = wire_ids(expanded, renderer.image_token_id)
        assert (
            sent.count(renderer.image_token_id) == len(req.images) < expanded.count(renderer.image_token_id)
        )
        body = json.dumps(generate_body(req, sent, images, rid=f"t1-{len(images)}")).encode()
        http = urllib.request.Request(
            f"{url}/generate", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(http, timeout=60) as resp:  # noqa: S310 - the stand-in on loopback
            reply = json.loads(resp.read())
        assert reply["prompt_token_ids"] == expanded  # SGLang's expansion, echoed
        assert reply["meta_info"]["prompt_tokens"] == len(expanded)
        result = run(_served(_engine(ckpt, url), req))
        assert result.finish_reason != "abort", result.error
        assert result.prompt_ids == expanded


def test_guirl_launches_sglang_without_its_vision_embedding_cache(url: str) -> None:
    """SGLang 0.5.23 keeps vision-tower outputs per image hash across weight updates (its cache is never
    cleared, not even by /flush_cache), while guirl trains the vision tower: the server guirl launched reads
    a cache size of 0 from its environment, as SGLang's own settings parse it."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/_standin/state", timeout=30) as resp:  # noqa: S310 - loopback
        assert json.loads(resp.read())["vlm_cache_mb"] == 0


def test_4_a_judge_request_asks_no_logprobs_and_its_reply_is_accepted(ckpt: Path, url: str) -> None:
    result = run(_served(_engine(ckpt, url), _request(png(160, 120), logprobs=False)))
    assert result.finish_reason in ("stop", "length") and result.response_ids and result.logprobs is None


def test_5_seeds_are_honoured_by_a_server_launched_deterministic(ckpt: Path, url: str) -> None:
    sampled = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12)

    async def scenario():
        engine = _engine(ckpt, url)
        await engine.start()
        try:
            assert engine.deterministic  # /server_info: the launch flag SGLang's parser accepted
            one = [
                (
                    await engine.generate(
                        [_request(png(64, 64), sampling=msgspec.structs.replace(sampled, seed=s))]
                    )
                )[0]
                for s in (11, 11, 12)
            ]
        finally:
            await engine.close()
        return one

    a, b, c = run(scenario())
    assert a.response_ids == b.response_ids and a.response_ids != c.response_ids


def test_5_no_seed_goes_to_a_server_that_would_ignore_it(ckpt: Path) -> None:
    """A server without the flag samples unseeded whatever a request says: guirl says so (no
    `sampling_seed` on the wire) rather than send a seed that does nothing."""
    from guirl.inference.sglang_api import generate_body

    req = _request(sampling=SamplingParams(temperature=1.0, max_new_tokens=4, seed=3))
    assert "sampling_seed" not in generate_body(req, [1, 2], [], rid="r", seeded=False)["sampling_params"]
    assert generate_body(req, [1, 2], [], rid="r", seeded=True)["sampling_params"]["sampling_seed"] == 3
    argv = LaunchSpec(model_path="m", deterministic=True).argv(30000)
    assert "--enable-deterministic-inference" in argv
    assert "--enable-deterministic-inference" not in LaunchSpec(model_path="m").argv(30000)


def test_6_a_jpeg_screenshot_is_loaded_by_sglang(ckpt: Path, url: str) -> None:
    image = _jpeg(200, 120)
    result = run(_served(_engine(ckpt, url), _request(image)))
    assert result.finish_reason != "abort", result.error


def _state(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _broadcast(
    engine: SGLangEngine, spec: WeightGroupSpec, state: dict, version: int, *, die_after: int = -1
):
    """The learner's side (rank 0) on a thread, the engine's update on the loop; `die_after`: the learner
    sends that many buckets, then leaves (a learner killed mid-broadcast)."""
    buckets = sglang_buckets(state, 64 << 10)
    sender = WeightSender()

    def learner() -> None:
        sender.open(spec)
        for i, b in enumerate(buckets):
            if i == die_after:
                sender.close()
                return
            sender.send_sglang_bucket(state, b, flattened=True)

    async def both():
        sending = asyncio.create_task(asyncio.to_thread(learner))
        try:
            await engine.update_weights(version, WeightsFromBroadcast(group=spec, buckets=buckets), rank=1)
        finally:
            await asyncio.gather(sending, return_exceptions=True)
            await asyncio.to_thread(sender.close)

    return both()


def _group(name: str | None = None) -> WeightGroupSpec:
    return WeightGroupSpec(
        host="127.0.0.1",
        port=free_port(),
        world_size=2,
        group_name=name or unique_group_name(),
        layout="sglang",
        timeout_s=30,
    )


def test_2_a_broadcast_update_runs_inside_a_weight_update_session(ckpt: Path, url: str) -> None:
    """SGLang refuses `update_weights_from_distributed` outside a session; guirl opens one around the
    buckets and ends it (also one a killed broker left open)."""
    import aiohttp

    state = _state(ckpt)

    async def scenario():
        engine = _engine(ckpt, url)
        await engine.start()
        try:
            await _broadcast(engine, _group(), state, 1)
            assert engine.policy_version == 1
            async with aiohttp.ClientSession() as s:  # a broker killed mid-update left its session open
                async with s.post(f"{url}/begin_weight_update", json={}) as r:
                    assert r.status == 200
            await _broadcast(engine, _group(), state, 2)
            assert engine.policy_version == 2
            async with aiohttp.ClientSession() as s:  # and no session is left open now
                async with s.post(f"{url}/end_weight_update", json={}) as r:
                    assert (
                        r.status == 400 and "no weight-update session is open" in (await r.json())["message"]
                    )
            (after,) = await engine.generate([_request(png(64, 64))])
            assert after.policy_version == 2 and after.finish_reason != "abort"
        finally:
            await engine.close()

    run(scenario(), timeout=240)


def test_3_after_a_failed_broadcast_the_next_group_is_accepted(ckpt: Path, url: str) -> None:
    """The learner dies after the first bucket: the update fails; the next version forms a group again —
    even under the same name (an older learner's constant one), which SGLang refuses while it still holds
    it: guirl's engine destroys the group it was in when an update fails."""
    state = _state(ckpt)

    async def scenario():
        engine = _engine(ckpt, url)
        await engine.start()
        try:
            with pytest.raises(EngineError):
                await _broadcast(engine, _group("guirl-weights"), state, 1, die_after=1)
            await _broadcast(engine, _group("guirl-weights"), state, 2)
            assert engine.policy_version == 2
            await _broadcast(engine, _group(), state, 3)  # and a new unique name, as the learner names them
            assert engine.policy_version == 3
        finally:
            await engine.close()

    run(scenario(), timeout=240)


def test_7_a_flush_waits_for_the_request_still_running(ckpt: Path, url: str) -> None:
    """SGLang refuses a flush while any request runs (a health probe, say); guirl's flush asks it to wait
    for idle: held while a request is in flight, done once it ends."""
    import aiohttp

    async def scenario():
        engine = _engine(ckpt, url)
        await engine.start()
        async with aiohttp.ClientSession() as s:

            async def standin(path: str, body: dict | None = None) -> dict:
                call = s.get(f"{url}{path}") if body is None else s.post(f"{url}{path}", json=body)
                async with call as r:
                    return await r.json()

            try:
                await standin("/_standin/faults", {"hang": True})
                running = asyncio.create_task(engine.generate([_request(png(64, 64))]))
                while (await standin("/_standin/state"))["inflight"] != 1:
                    await asyncio.sleep(0.02)  # polled until the server holds the request
                async with s.post(f"{url}/flush_cache") as r:  # what SGLang says to a plain flush now
                    assert r.status == 400
                flushing = asyncio.create_task(engine.flush_cache())
                while not (await standin("/_standin/state"))["flush_pending"]:
                    assert not flushing.done(), flushing
                    await asyncio.sleep(0.02)  # polled until SGLang holds the flush back
                assert not flushing.done()
                await standin("/_standin/faults", {"hang": False})
                await asyncio.wait_for(flushing, 60)
                (done,) = await running
                assert done.finish_reason != "abort"
            finally:
                await standin("/_standin/faults", {"hang": False})
                await engine.close()

    run(scenario(), timeout=180)
