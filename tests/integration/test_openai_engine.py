"""The openai engine against `FakeOpenAIServer`: the wire format, concurrency, and every error path."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from PIL import Image

from guirl.inference.base import Engine, EngineDead, EngineError, GenRequest
from guirl.inference.openai import MAX_RESPONSE_BYTES, OpenAIEngine
from guirl.messages.types import ChatMessage, ImagePart, SamplingParams, TextPart
from guirl.messages.weights import WeightsFromDisk
from guirl.testing.fakes import FakeOpenAIServer
from tests.helpers import run

JPEG_HEAD = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"  # the fake checks magic bytes only


def _png(width: int = 6, height: int = 4) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


def _ask(text: str, **sampling: Any) -> GenRequest:
    return GenRequest(
        messages=[ChatMessage(role="user", parts=[TextPart(text)])], sampling=SamplingParams(**sampling)
    )


@contextlib.asynccontextmanager
async def _engine(srv: FakeOpenAIServer, **kwargs: Any) -> AsyncIterator[OpenAIEngine]:
    kwargs.setdefault("timeout_s", 5.0)
    engine = OpenAIEngine("oa0", base_url=srv.base_url, model="test-model", **kwargs)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def test_text_and_image_round_trip():
    png = _png()
    request = GenRequest(
        messages=[
            ChatMessage(role="system", parts=[TextPart("You operate a desktop.")]),
            ChatMessage(role="user", parts=[TextPart("What is on screen?"), ImagePart(0), ImagePart(1)]),
            ChatMessage(role="assistant", parts=[TextPart("A window.")]),
        ],
        images=[png, JPEG_HEAD],
        sampling=SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=64, stop=["</s>"], seed=7),
    )

    async def main():
        async with FakeOpenAIServer(lambda req: "click(1, 2)") as srv, _engine(srv) as engine:
            assert isinstance(engine, Engine) and engine.supports_tokens is False
            [result] = await engine.generate([request])
            [plain] = await engine.generate([_ask("hi")])
            return srv.requests, result, plain

    received, result, plain = run(main())
    assert result.text == "click(1, 2)" and result.finish_reason == "stop"
    assert result.prompt_ids is None and result.response_ids is None and result.logprobs is None
    assert result.engine == "oa0" and result.policy_version == -1 and result.latency_s > 0
    sent = received[0]
    assert sent.images == [png, JPEG_HEAD] and sent.image_mimes == ["image/png", "image/jpeg"]
    assert sent.image_sizes == [len(png), len(JPEG_HEAD)]
    body = sent.body
    assert body["model"] == "test-model"
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant"]
    assert [p["type"] for p in body["messages"][1]["content"]] == ["text", "image_url", "image_url"]
    assert body["messages"][1]["content"][0] == {"type": "text", "text": "What is on screen?"}
    sampling = {k: body[k] for k in ("temperature", "top_p", "max_tokens", "stop", "seed")}
    assert sampling == {"temperature": 0.5, "top_p": 0.9, "max_tokens": 64, "stop": ["</s>"], "seed": 7}
    assert "Authorization" not in sent.headers
    # no stop sequences and no seed: the keys are left out, not sent empty
    assert "stop" not in received[1].body and "seed" not in received[1].body and plain.text == "click(1, 2)"


def test_concurrent_batch_answered_in_order():
    async def main():
        arrived = asyncio.Barrier(8)  # answers only once all 8 are in flight: a serial client never gets one

        async def responder(req: dict) -> str:
            await arrived.wait()
            return "answer to " + req["messages"][0]["content"][0]["text"]

        async with FakeOpenAIServer(responder) as srv, _engine(srv, max_concurrency=8) as engine:
            results = await engine.generate([_ask(f"q{i}") for i in range(8)])
            return results, srv.max_inflight

    results, max_inflight = run(main(), timeout=10)
    assert [r.text for r in results] == [f"answer to q{i}" for i in range(8)]
    assert max_inflight == 8


def test_concurrency_is_bounded():
    async def main():
        pairs = asyncio.Barrier(2)  # requests are held until two are in flight

        async def responder(req: dict) -> str:
            await pairs.wait()
            return "ok"

        async with FakeOpenAIServer(responder) as srv, _engine(srv, max_concurrency=2) as engine:
            results = await engine.generate([_ask(f"q{i}") for i in range(6)])
            return results, srv.max_inflight

    results, max_inflight = run(main(), timeout=10)
    assert len(results) == 6 and max_inflight == 2


def test_auth():
    async def main():
        async with FakeOpenAIServer(api_key="sk-test") as srv:
            async with _engine(srv, api_key="sk-test") as engine:
                [result] = await engine.generate([_ask("hi")])
                healthy = await engine.health()
            async with _engine(srv, api_key="sk-wrong") as wrong:
                with pytest.raises(EngineError) as refused:
                    await wrong.generate([_ask("hi")])
                wrong_healthy = await wrong.health()
            return srv.requests[0].headers, result, healthy, refused.value, wrong_healthy

    headers, result, healthy, refused, wrong_healthy = run(main())
    assert headers["Authorization"] == "Bearer sk-test" and result.text == "ok" and healthy
    assert not refused.retryable and "401" in str(refused) and "Incorrect API key" in str(refused)
    assert "sk-wrong" not in str(refused) and not wrong_healthy


def test_server_error_is_retryable_and_passes():
    async def main():
        async with FakeOpenAIServer() as srv, _engine(srv) as engine:
            srv.fail_next(1, status=500)
            with pytest.raises(EngineError) as failed:
                await engine.generate([_ask("hi")])
            srv.fail_next(1, status=429)  # rate limited: later, or elsewhere, it may pass
            with pytest.raises(EngineError) as limited:
                await engine.generate([_ask("hi")])
            [result] = await engine.generate([_ask("hi")])
            return failed.value, limited.value, result

    failed, limited, result = run(main())
    assert failed.retryable and not isinstance(failed, EngineDead) and "500" in str(failed)
    assert limited.retryable and "429" in str(limited)
    assert result.text == "ok"


def test_bad_request_is_not_retryable_and_carries_the_message():
    long_reason = "This model's maximum context length is 32768 tokens. " + "x" * 1000

    async def main():
        async with FakeOpenAIServer(lambda req: {"status": 400, "error": long_reason}) as srv:
            async with _engine(srv) as engine:
                with pytest.raises(EngineError) as refused:
                    await engine.generate([_ask("hi")])
                return refused.value

    refused = run(main())
    assert not refused.retryable and "400" in str(refused)
    assert "maximum context length is 32768 tokens" in str(refused) and len(str(refused)) < 400


def test_request_the_server_rejects():
    """A request the engine lets through but the server refuses (a bad image index is caught first)."""

    async def main():
        async with FakeOpenAIServer() as srv, _engine(srv) as engine:
            not_an_image = GenRequest(
                messages=[ChatMessage(role="user", parts=[ImagePart(0)])], images=[b"not an image"]
            )
            with pytest.raises(EngineError) as unsupported:
                await engine.generate([not_an_image])
            with pytest.raises(EngineError) as out_of_range:
                await engine.generate([GenRequest(messages=[ChatMessage(role="user", parts=[ImagePart(1)])])])
            return unsupported.value, out_of_range.value, len(srv.requests)

    unsupported, out_of_range, n_received = run(main())
    assert not unsupported.retryable and "unsupported image" in str(unsupported)
    assert not out_of_range.retryable and "image 1 of 0" in str(out_of_range)
    assert n_received == 1  # the out-of-range index never left the client


def test_malformed_replies_are_retryable():
    async def main():
        replies: list[dict] = [
            {"raw": {"id": "x", "choices": []}},
            {"raw": [1, 2]},
            {"raw": {"choices": [{}]}},
        ]
        async with FakeOpenAIServer(lambda req: replies.pop(0)) as srv, _engine(srv) as engine:
            errors = []
            for _ in range(3):
                with pytest.raises(EngineError) as bad:
                    await engine.generate([_ask("hi")])
                errors.append(bad.value)
            srv.garbage = True
            with pytest.raises(EngineError) as garbage:
                await engine.generate([_ask("hi")])
            return errors, garbage.value

    errors, garbage = run(main())
    assert all(e.retryable for e in [*errors, garbage])
    assert [str(e).rsplit(": ", 1)[1] for e in errors] == [
        "no choices",
        "a JSON list, not an object",
        "choices[0] has no message",
    ]
    assert "not JSON" in str(garbage) and "502 Bad Gateway" in str(garbage)


def test_timeout_is_retryable():
    async def main():
        async with FakeOpenAIServer() as srv, _engine(srv, timeout_s=0.3) as engine:
            srv.delay_s = 0.01  # a little late is fine
            [result] = await engine.generate([_ask("hi")])
            srv.hang = True
            with pytest.raises(EngineError) as timed_out:
                await engine.generate([_ask("hi")])
            return result, timed_out.value, await engine.health()

    result, timed_out, healthy = run(main(), timeout=10)
    assert result.text == "ok"
    assert timed_out.retryable and "no answer within 0.3 s" in str(timed_out)
    assert not healthy


def test_connection_refused_is_dead():
    async def main():
        srv = await FakeOpenAIServer().start()
        async with _engine(srv) as engine:
            assert await engine.health()
            await srv.close()  # nothing listens on the port now
            with pytest.raises(EngineError) as refused:
                await engine.generate([_ask("hi")])
            return refused.value, await engine.health()

    refused, healthy = run(main())
    assert isinstance(refused, EngineDead) and refused.retryable and not healthy


def test_not_started_or_closed_is_dead():
    async def main():
        async with FakeOpenAIServer() as srv:
            engine = OpenAIEngine("oa0", base_url=srv.base_url, model="m")
            with pytest.raises(EngineDead):
                await engine.generate([_ask("hi")])
            healthy = await engine.health()
            return healthy, len(srv.requests)

    assert run(main()) == (False, 0)


def test_prompt_ids_and_weight_updates_refused():
    async def main():
        async with FakeOpenAIServer() as srv, _engine(srv) as engine:
            with pytest.raises(EngineError) as tokens:
                await engine.generate([_ask("hi"), GenRequest(prompt_ids=[1, 2, 3])])
            with pytest.raises(EngineError) as weights:
                await engine.update_weights(3, WeightsFromDisk(path="/ckpt"))
            return tokens.value, weights.value, len(srv.requests)

    tokens, weights, n_received = run(main())
    assert not tokens.retryable and "not token ids" in str(tokens)
    assert not weights.retryable and "serves its own weights" in str(weights)
    assert n_received == 0  # the batch is refused whole, before anything is sent


def test_content_as_a_list_of_parts():
    parts = [
        {"type": "text", "text": "click"},
        {"type": "refusal", "refusal": "-"},
        {"type": "text", "text": "(1)"},
    ]

    async def main():
        async with FakeOpenAIServer(lambda req: {"content": parts}) as srv, _engine(srv) as engine:
            return await engine.generate([_ask("hi")])

    assert run(main())[0].text == "click(1)"


@pytest.mark.parametrize(
    ("server_says", "engine_says"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "abort"),
        ("tool_calls", "stop"),
        (None, "stop"),
    ],
)
def test_finish_reason_mapping(server_says, engine_says):
    async def main():
        reply = {"content": "x", "finish_reason": server_says}
        async with FakeOpenAIServer(lambda req: reply) as srv, _engine(srv) as engine:
            return await engine.generate([_ask("hi")])

    assert run(main())[0].finish_reason == engine_says


def test_huge_replies_are_capped():
    async def main():
        huge = "x" * (MAX_RESPONSE_BYTES + 1)
        async with FakeOpenAIServer(lambda req: huge) as srv, _engine(srv) as engine:
            with pytest.raises(EngineError) as declared:  # Content-Length says it: refused unread
                await engine.generate([_ask("hi")])
            srv.endless = True  # chunked, no length, never ends: refused at the cap
            with pytest.raises(EngineError) as endless:
                await engine.generate([_ask("hi")])
            return declared.value, endless.value

    declared, endless = run(main(), timeout=10)
    assert declared.retryable and "byte limit" in str(declared)
    assert endless.retryable and f"over the {MAX_RESPONSE_BYTES}-byte limit" in str(endless)


def test_fake_server_validates_like_a_real_server():
    good_image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}

    def user(*parts: dict) -> list[dict]:
        return [{"role": "user", "content": list(parts)}]

    cases = [
        ({"model": "m"}, "'messages' is a required property"),
        ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "Invalid value: 'robot'"),
        (
            {"model": "m", "messages": user({"type": "image_url", "image_url": {"url": "http://x/a.png"}})},
            "only base64 data URLs",
        ),
        (
            {
                "model": "m",
                "messages": user({"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}),
            },
            "Invalid base64 image",
        ),
        ({"model": "m", "messages": user(good_image), "temperature": 7}, "Invalid 'temperature'"),
    ]

    async def main():
        answers = []
        async with FakeOpenAIServer() as srv, aiohttp.ClientSession() as http:
            for body, _ in cases:
                async with http.post(srv.base_url + "/chat/completions", json=body) as resp:
                    answers.append((resp.status, await resp.json()))
            async with http.post(srv.base_url + "/chat/completions", data=b"{not json") as resp:
                answers.append((resp.status, await resp.json()))
            async with http.post(
                srv.base_url + "/chat/completions", json={"model": "m", "messages": user(good_image)}
            ) as resp:
                ok = await resp.json()
            async with http.get(srv.base_url + "/models") as resp:
                models = await resp.json()
        return answers, ok, models, srv.requests

    answers, ok, models, received = run(main())
    for (status, body), (_, expected) in zip(answers, cases):
        assert status == 400 and set(body["error"]) >= {"message", "type", "code"}
        assert expected in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    assert answers[-1][0] == 400 and "could not parse the JSON body" in answers[-1][1]["error"]["message"]
    assert ok["object"] == "chat.completion" and ok["choices"][0]["message"] == {
        "role": "assistant",
        "content": "ok",
    }
    assert ok["choices"][0]["finish_reason"] == "stop" and set(ok["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    }
    assert models["data"][0]["id"] == "fake-model"
    assert received[-2].body is None and received[-1].image_sizes == [8]  # every request is recorded


def test_tool_schemas_for_the_template_refused():
    """GUI-RL's prompt style has the checkpoint's own template write the tools block; an OpenAI-compatible
    server rebuilds `tools=` from its own schema model: such a prompt is refused before anything is sent."""

    async def main():
        async with FakeOpenAIServer() as srv, _engine(srv) as engine:
            system = ChatMessage(role="system", parts=[TextPart("sys")], tools=['{"type": "function"}'])
            with pytest.raises(EngineError) as refused:
                await engine.generate([_ask("hi"), GenRequest(messages=[system])])
            return refused.value, len(srv.requests)

    refused, n_received = run(main())
    assert not refused.retryable and "hf or sglang backend" in str(refused)
    assert n_received == 0
