"""One policy update on one process: proximal log-probs, then the decoupled clipped loss by micro-batch
with gradient accumulation, a clipped gradient, an optimizer step. No actors, sockets or process groups
(the FSDP learner wraps this).

Decoupled PPO (Hilton et al. 2021; AReaL): the clip is centred on the proximal policy, the learner's
weights at the start of the step, and the gap between the (possibly stale) behaviour policy and the
proximal one is corrected by a truncated importance weight. With one optimizer step per call
(`minibatches=1`) the proximal log-probs equal the current ones, so the ratio is 1 and the clip is idle;
it bites from the second mini-batch on, when the weights have already moved.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from guirl.inference.chat import ChatRenderer
from guirl.learner.logprobs import token_logprobs
from guirl.learner.losses import LossAgg, masked_mean, policy_loss
from guirl.learner.samples import Batch, TrainSample, collate, pack_microbatches

__all__ = ["train_step"]


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    samples: list[TrainSample],
    renderer: ChatRenderer,
    *,
    eps_clip: float,
    eps_clip_high: float | None,
    tis_cap: float,
    loss_agg: LossAgg,
    max_tokens: int,
    temperature: float = 1.0,
    max_grad_norm: float = 1.0,
    minibatches: int = 1,
    pad_id: int | None = None,
) -> dict[str, float]:
    """Train `model` on `samples`; returns the step's metrics.

    `samples` are split, in order, into `minibatches` consecutive parts, each one optimizer step; each
    part is packed into micro-batches of at most `max_tokens` padded tokens whose gradients accumulate.
    The loss is normalised over the whole part (its response tokens for `token-mean`, its sequences
    otherwise), so the accumulated gradient is that of the part in one piece. `tis_cap` caps the
    importance weight behaviour -> proximal; 0 turns the correction off (as `train.tis_cap` does).
    `temperature` is the engine's sampling temperature (1.0 for greedy samples). A step whose gradient
    norm is not finite is skipped (weights unchanged) and counted in `skipped_steps`.

    Metrics: `loss`, `clipfrac`, `approx_kl`, `entropy`, `ratio_mean`, `tis_weight_mean`,
    `tis_clipped_frac`, `behaviour_abs_diff` (token mean of |proximal - behaviour| log-probs: staleness
    plus any training-inference mismatch), `grad_norm` (mean over optimizer steps, before clipping),
    `tokens`, `samples`, `microbatches`, `optimizer_steps`, `skipped_steps`.
    """
    if not samples:
        raise ValueError("train_step needs at least one sample")
    if minibatches < 1:
        raise ValueError(f"minibatches must be >= 1, got {minibatches}")
    pad = renderer.tokenizer.pad_token_id if pad_id is None else pad_id
    if pad is None:
        raise ValueError("the tokenizer has no pad token; pass pad_id")
    param = next(model.parameters())
    parts = [
        [
            collate(mb, renderer, pad).to(param.device, dtype=param.dtype)
            for mb in pack_microbatches(p, max_tokens)
        ]
        for p in _split(samples, minibatches)
    ]

    was_training = model.training
    # Proximal log-probs in eval mode: no dropout, so with unchanged weights the ratio is exactly 1.
    model.eval()
    with torch.no_grad():
        proximal = [[token_logprobs(model, b, temperature=temperature) for b in part] for part in parts]
    # train() for what keys on it (activation checkpointing); Qwen3-VL's dropout rates are 0, so the
    # log-probs are the same as in eval mode.
    model.train()
    sums = dict.fromkeys(_TOKEN_METRICS, 0.0)
    loss_total, grad_norms, skipped = 0.0, [], 0
    try:
        for part, part_proximal in zip(parts, proximal):
            optimizer.zero_grad(set_to_none=True)
            denominator = float(
                sum(b.n_response_tokens for b in part)
                if loss_agg == "token-mean"
                else sum(int(b.response_mask.any(1).sum()) for b in part)
            )
            for batch, old in zip(part, part_proximal):
                loss, token_sums = _micro_step(
                    model, batch, old, denominator, eps_clip, eps_clip_high, tis_cap, loss_agg, temperature
                )
                loss_total += loss
                for k, v in token_sums.items():
                    sums[k] += v
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(
                    [p for p in model.parameters() if p.requires_grad], max_grad_norm
                )
            )
            grad_norms.append(grad_norm)
            if math.isfinite(grad_norm):
                optimizer.step()
            else:  # a NaN/inf gradient would poison every weight; the caller sees skipped_steps
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.train(was_training)

    tokens = sum(b.n_response_tokens for part in parts for b in part)
    metrics = {k: v / max(tokens, 1) for k, v in sums.items()}
    metrics.update(
        loss=loss_total / len(parts),
        grad_norm=sum(grad_norms) / len(grad_norms),
        tokens=float(tokens),
        samples=float(len(samples)),
        microbatches=float(sum(len(part) for part in parts)),
        optimizer_steps=float(len(parts) - skipped),
        skipped_steps=float(skipped),
    )
    return metrics


_TOKEN_METRICS = (
    "clipfrac",
    "approx_kl",
    "entropy",
    "ratio_mean",
    "tis_weight_mean",
    "tis_clipped_frac",
    "behaviour_abs_diff",
)
"""Metrics averaged over response tokens (each micro-batch weighted by its token count)."""


def _micro_step(
    model: Any,
    batch: Batch,
    old: torch.Tensor,
    denominator: float,
    eps_clip: float,
    eps_clip_high: float | None,
    tis_cap: float,
    loss_agg: LossAgg,
    temperature: float,
) -> tuple[float, dict[str, float]]:
    """Forward and backward of one micro-batch; its loss and its token-weighted metric sums."""
    logprobs, entropy = token_logprobs(model, batch, temperature=temperature, with_entropy=True)
    correct = tis_cap > 0
    out = policy_loss(
        logprobs,
        old,
        batch.advantages,
        batch.response_mask,
        eps_clip=eps_clip,
        eps_clip_high=eps_clip_high,
        behaviour_logprobs=batch.behaviour_logprobs if correct else None,
        tis_cap=tis_cap if correct else None,
        loss_agg=loss_agg,
        loss_denominator=denominator,
    )
    out.loss.backward()
    mask = batch.response_mask
    n = float(batch.n_response_tokens)
    means = {
        "clipfrac": out.clipfrac,
        "approx_kl": out.approx_kl,
        "entropy": masked_mean(entropy, mask),
        "ratio_mean": out.ratio_mean,
        "tis_weight_mean": out.tis_weight_mean,
        "tis_clipped_frac": out.tis_clipped_frac,
        "behaviour_abs_diff": masked_mean((old - batch.behaviour_logprobs).abs(), mask),
    }
    return float(out.loss.detach()), {k: float(v) * n for k, v in means.items()}


def _split(samples: list[TrainSample], parts: int) -> list[list[TrainSample]]:
    """`samples` in order, cut into `parts` (at most one per sample) sizes that differ by at most one."""
    parts = min(parts, len(samples))
    size, extra = divmod(len(samples), parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + size + (1 if i < extra else 0)
        out.append(samples[lo:hi])
        lo = hi
    return out
