"""The learner's log-probs of response tokens: the quantity the engine reported at generation, recomputed.

`log pi(y_t) = z[y_t] - logsumexp(z)` with `z = logits / temperature`, which is `log_softmax(z)[y_t]`
without a (positions, vocab) log-softmax tensor. Only response positions reach the LM head (the model's
`logits_to_keep` with a boolean mask): a screenshot prompt is thousands of tokens, its logits are never
needed, and with a 150k vocabulary they would dominate the step's memory.

Positions: the model derives Qwen3-VL's 3-D mrope positions itself from `input_ids`, `mm_token_type_ids`,
`image_grid_thw` and `attention_mask`, and with `collate`'s right padding they are each row's own
positions (see `collate`), so none are passed. What the engine's positions depend on and a mistake here
would change is the relative layout inside a row: image tokens on their (t, h, w) grid and the text after
an image advanced by max(h, w) / merge rather than by its token count; `mm_token_type_ids` carries it.
`tests/integration/test_learner_agreement.py` holds the result to the engine's behaviour log-probs to
1e-4 per token (measured: under 1e-5) and shows that zeroed `mm_token_type_ids` miss by 0.4 to 3 nats.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch

from guirl.learner.losses import entropy_from_logits
from guirl.learner.samples import Batch

__all__ = ["token_logprobs"]


def _takes_boolean_keep() -> bool:
    """Whether this transformers slices `logits_to_keep` given as a (B, T) boolean mask (5.2x+; older ones
    take an int or a 1-D index only, whose positions are the union over the batch: up to B times the logits'
    memory when rows' responses sit at different positions)."""
    import transformers.modeling_utils as modeling_utils

    return hasattr(modeling_utils, "slice_logits_to_keep")


_BOOLEAN_KEEP = _takes_boolean_keep()


@overload
def token_logprobs(
    model: Any,
    batch: Batch,
    *,
    temperature: float = 1.0,
    with_entropy: Literal[False] = False,
    chunk_size: int = 1024,
) -> torch.Tensor: ...


@overload
def token_logprobs(
    model: Any,
    batch: Batch,
    *,
    temperature: float = 1.0,
    with_entropy: Literal[True],
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]: ...


def token_logprobs(
    model: Any,
    batch: Batch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 1024,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(B, T) float32 log-probs of the response tokens under `model`, label-aligned as `batch` (position
    `t` scores `input_ids[:, t + 1]`), 0 outside `batch.response_mask`; differentiable when grad is on.

    `temperature` must be the one the engine sampled with (1.0 for greedy: the engine reports raw
    log-probs then). `with_entropy` also returns the (B, T) entropy of the temperature-scaled
    distribution, detached (a metric). `chunk_size` bounds the float32 upcast to that many positions at
    a time (bf16 logits).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive (greedy samples use 1.0), got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    param = next(model.parameters())
    batch = batch.to(param.device, dtype=param.dtype)
    mask = batch.response_mask
    # labels[:, t] = input_ids[:, t + 1]; the last column is never in the mask, so its filler is unused.
    labels = torch.roll(batch.input_ids, shifts=-1, dims=1)[mask]  # (N,)
    if _BOOLEAN_KEEP:  # logits of the true positions only, flattened to (N, V) in the labels' order
        logits = model(**batch.model_inputs(), logits_to_keep=mask, use_cache=False).logits
    else:  # an older transformers: a 1-D index of the positions any row scores, (B, K, V), then each row's
        keep = mask.any(dim=0).nonzero().squeeze(-1)
        logits = model(**batch.model_inputs(), logits_to_keep=keep, use_cache=False).logits[mask[:, keep]]
    chosen_parts, entropy_parts = [], []
    for lo in range(0, labels.shape[0], chunk_size):
        z = logits[lo : lo + chunk_size].float()
        if temperature != 1.0:
            z = z / temperature
        chosen = z.gather(-1, labels[lo : lo + chunk_size, None]).squeeze(-1)
        chosen_parts.append(chosen - torch.logsumexp(z, dim=-1))
        if with_entropy:
            with torch.no_grad():
                entropy_parts.append(entropy_from_logits(z))
    out = _scatter(mask, chosen_parts)
    if not with_entropy:
        return out
    return out, _scatter(mask, entropy_parts).detach()


def _scatter(mask: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """(N,) values at the true positions of a (B, T) mask to a (B, T) float32 tensor, 0 elsewhere."""
    values = torch.cat(parts) if parts else mask.new_zeros(0, dtype=torch.float32)
    full = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return full.masked_scatter(mask, values.float())
