"""One policy update on one process: proximal log-probs, then the decoupled clipped loss by micro-batch
with gradient accumulation, a clipped gradient, an optimizer step. No actors, sockets or process groups
(the FSDP learner wraps this).

Decoupled PPO (Hilton et al. 2021; AReaL): the clip is centred on the proximal policy, the learner's
weights at the start of the step, and the gap between the (possibly stale) behaviour policy and the
proximal one is corrected by a truncated importance weight. With one optimizer step per call
(`minibatches=1`) the proximal log-probs equal the current ones, so the ratio is 1 and the clip is idle;
it bites from the second mini-batch on, when the weights have already moved.

Data parallel (FSDP2, `guirl/learner/fsdp.py`): every rank is given the same global batch and trains on
its share of each mini-batch (`split_for_rank`). Each rank's loss is divided by the global mini-batch's
count (known to every rank, as it holds the whole batch), and FSDP sums the ranks' gradients, so the sum
is the gradient one process would get from the whole mini-batch; the weights, the gradient norm and the
skip decision are therefore the same on every rank and equal to the single-process update.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from guirl.inference.chat import ChatRenderer
from guirl.learner.fsdp import DistInfo, idle_sample, split_for_rank, sum_gradient_reduction
from guirl.learner.logprobs import token_logprobs
from guirl.learner.losses import KLKind, LossAgg, aggregate, kl_penalty, masked_mean, policy_loss
from guirl.learner.samples import Batch, TrainSample, collate, pack_microbatches

__all__ = ["BatchRejected", "train_step"]


class BatchRejected(ValueError):
    """The batch could not be prepared (on this rank or another) before any collective ran: no rank
    trained on it, the weights are unchanged and every rank may go on with the next batch."""


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
    dist_info: DistInfo | None = None,
    ref_model: Any = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
) -> dict[str, float]:
    """Train `model` on `samples`; returns the step's metrics.

    `samples` are split, in order, into `minibatches` consecutive parts, each one optimizer step; each
    part is packed into micro-batches of at most `max_tokens` padded tokens whose gradients accumulate.
    The loss is normalised over the whole part (its response tokens for `token-mean`, its sequences
    otherwise), so the accumulated gradient is that of the part in one piece. `tis_cap` caps the
    importance weight behaviour -> proximal; 0 turns the correction off (as `train.tis_cap` does).
    `temperature` is the engine's sampling temperature (1.0 for greedy samples). A step whose gradient
    norm is not finite is skipped (weights unchanged) and counted in `skipped_steps`.

    `dist_info` with `world > 1`: `model` must be FSDP2-sharded (`shard_model`) and every rank must pass
    the same `samples` (checked); each trains on its share and the update equals the single-process one.
    Metrics are then those of the global batch (sums reduced across ranks).

    Metrics: `loss`, `clipfrac`, `approx_kl`, `entropy`, `ratio_mean`, `tis_weight_mean`,
    `tis_clipped_frac`, `behaviour_abs_diff` (token mean of |proximal - behaviour| log-probs: staleness
    plus any training-inference mismatch), `grad_norm` (mean over optimizer steps, before clipping),
    `tokens`, `samples`, `microbatches` (over all ranks, idle ones not counted), `optimizer_steps`,
    `skipped_steps`; with a reference model, `kl_ref` (token mean of the KL estimator).

    `ref_model` and `kl_coef > 0`: the loss adds `kl_coef` x the `kl_kind` estimate of KL(policy || ref)
    per response token, aggregated as the policy loss is (the PRM mode of OpenClaw-RL's GUI-RL: k3, 0.01).
    """
    if not samples:
        raise ValueError("train_step needs at least one sample")
    if minibatches < 1:
        raise ValueError(f"minibatches must be >= 1, got {minibatches}")
    pad = renderer.tokenizer.pad_token_id if pad_id is None else pad_id
    if pad is None:
        raise ValueError("the tokenizer has no pad token; pass pad_id")
    rank, world = (dist_info.rank, dist_info.world) if dist_info is not None else (0, 1)
    if world > 1 and not isinstance(model, FSDPModule):
        # Nothing would reduce the gradients: each rank would step on its own share alone.
        raise TypeError(f"train_step on {world} ranks needs an FSDP2 model (shard_model), got {type(model)}")
    global_parts = _split(samples, minibatches)
    shares = [
        pack_microbatches(part, max_tokens) if part else [] for part in _shares(global_parts, rank, world)
    ]
    idle = idle_sample(renderer) if world > 1 else None
    param = next(model.parameters())

    def collate(mb: list[TrainSample]) -> Batch:
        return _collate(mb, renderer, pad, idle).to(param.device, dtype=param.dtype)

    # This rank's share first: a sample that cannot be collated (an image that does not decode, image
    # tokens that do not match its images) fails on its own rank only, and the others must not go on
    # into collectives that rank will never join — every rank learns of it in the agreement below.
    failure: Exception | None = None
    parts: list[list[Batch]] = []
    try:
        parts = [[collate(mb) for mb in mbs] for mbs in shares]
    except Exception as exc:
        failure = exc
    if world > 1:
        sum_gradient_reduction(model)  # idempotent: the step's arithmetic relies on a sum, not FSDP's mean
        counts = _agree(samples, [len(mbs) for mbs in shares], dist_info.device, failed=failure is not None)
        if failure is None:
            # Equal micro-batch counts on every rank: each forward/backward is a round of FSDP collectives.
            parts = [part + [collate([]) for _ in range(n - len(part))] for part, n in zip(parts, counts)]
    if failure is not None:
        raise BatchRejected(f"a sample of the batch cannot be prepared: {failure}") from failure
    # The global count (every rank holds the global batch): the ranks' losses add up to the whole loss.
    denominators = [
        float(sum(len(s.response_ids) for s in part) if loss_agg == "token-mean" else len(part))
        for part in global_parts
    ]

    was_training = model.training
    # Proximal log-probs in eval mode: no dropout, so with unchanged weights the ratio is exactly 1.
    model.eval()
    with torch.no_grad():
        proximal = [[token_logprobs(model, b, temperature=temperature) for b in part] for part in parts]
        use_kl = ref_model is not None and kl_coef > 0
        reference = (
            [[token_logprobs(ref_model, b, temperature=temperature) for b in part] for part in parts]
            if use_kl
            else [[None] * len(part) for part in parts]
        )
    # train() for what keys on it (activation checkpointing); Qwen3-VL's dropout rates are 0, so the
    # log-probs are the same as in eval mode.
    model.train()
    sums = dict.fromkeys(_TOKEN_METRICS, 0.0)
    loss_total, grad_norms, skipped = 0.0, [], 0
    try:
        for part, part_proximal, part_ref, denominator in zip(parts, proximal, reference, denominators):
            optimizer.zero_grad(set_to_none=True)
            for batch, old, ref in zip(part, part_proximal, part_ref):
                loss, token_sums = _micro_step(
                    model,
                    batch,
                    old,
                    denominator,
                    eps_clip,
                    eps_clip_high,
                    tis_cap,
                    loss_agg,
                    temperature,
                    ref=ref,
                    kl_coef=kl_coef,
                    kl_kind=kl_kind,
                )
                loss_total += loss
                for k, v in token_sums.items():
                    sums[k] += v
            total_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], max_grad_norm
            )
            # Under FSDP2 the norm is a DTensor holding this rank's partial; full_tensor() all-reduces it
            # (the same value on every rank, so every rank makes the same skip decision).
            grad_norm = float(total_norm.full_tensor() if isinstance(total_norm, DTensor) else total_norm)
            grad_norms.append(grad_norm)
            if math.isfinite(grad_norm):
                optimizer.step()
            else:  # a NaN/inf gradient would poison every weight; the caller sees skipped_steps
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.train(was_training)

    microbatches = sum(1 for part in parts for b in part if b.n_response_tokens)
    if world > 1:
        loss_total, microbatches, sums = _sum_over_ranks(loss_total, microbatches, sums, dist_info.device)
    tokens = sum(len(s.response_ids) for s in samples)
    metrics = {k: v / max(tokens, 1) for k, v in sums.items()}
    metrics.update(
        loss=loss_total / len(parts),
        grad_norm=sum(grad_norms) / len(grad_norms),
        tokens=float(tokens),
        samples=float(len(samples)),
        microbatches=float(microbatches),
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
    "kl_ref",
    "nll",
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
    *,
    ref: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
) -> tuple[float, dict[str, float]]:
    """Forward and backward of one micro-batch; its loss and its token-weighted metric sums."""
    if batch.n_response_tokens == 0:
        # An idle micro-batch (data parallel: this rank has nothing left in this mini-batch). It must
        # still run the forward and backward, whose FSDP all-gathers and reduce-scatters the other ranks
        # wait for; a zero loss connected to every parameter contributes exactly zero gradient.
        logits = model(**batch.model_inputs(), logits_to_keep=1, use_cache=False).logits
        (logits.float() * 0.0).sum().backward()
        return 0.0, dict.fromkeys(_TOKEN_METRICS, 0.0)
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
    loss = out.loss
    mask = batch.response_mask
    kl_mean = torch.zeros(())
    if ref is not None and kl_coef > 0:
        kl = kl_penalty(logprobs, ref, kl_kind)
        kl_mean = masked_mean(kl.detach(), mask)
        loss = loss + kl_coef * aggregate(kl, mask, loss_agg, denominator)
    loss.backward()
    n = float(batch.n_response_tokens)
    means = {
        "clipfrac": out.clipfrac,
        "approx_kl": out.approx_kl,
        "entropy": masked_mean(entropy, mask),
        "ratio_mean": out.ratio_mean,
        "tis_weight_mean": out.tis_weight_mean,
        "tis_clipped_frac": out.tis_clipped_frac,
        "behaviour_abs_diff": masked_mean((old - batch.behaviour_logprobs).abs(), mask),
        "kl_ref": kl_mean,
        "nll": masked_mean(-old, mask),  # of the responses under the weights before the step (SFT's loss)
    }
    return float(loss.detach()), {k: float(v) * n for k, v in means.items()}


def _shares(parts: list[list[TrainSample]], rank: int, world: int) -> list[list[TrainSample]]:
    """This rank's share of each mini-batch (all of it on one rank)."""
    return parts if world == 1 else [split_for_rank(part, rank, world) for part in parts]


def _collate(mb: list[TrainSample], renderer: ChatRenderer, pad: int, idle: TrainSample | None) -> Batch:
    """`collate`, plus, in data parallel (`idle` given), a masked-out image row when the micro-batch has no
    image: every rank then runs the vision blocks, whose FSDP collectives the ranks with images issue."""
    if idle is None or any(s.images for s in mb):
        return collate(mb, renderer, pad)
    batch = collate([*mb, idle], renderer, pad)
    # No loss, gradient or metric from it: label-aligned tensors are read only where the mask is true.
    batch.response_mask[-1] = False
    batch.advantages[-1] = 0.0
    batch.behaviour_logprobs[-1] = 0.0
    return batch


def _agree(
    samples: list[TrainSample], counts: list[int], device: torch.device, *, failed: bool = False
) -> list[int]:
    """Check that every rank holds the same global batch and return, per mini-batch, the largest
    micro-batch count of any rank; one all-reduce (on `device`: NCCL reduces GPU tensors only).
    `failed`: this rank could not prepare its share; every rank then raises (a rank that failed raises
    its own error, the caller's job)."""
    shape = [len(samples), sum(s.n_tokens for s in samples), sum(len(s.response_ids) for s in samples)]
    t = torch.tensor([int(failed), *shape, *(-x for x in shape), *counts], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if int(t[0]) and not failed:
        raise BatchRejected("another rank could not prepare its share of the batch (see its log)")
    t = t[1:]
    k = len(shape)
    if t[:k].tolist() != (-t[k : 2 * k]).tolist():
        # Shares computed from different batches would not add up to any batch's gradient.
        raise ValueError(
            f"ranks hold different batches (samples, tokens, response tokens): max {t[:k].tolist()}, "
            f"min {(-t[k : 2 * k]).tolist()}; pass every rank the same global batch"
        )
    return t[2 * k :].tolist()


def _sum_over_ranks(
    loss: float, microbatches: int, sums: dict[str, float], device: torch.device
) -> tuple[float, int, dict[str, float]]:
    """The global batch's loss, micro-batch count and token-weighted metric sums; one all-reduce."""
    keys = list(sums)
    t = torch.tensor(
        [loss, float(microbatches), *(sums[k] for k in keys)], dtype=torch.float64, device=device
    )
    dist.all_reduce(t)
    values = t.tolist()
    return values[0], int(values[1]), dict(zip(keys, values[2:]))


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
