"""The SGLang wire functions on their own: what goes out (one pad per image, data: URLs, seeds only when
honoured) and which replies are refused (hand-written bodies of SGLang's reply shape, each broken one way)."""

from __future__ import annotations

import json

import pytest

from guirl.inference.base import EngineError, GenRequest
from guirl.inference.sglang_api import bucket_body, generate_body, init_group_body, parse_generate, wire_ids
from guirl.messages.types import SamplingParams
from guirl.weights.broadcast import SGLangBucket, WeightGroupSpec

PAD = 9
PROMPT = [1, 2, 7, PAD, PAD, PAD, 8, 3, 7, PAD, PAD, 8, 4]  # two images, <vision_start>=7 <vision_end>=8


def _reply(**over) -> bytes:
    doc = {
        "text": "ok",
        "output_ids": [5, 6],
        "prompt_token_ids": PROMPT,
        "meta_info": {
            "finish_reason": {"type": "length", "length": 2},
            "prompt_tokens": len(PROMPT),
            "completion_tokens": 2,
            "output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None]],
        },
    }
    meta = over.pop("meta", {})
    doc.update(over)
    doc["meta_info"].update(meta)
    for k in [k for k, v in doc["meta_info"].items() if v is None]:
        del doc["meta_info"][k]
    for k in [k for k, v in doc.items() if v is None]:
        del doc[k]
    return json.dumps(doc).encode()


def test_each_pad_run_goes_as_one_pad() -> None:
    assert wire_ids(PROMPT, PAD) == [1, 2, 7, PAD, 8, 3, 7, PAD, 8, 4]
    assert wire_ids([PAD, PAD], PAD) == [PAD] and wire_ids([1, 2], PAD) == [1, 2]


def test_the_request_body() -> None:
    req = GenRequest(sampling=SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, seed=2**70 + 3))
    jpeg = b"\xff\xd8\xff\xe0" + b"x" * 10
    body = generate_body(req, [1, 2], [jpeg, b"\x89PNG\r\n\x1a\nabc"], rid="r1", seeded=True)
    assert body["image_data"][0].startswith("data:image/jpeg;base64,/9j/")
    assert body["image_data"][1].startswith("data:image/png;base64,")
    assert 0 <= body["sampling_params"]["sampling_seed"] < 2**63  # SGLang takes a signed 64-bit seed
    assert body["return_prompt_token_ids"] is True and body["input_ids"] == [1, 2]
    assert "sampling_seed" not in generate_body(req, [1], [], rid="r", seeded=False)["sampling_params"]
    greedy = GenRequest(sampling=SamplingParams(temperature=0.0, seed=4))
    assert "sampling_seed" not in generate_body(greedy, [1], [], rid="r", seeded=True)["sampling_params"]
    group = WeightGroupSpec(host="10.0.0.1", port=123, world_size=4, group_name="g", layout="sglang")
    assert init_group_body(group, 2) == {
        "master_address": "10.0.0.1",
        "master_port": 123,
        "rank_offset": 2,
        "world_size": 4,
        "group_name": "g",
        "backend": "gloo",
    }
    bucket = SGLangBucket(names=["a"], dtypes=["bfloat16"], shapes=[[2]])
    assert bucket_body(bucket, "g", 7, flattened=False) == {
        "names": ["a"],
        "dtypes": ["bfloat16"],
        "shapes": [[2]],
        "group_name": "g",
        "flush_cache": False,
        "weight_version": "7",
    }


def test_a_good_reply_with_and_without_logprobs() -> None:
    got = parse_generate(_reply(), PROMPT, "u")
    assert got.response_ids == [5, 6] and got.logprobs == [-0.5, -1.25] and got.prompt_ids == PROMPT
    plain = parse_generate(_reply(meta={"output_token_logprobs": None}), PROMPT, "u", logprobs=False)
    assert plain.response_ids == [5, 6] and plain.logprobs is None
    counted = parse_generate(_reply(prompt_token_ids=None), PROMPT, "u")  # an older server: by count
    assert counted.response_ids == [5, 6]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (_reply(meta={"output_token_logprobs": None}), "output_token_logprobs"),  # asked for, missing
        (_reply(output_ids=[5, 2**31]), "output_ids is not a list of token ids"),
        (_reply(output_ids=[5, -1]), "output_ids is not a list of token ids"),
        (_reply(output_ids=[5, True]), "output_ids is not a list of token ids"),
        (_reply(meta={"output_token_logprobs": [[0.5, 5, None], [-1.0, 6, None]]}), "logprob <= 0"),
        (_reply(meta={"output_token_logprobs": [[True, 5, None], [-1.0, 6, None]]}), "logprob <= 0"),
        (_reply(meta={"output_token_logprobs": [[float("nan"), 5], [-1.0, 6]]}), "not JSON"),  # NaN
        (_reply(meta={"output_token_logprobs": [[-0.1, 2**40], [-1.0, 6]]}), "logprob <= 0"),
        (_reply(meta={"output_token_logprobs": []}), "disagree"),  # shorter than output_ids
        (_reply(output_ids=[5, 6, 7]), "disagree"),
        (_reply(meta={"completion_tokens": 3}), "completion_tokens"),
        (_reply(prompt_token_ids="abc"), "prompt_token_ids"),
        (_reply(meta={"finish_reason": {"type": "weird"}}), "finish_reason"),
        (b"[1, 2]", "meta_info"),
        (b"{not json", "not JSON"),
    ],
)
def test_malformed_replies_are_retryable_errors(reply: bytes, message: str) -> None:
    with pytest.raises(EngineError, match=message) as e:
        parse_generate(reply, PROMPT, "u")
    assert e.value.retryable


def test_a_server_that_expands_otherwise_is_refused_for_good() -> None:
    other = [*PROMPT[:4], *PROMPT[3:]]  # one pad more for the first image
    with pytest.raises(EngineError, match="from position 6") as e:
        parse_generate(_reply(prompt_token_ids=other), PROMPT, "u")
    assert not e.value.retryable
    with pytest.raises(EngineError, match="counted 12") as e:
        parse_generate(_reply(prompt_token_ids=None, meta={"prompt_tokens": 12}), PROMPT, "u")
    assert not e.value.retryable
