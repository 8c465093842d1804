"""The `hf` engine on the tiny Qwen3-VL: exact tokens and log-probs, batching that does not change results,
per-request limits and stop strings, token-in prompts, bad requests answered alone, weight updates."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

import asyncio
import io
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from guirl.inference.base import Engine, EngineDead, EngineError, GenRequest, GenResult
from guirl.inference.chat import ChatRenderer
from guirl.inference.hf import HFEngine
from guirl.messages.types import ChatMessage, ImagePart, SamplingParams, TextPart
from guirl.messages.weights import SGLangBucket, WeightGroupSpec, WeightsFromBroadcast, WeightsFromDisk
from tests.helpers import run, shared_tiny

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def renderer(ckpt: Path) -> ChatRenderer:
    return ChatRenderer.load(ckpt)


def png(width: int, height: int, seed: int = 0) -> bytes:
    img = Image.new("RGB", (width, height), (30 * seed % 256, 120, 200))
    draw = ImageDraw.Draw(img)
    draw.rectangle([width // 4, height // 3, width // 2 + seed, height // 2], fill=(250, 250, 250))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def screenshot_request(
    text: str, image: bytes, sampling: SamplingParams = GREEDY, rid: str = ""
) -> GenRequest:
    messages = [
        ChatMessage(role="system", parts=[TextPart("You are a GUI agent.")]),
        ChatMessage(role="user", parts=[ImagePart(0), TextPart(text)]),
    ]
    return GenRequest(messages=messages, images=[image], sampling=sampling, request_id=rid)


def serve(ckpt: Path, *batches: list[GenRequest], max_batch: int = 8) -> list[list[GenResult]]:
    """Start an engine, run each batch in turn, close it (one event loop per test)."""

    async def scenario() -> list[list[GenResult]]:
        engine = HFEngine("hf-test", ckpt, max_batch=max_batch)
        assert isinstance(engine, Engine)
        await engine.start()
        try:
            assert await engine.health()
            return [await engine.generate(b) for b in batches]
        finally:
            await engine.close()
            assert not await engine.health()

    return run(scenario())


def check_tokens(result: GenResult, renderer: ChatRenderer) -> None:
    assert result.response_ids is not None and result.logprobs is not None and result.prompt_ids is not None
    assert len(result.logprobs) == len(result.response_ids)
    assert all(lp <= 0.0 for lp in result.logprobs)
    body = result.response_ids[:-1] if result.finish_reason == "stop" else result.response_ids
    if result.finish_reason == "length":
        assert result.text == renderer.tokenizer.decode(body, skip_special_tokens=False)


def test_single_request_with_image(ckpt: Path, renderer: ChatRenderer) -> None:
    small = screenshot_request("Click the OK button.", png(64, 48))
    screen = screenshot_request("Open the menu.", png(1280, 800, 1), rid="screen")
    [[a], [b]] = serve(ckpt, [small], [screen])
    for req, res in [(small, a), (screen, b)]:
        assert res.prompt_ids == renderer.render(req.messages, req.images).input_ids
        # a random model may stop by chance; if it does not, it runs to the limit exactly
        assert res.finish_reason == "stop" or len(res.response_ids or []) == GREEDY.max_new_tokens
        assert res.engine == "hf-test" and res.policy_version == -1 and res.latency_s > 0
        check_tokens(res, renderer)
    # the 1280x800 screenshot is resized (smart_resize) under the 512*512 pixel bound: 640x384, 40x24 patches
    image_tokens = (b.prompt_ids or []).count(renderer.image_token_id)
    assert image_tokens == 40 * 24 // 4 == renderer.image_tokens(png(1280, 800, 1))


def test_batching_does_not_change_greedy_results(ckpt: Path, renderer: ChatRenderer) -> None:
    two_images = GenRequest(
        messages=[
            ChatMessage(
                role="user", parts=[TextPart("Before: "), ImagePart(1), TextPart(" after: "), ImagePart(0)]
            )
        ],
        images=[png(96, 64, 2), png(200, 120, 3)],
        sampling=GREEDY,
    )
    text_only = GenRequest(
        messages=[ChatMessage(role="user", parts=[TextPart("no image " * 9)])], sampling=GREEDY
    )
    batch = [
        screenshot_request("Click OK.", png(64, 48)),
        two_images,
        text_only,
        screenshot_request("A longer instruction that pads the others. " * 3, png(320, 180, 4)),
    ]
    [batched, *singles] = serve(ckpt, batch, *[[r] for r in batch])
    lengths = {len(r.prompt_ids or []) for r in batched}
    assert len(lengths) == 4  # really different prompt lengths, so left padding is exercised
    for together, [alone] in zip(batched, singles):
        assert together.prompt_ids == alone.prompt_ids
        assert together.response_ids == alone.response_ids
        assert together.text == alone.text and together.finish_reason == alone.finish_reason
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        check_tokens(together, renderer)
    # images are taken in prompt order, not request order
    rendered = renderer.render(two_images.messages, two_images.images)
    assert rendered.image_grid_thw is not None and rendered.image_grid_thw[0].tolist() == [1, 8, 12]


def test_logprobs_match_a_forward_pass(ckpt: Path) -> None:
    """Behaviour log-probs are those the learner recomputes: log_softmax(logits / T) of the chosen tokens."""
    from transformers import Qwen3VLForConditionalGeneration

    hot = SamplingParams(temperature=0.7, max_new_tokens=10, seed=5)
    requests = [screenshot_request("Scroll down.", png(80, 80, 5), sampling=s) for s in (GREEDY, hot)]
    [results] = serve(ckpt, requests)
    renderer = ChatRenderer.load(ckpt)
    model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, local_files_only=True).eval()
    for req, res, temperature in zip(requests, results, (1.0, 0.7)):
        prompt = renderer.render(req.messages, req.images)
        ids = torch.tensor([prompt.input_ids + (res.response_ids or [])])
        types = torch.tensor([prompt.mm_token_type_ids + [0] * len(res.response_ids or [])])
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                mm_token_type_ids=types,
                pixel_values=prompt.pixel_values,
                image_grid_thw=prompt.image_grid_thw,
            ).logits[0]
        n = len(prompt.input_ids)
        steps = torch.log_softmax(logits[n - 1 : -1] / temperature, dim=-1)
        expected = steps.gather(1, ids[0, n:, None]).squeeze(1).tolist()
        assert res.logprobs == pytest.approx(expected, abs=1e-4)


def test_sampling_settings_split_and_seed_repeats(ckpt: Path) -> None:
    hot = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    image = png(64, 64, 6)
    mixed = [
        screenshot_request("a", image),
        screenshot_request("b", image, sampling=hot),
        screenshot_request("c", image),
    ]
    together, again, [alone] = serve(ckpt, mixed, mixed, [mixed[1]])
    assert together[1].response_ids == again[1].response_ids == alone.response_ids  # same seed, same draw
    assert [r.response_ids for r in together] == [r.response_ids for r in again]


def test_differently_seeded_requests_share_a_generate_call(ckpt: Path) -> None:
    """Env workers seed every step differently: that must not split a batch into one call per request."""
    image = png(64, 64, 3)
    seeded = [
        screenshot_request(f"r{i}", image, sampling=SamplingParams(temperature=1.0, max_new_tokens=6, seed=i))
        for i in range(4)
    ]

    async def go() -> tuple[int, list, list]:
        engine = HFEngine("hf-test", ckpt, max_batch=8)
        await engine.start()
        try:
            first = await engine.generate(seeded)
            calls = engine.generate_calls
            second = await engine.generate(seeded)
            return calls, first, second
        finally:
            await engine.close()

    calls, first, second = run(go())
    assert calls == 1
    assert [r.response_ids for r in first] == [r.response_ids for r in second]  # same batch, same draws


def test_max_new_tokens_and_stop_strings(ckpt: Path, renderer: ChatRenderer) -> None:
    image = png(120, 90, 7)
    long = screenshot_request("Type hello.", image, sampling=SamplingParams(temperature=0, max_new_tokens=24))
    [[reference]] = serve(ckpt, [long])
    text = reference.text
    # a stop string made of two ASCII characters the model wrote after its first few characters
    start = next(
        i for i in range(4, len(text) - 1) if text[i : i + 2].isascii() and text[i : i + 2].isprintable()
    )
    stop = text[start : start + 2]
    cut = text.find(stop)
    short = screenshot_request("Type hello.", image, sampling=SamplingParams(temperature=0, max_new_tokens=3))
    stopped = screenshot_request(
        "Type hello.", image, sampling=SamplingParams(temperature=0, max_new_tokens=24, stop=[stop])
    )
    [[a, b]] = serve(ckpt, [short, stopped])
    ref_ids = reference.response_ids or []
    assert a.finish_reason == "length" and a.response_ids == ref_ids[:3]
    assert b.finish_reason == "stop" and b.text == text[:cut]
    ids = b.response_ids or []
    assert ids == ref_ids[: len(ids)] and len(b.logprobs or []) == len(ids)
    decoded = renderer.tokenizer.decode(ids, skip_special_tokens=False)
    assert stop in decoded and stop not in renderer.tokenizer.decode(ids[:-1], skip_special_tokens=False)


def test_token_in_matches_messages(ckpt: Path, renderer: ChatRenderer) -> None:
    req = screenshot_request("Press enter.", png(160, 96, 8))
    prompt = renderer.render(req.messages, req.images)
    token_in = GenRequest(prompt_ids=prompt.input_ids, images=req.images, sampling=GREEDY)
    [[by_messages, by_ids]] = serve(ckpt, [req, token_in])
    assert by_ids.prompt_ids == by_messages.prompt_ids == prompt.input_ids
    assert by_ids.response_ids == by_messages.response_ids and by_ids.text == by_messages.text


def test_bad_requests_abort_alone(ckpt: Path, renderer: ChatRenderer) -> None:
    good = screenshot_request("Click.", png(64, 48))
    prompt = renderer.render(good.messages, good.images).input_ids
    pad = renderer.image_token_id
    short_ids = prompt[: prompt.index(pad)] + prompt[prompt.index(pad) + 1 :]  # one image-pad token too few
    bad = [
        screenshot_request("Click.", b"\x89PNG\r\n\x1a\n not really"),
        GenRequest(prompt_ids=short_ids, images=good.images, sampling=GREEDY),
        GenRequest(prompt_ids=prompt, images=[], sampling=GREEDY),
        GenRequest(messages=[ChatMessage(role="user", parts=[ImagePart(3)])], images=good.images),
        # longer than the model's positions: CJK characters are not in the merges, 3 tokens each
        GenRequest(messages=[ChatMessage(role="user", parts=[TextPart("\u4e2d" * 12000)])], sampling=GREEDY),
        GenRequest(sampling=GREEDY),
        # ids the embedding has no row for (an IndexError inside generate would fail the whole batch)
        GenRequest(prompt_ids=[*prompt[:3], 10**6], sampling=GREEDY),
        GenRequest(prompt_ids=[-5, *prompt[:3]], sampling=GREEDY),
    ]
    [[first, *aborted, last], [alone]] = serve(ckpt, [good, *bad, good], [good])
    for res in aborted:
        assert res.finish_reason == "abort" and res.text == "" and res.response_ids is None
    assert first.response_ids == last.response_ids == alone.response_ids
    with pytest.raises(
        ValueError, match=r"image 0: prompt_ids hold \d+ <\|image_pad\|> tokens, the image needs"
    ):
        renderer.render_ids(short_ids, good.images)
    with pytest.raises(ValueError, match="not a decodable image"):
        renderer.render_ids(prompt, [b"GIF89a garbage"])


def test_update_weights_from_path(ckpt: Path, tmp_path: Path) -> None:
    """New weights that make <|im_end|> the certain first token: the engine serves them at the new version."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(ckpt / "model.safetensors"))
    eos = ChatRenderer.load(ckpt).tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Residual component 0 is a positive constant at every text position (no layer writes to it), so the
    # final norm keeps it positive, and a large lm_head weight on it for <|im_end|> makes that the argmax.
    state["model.language_model.embed_tokens.weight"][:, 0] = 1.0
    for key in state:
        if key.startswith("model.language_model.layers.") and key.endswith(
            ("o_proj.weight", "down_proj.weight")
        ):
            state[key][0, :] = 0.0
    state["lm_head.weight"][eos, 0] = 1000.0
    save_file(state, str(tmp_path / "model.safetensors"))
    partial = tmp_path / "partial.safetensors"
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(partial))

    async def scenario() -> tuple[GenResult, GenResult, int]:
        engine = HFEngine("hf-test", ckpt)
        await engine.start()
        try:
            req = screenshot_request("Done?", png(64, 48))
            [before] = await engine.generate([req])
            with pytest.raises(NotImplementedError, match="broadcast"):
                await engine.update_weights(1, {"broadcast": True, "n_tensors": 3})
            sglang = WeightGroupSpec("127.0.0.1", 1, world_size=2, layout="sglang")
            plan = [SGLangBucket(names=["w"], dtypes=["float32"], shapes=[[1]])]
            with pytest.raises(EngineError, match="'sglang' layout"):
                await engine.update_weights(1, WeightsFromBroadcast(group=sglang, buckets=plan))
            with pytest.raises(EngineError, match="missing") as failed:
                await engine.update_weights(1, WeightsFromDisk(path=str(partial)))
            assert not failed.value.retryable and engine.policy_version == -1
            await engine.update_weights(1, WeightsFromDisk(path=str(tmp_path)))
            [after] = await engine.generate([req])
            return before, after, engine.policy_version
        finally:
            await engine.close()

    before, after, version = run(scenario())
    assert before.finish_reason == "length" and before.policy_version == -1
    assert after.response_ids == [eos] and after.finish_reason == "stop" and after.text == ""
    assert after.policy_version == version == 1


