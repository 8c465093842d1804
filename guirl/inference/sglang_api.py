"""SGLang's native `/generate` on the wire: the request guirl sends and the reply it accepts.

Checked against SGLang's own code (tests/contract, on the release pinned in setup.cfg's `gpu` extra):

- **One `<|image_pad|>` per image.** guirl renders a prompt with each image's pad run expanded (the ids the
  learner trains on), but SGLang's multimodal processor expands the pads itself from the image grid
  (`build_input_ids`) and fails on a run that is already expanded. So the wire carries each run collapsed
  to one pad (`wire_ids`), and the reply's `prompt_token_ids` (asked for with `return_prompt_token_ids`)
  must equal guirl's expanded ids exactly — a server that expands differently would make the learner train
  on tokens the policy never saw. A server too old to echo the ids is checked by count (`prompt_tokens`).
- **Images as `data:` URLs.** SGLang reads an `image_data` string that starts with `/` as a file path,
  and base64 JPEG starts with `/9j/`.
- **Log-probs only when asked.** `meta_info.output_token_logprobs` (`[logprob, token_id, text]` per token)
  is there only with `return_logprob`; otherwise the response ids come from `output_ids`.
- **Seeds.** `sampling_seed` is honoured only by a server started with `--enable-deterministic-inference`
  (`inference.sglang.deterministic`); it is sent only to such a server, so the wire says what happens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec

from guirl.inference.base import EngineError, FinishReason, GenRequest, GenResult
from guirl.inference.openai import data_url
from guirl.messages.types import ImagePart
from guirl.messages.weights import SGLangBucket, WeightGroupSpec

FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def wire_ids(prompt_ids: list[int], pad_id: int) -> list[int]:
    """`prompt_ids` with every run of `pad_id` collapsed to one token (what SGLang expands itself)."""
    out: list[int] = []
    for t in prompt_ids:
        if t != pad_id or not out or out[-1] != pad_id:
            out.append(t)
    return out


def generate_body(
    req: GenRequest, prompt_ids: list[int], images: list[bytes], *, rid: str, seeded: bool = False
) -> dict[str, Any]:
    """SGLang's `/generate` request for one prompt: `prompt_ids` as they go on the wire (one pad per image),
    `images` in prompt order; `seeded`: the server honours `sampling_seed`."""
    s = req.sampling
    greedy = s.temperature <= 0
    sampling: dict[str, Any] = {
        "max_new_tokens": s.max_new_tokens,
        "temperature": 0.0 if greedy else s.temperature,
        "top_p": 1.0 if greedy else s.top_p,
        "top_k": -1 if greedy or s.top_k <= 0 else s.top_k,
        "ignore_eos": s.ignore_eos,
        "skip_special_tokens": False,  # the text as the hf engine decodes it (tool-call tags and all)
    }
    if s.stop:
        sampling["stop"] = list(s.stop)
    if seeded and s.seed is not None and not greedy:
        sampling["sampling_seed"] = int(s.seed) & (2**63 - 1)  # SGLang takes a signed 64-bit seed
    body: dict[str, Any] = {
        "rid": rid,
        "input_ids": prompt_ids,
        "sampling_params": sampling,
        "return_logprob": req.return_logprobs,
        "return_prompt_token_ids": True,
    }
    if images:
        body["image_data"] = [data_url(img) for img in images]
    return body


def init_group_body(group: WeightGroupSpec, rank_offset: int) -> dict[str, Any]:
    """`/init_weights_update_group`'s body: join the learner's weight group `group` (a `WeightGroupSpec`)
    with this server's ranks from `rank_offset` on (one per TP rank)."""
    return {
        "master_address": group.host,
        "master_port": group.port,
        "rank_offset": rank_offset,
        "world_size": group.world_size,
        "group_name": group.group_name,
        "backend": group.backend,
    }


def bucket_body(bucket: SGLangBucket, group_name: str, version: int, *, flattened: bool) -> dict[str, Any]:
    """`/update_weights_from_distributed`'s body for one bucket (`SGLangBucket`) of version `version`; the
    cache is flushed once after the last bucket, not per bucket."""
    body = {
        "names": bucket.names,
        "dtypes": bucket.dtypes,
        "shapes": bucket.shapes,
        "group_name": group_name,
        "flush_cache": False,
        "weight_version": str(version),
    }
    if flattened:
        body["load_format"] = "flattened_bucket"
    return body