def test_concurrent_calls_are_serialised(ckpt: Path) -> None:
    requests = [screenshot_request(f"Step {i}.", png(64, 48, i)) for i in range(3)]

    async def scenario() -> tuple[list[list[GenResult]], list[list[GenResult]]]:
        engine = HFEngine("hf-test", ckpt)
        with pytest.raises(EngineDead):
            await engine.generate(requests[:1])  # not started
        await engine.start()
        try:
            together = await asyncio.gather(*(engine.generate([r]) for r in requests))
            one_by_one = [await engine.generate([r]) for r in requests]
            return list(together), one_by_one
        finally:
            await engine.close()

    together, one_by_one = run(scenario())
    assert [r.response_ids for [r] in together] == [r.response_ids for [r] in one_by_one]


def test_the_engine_never_writes_vision_tokens(ckpt: Path, renderer: ChatRenderer) -> None:
    """A response with <|image_pad|> would be taken for an image slot in the next prompt and in training;
    the engine suppresses the vision tokens (the random tiny model would otherwise draw them)."""
    hot = SamplingParams(temperature=5.0, max_new_tokens=200, seed=3)
    reqs = [screenshot_request(f"r{i}", png(64, 48, i), sampling=hot) for i in range(8)]
    [results] = serve(ckpt, reqs)
    vision = set(
        renderer.tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"])
    )
    drawn = [t for r in results for t in (r.response_ids or [])]
    assert len(drawn) > 800 and not vision.intersection(drawn)


def test_tool_schemas_reach_the_chat_template(ckpt: Path, renderer: ChatRenderer) -> None:
    """A system message's `tools` (GUI-RL's prompt style) go to the template as `tools=`: its own tools block
    follows the system text in the prompt the engine runs, and the same ids given token-in answer alike;
    tools on any other message abort that request alone."""
    import json

    spec = json.dumps({"type": "function", "function": {"name": "computer_use", "description": "A mouse."}})
    req = screenshot_request("Click.", png(64, 48))
    system = ChatMessage(role="system", parts=[TextPart("You are a GUI agent.")], tools=[spec])
    with_tools = GenRequest(messages=[system, *req.messages[1:]], images=req.images, sampling=GREEDY)
    prompt = renderer.render(with_tools.messages, with_tools.images).input_ids
    token_in = GenRequest(prompt_ids=prompt, images=req.images, sampling=GREEDY)
    stray = ChatMessage(role="user", parts=[ImagePart(0), TextPart("Click.")], tools=[spec])
    bad = [
        GenRequest(messages=[req.messages[0], stray], images=req.images, sampling=GREEDY),
        GenRequest(messages=[ChatMessage(role="system", parts=[], tools=["[1]"])], sampling=GREEDY),
        GenRequest(messages=[ChatMessage(role="system", parts=[], tools=["{"])], sampling=GREEDY),
    ]
    [[by_messages, by_ids, *aborted, plain]] = serve(ckpt, [with_tools, token_in, *bad, req])
    text = renderer.tokenizer.decode(by_messages.prompt_ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou are a GUI agent.\n\n# Tools\n\n")
    assert f"<tools>\n{spec}\n</tools>" in text and spec not in renderer.template_text(req.messages)
    assert by_messages.prompt_ids == prompt == by_ids.prompt_ids and by_ids.text == by_messages.text
    assert [r.finish_reason for r in aborted] == ["abort"] * 3
    assert "only a first, system message" in aborted[0].error and "not a JSON object" in aborted[1].error
    assert plain.finish_reason != "abort" and plain.prompt_ids != prompt


def test_ids_without_pixels_are_the_ids_with_them(renderer: ChatRenderer) -> None:
    """The `sglang` engine renders ids only (SGLang processes the images itself): each image's token count
    from its header and the image processor's own arithmetic must be what processing its pixels gives, for
    sizes the processor keeps and sizes it resizes (up, down, an odd aspect), and for token-in requests."""
    from guirl.messages.types import ChatMessage, ImagePart, TextPart

    sizes = [(1920, 1088), (1920, 1080), (1280, 800), (640, 400), (96, 64), (33, 1000), (3000, 40)]
    images = [png(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    messages = [
        ChatMessage(role="system", parts=[TextPart("You are a GUI agent.")]),
        ChatMessage(role="user", parts=[*(ImagePart(i) for i in range(len(images))), TextPart("Go.")]),
    ]
    full = renderer.render(messages, images)
    ids = renderer.render(messages, images, pixels=False)
    assert ids.input_ids == full.input_ids and ids.pixel_values is None
    assert renderer.render_ids(full.input_ids, images, pixels=False).input_ids == full.input_ids
    short = list(full.input_ids)
    short.remove(renderer.image_token_id)  # one image's run a token short
    with pytest.raises(ValueError, match="image 0: prompt_ids hold"):
        renderer.render_ids(short, images, pixels=False)
    with pytest.raises(ValueError, match="image 1 .* is not an image"):
        renderer.render(messages, [images[0], b"not a png", *images[2:]], pixels=False)
    # a whole header but cut short: refused here, as decoding it is, not left to the server
    cut = images[1][: len(images[1]) // 2]
    with pytest.raises(ValueError, match="image 1 .* is a truncated PNG"):
        renderer.render(messages, [images[0], cut, *images[2:]], pixels=False)
    with pytest.raises(ValueError, match="image 1 .* not a decodable image"):
        renderer.render(messages, [images[0], cut, *images[2:]])