def parse_generate(
    raw: bytes, prompt_ids: list[int], url: str, *, logprobs: bool = True, vocab: int = 2**31
) -> GenResult:
    """SGLang's `/generate` reply -> `GenResult` (`prompt_ids`: guirl's expanded ids; `logprobs`: they were
    asked for; `vocab`: the model's vocabulary size, which every response id must be under: one beyond it
    would fail the learner's embedding lookup); anything else is a retryable `EngineError` saying what."""

    def bad(what: str) -> EngineError:
        return EngineError(f"{url}: reply is not SGLang's generate output: {what}", retryable=True)

    try:
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise bad(f"not JSON ({raw[:80]!r})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("meta_info"), dict):
        raise bad("no meta_info object")
    meta = doc["meta_info"]
    text = doc.get("text")
    if not isinstance(text, str):
        raise bad("no text")
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in FINISH:
        raise bad(f"finish_reason {finish!r}")
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, dict) else None
        return GenResult(text="", finish_reason="abort", error=str(message or "aborted by the server")[:300])
    _check_prompt(doc, meta, prompt_ids, url)
    output_ids = doc.get("output_ids")
    if output_ids is not None and not _token_ids(output_ids):
        raise bad("output_ids is not a list of token ids")
    lps = meta.get("output_token_logprobs")
    if logprobs or lps is not None:
        if not isinstance(lps, list) or not all(
            isinstance(x, list | tuple) and len(x) >= 2 and _logprob(x[0]) and _token_id(x[1]) for x in lps
        ):
            raise bad("output_token_logprobs is not a list of [logprob <= 0, token id, ...]")
        response_ids = [x[1] for x in lps]
        if output_ids is not None and output_ids != response_ids:
            raise bad("output_ids disagree with output_token_logprobs")
        values: list[float] | None = [float(x[0]) for x in lps]
    elif output_ids is None:
        raise bad("neither output_ids nor output_token_logprobs")
    else:
        response_ids, values = list(output_ids), None
    if any(t >= vocab for t in response_ids):
        raise bad(f"a response token id of {max(response_ids)}, beyond the model's vocabulary of {vocab}")
    if meta.get("completion_tokens", len(response_ids)) != len(response_ids):
        raise bad(f"completion_tokens {meta.get('completion_tokens')!r} for {len(response_ids)} tokens")
    return GenResult(
        text=text,
        prompt_ids=list(prompt_ids),
        response_ids=response_ids,
        logprobs=values if logprobs else None,
        finish_reason=FINISH[kind],
    )


def _token_id(t: Any) -> bool:
    """A token id as a reply may carry one: an int that fits the int32 a `PolicyResponse` holds."""
    return type(t) is int and 0 <= t < 2**31


def _token_ids(ids: Any) -> bool:
    return isinstance(ids, list) and all(_token_id(t) for t in ids)


def _logprob(x: Any) -> bool:
    """A log-probability: a finite number, not above 0 (but for rounding)."""
    return type(x) in (int, float) and math.isfinite(x) and x <= 1e-4


def _check_prompt(doc: dict[str, Any], meta: dict[str, Any], prompt_ids: list[int], url: str) -> None:
    """The server's prompt must be guirl's: the same ids (when it echoes them), else as many."""
    echoed = doc.get("prompt_token_ids")
    if echoed is not None:
        if not _token_ids(echoed):
            raise EngineError(f"{url}: reply's prompt_token_ids is not a list of token ids", retryable=True)
        if echoed == prompt_ids:
            return
        first = next(
            (i for i, (a, b) in enumerate(zip(echoed, prompt_ids)) if a != b),
            min(len(echoed), len(prompt_ids)),
        )
        what = f"its {len(echoed)} ids differ from guirl's from position {first}"
    elif meta.get("prompt_tokens") == len(prompt_ids):
        return
    else:
        what = f"it counted {meta.get('prompt_tokens')!r}"
    raise EngineError(
        f"{url}: the server's prompt is not the one guirl rendered ({len(prompt_ids)} tokens; {what}): its "
        "image processing differs from the checkpoint's (the samples would not be the tokens it saw)",
        retryable=False,
    )


def model_vocab(ckpt_dir: Path) -> int:
    """The checkpoint's vocabulary size (its config's; Qwen pads it beyond the tokenizer's), or 2**31 when
    the config does not say."""
    import json

    try:
        config = json.loads((Path(ckpt_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return 2**31
    size = (config.get("text_config") or {}).get("vocab_size") or config.get("vocab_size")
    return size if isinstance(size, int) and size > 0 else 2**31


def load_renderer(ckpt_dir: Path) -> Any:
    """The checkpoint's `ChatRenderer` (its tokenizer and image processor)."""
    from guirl.inference.chat import ChatRenderer

    return ChatRenderer.load(ckpt_dir)


def render_request(renderer: Any, req: GenRequest) -> tuple[list[int], list[bytes]]:
    """The exact prompt ids (image pads expanded) and the images in prompt order; ValueError when the
    request cannot be served (the hf engine's checks)."""
    if req.prompt_ids is not None:
        vocab = len(renderer.tokenizer)
        bad = next((t for t in req.prompt_ids if type(t) is not int or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt_ids hold {bad!r}, not a token id of this model (0..{vocab - 1})")
        rendered = renderer.render_ids(list(req.prompt_ids), req.images, pixels=False)
        return list(rendered.input_ids), list(req.images)
    # SGLang processes the images itself: the ids need only each image's token count, from its size
    rendered = renderer.render(req.messages, req.images, pixels=False)
    order = [p.index for m in req.messages for p in m.parts if isinstance(p, ImagePart)]
    return list(rendered.input_ids), [req.images[i] for i in order]
