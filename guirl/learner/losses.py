"""Token-level policy loss (decoupled PPO clip + truncated importance sampling), KL estimators, entropy.

Pure functions of per-token tensors of shape (B, T) with a response mask; names follow CleanRL
(`ratio`, `pg_loss1`, `pg_loss2`, `clipfrac`, `approx_kl`). Every padded position is removed with
`torch.where` before any arithmetic, so a garbage value there (even inf) can change neither the
loss nor a gradient. Tested against hand-computed values in `tests/unit/test_losses.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "LossAgg",
    "KLKind",
    "PolicyLossOutput",
    "aggregate",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLKind = Literal["k1", "k2", "k3"]

# verl clamps log-ratios to +-20 before exp (`compute_policy_loss`, `kl_penalty`): e^20 ~ 5e8 is
# already a broken sample, and beyond it exp overflows in bf16/fp16.
_LOG_RATIO_CLAMP = 20.0
# verl's `low_var_kl` clamps the k3 value itself to [-10, 10].
_K3_CLAMP = 10.0


@dataclass(frozen=True)
class PolicyLossOutput:
    """The loss to backpropagate and detached 0-dim metrics (call `.item()` only when logging)."""

    loss: Tensor
    """Scalar, differentiable w.r.t. `logprobs` only."""
    clipfrac: Tensor
    """Fraction of response tokens where the clipped term was taken (their gradient is zero)."""
    approx_kl: Tensor
    """Token mean of `(ratio - 1) - log(ratio)` (k3 of KL(proximal || current)), as CleanRL logs it."""
    ratio_mean: Tensor
    """Token mean of `ratio = pi_theta / pi_proximal`."""
    tis_weight_mean: Tensor
    """Token mean of the truncated importance weight (1 when no behaviour log-probs are given)."""
    tis_clipped_frac: Tensor
    """Fraction of tokens whose importance weight was truncated at `tis_cap`."""


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over positions where `mask` is true (over `dim`, or all of them).

    Padded entries are selected out, not multiplied by 0, so inf/NaN padding cannot leak in.
    An all-false mask gives 0 (not NaN): an empty micro-batch must still backward cleanly.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = m.sum() if dim is None else m.sum(dim)
    total = total.sum() if dim is None else total.sum(dim)
    return total / count.clamp(min=1).to(total.dtype)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    behaviour_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
    loss_agg: LossAgg = "token-mean",
    loss_denominator: float | None = None,
) -> PolicyLossOutput:
    """Decoupled clipped surrogate with truncated importance sampling, per token, then aggregated.

    All tensors are (B, T): `logprobs` of the response tokens under the current weights (with
    grad), `old_logprobs` under the proximal policy, `advantages` per token (see
    `broadcast_to_tokens`), `response_mask` true on response tokens only.

    Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL):
    the clip trust region is centred on the proximal policy, i.e. the learner's weights at the
    start of this step, not on the possibly much older behaviour policy that generated the
    sample, so the clip stays meaningful however stale the sample:

        ratio    = exp(logprobs - old_logprobs)
        pg_loss1 = -A * ratio
        pg_loss2 = -A * clamp(ratio, 1 - eps_clip, 1 + eps_clip_high)    (DAPO's clip-higher)
        pg       = max(pg_loss1, pg_loss2) * w

    `w` corrects for the behaviour policy being older than the proximal one: when
    `behaviour_logprobs` (recorded by the engine at generation) are given,
    `w = min(exp(old_logprobs - behaviour_logprobs), tis_cap)`, detached: truncated importance
    sampling as in "Your efficient RL framework secretly brings you off-policy RL training"
    (Yao et al. 2025, verl's TIS). `tis_cap=None` leaves w untruncated. (AReaL instead masks
    tokens whose weight exceeds the cap; truncation keeps their bounded contribution.)

    `loss_agg`:
    - "token-mean": sum over all response tokens / their number in the batch (DAPO: each token
      weighs the same, so long responses are not down-weighted).
    - "seq-mean-token-mean": mean over sequences of each sequence's token mean (original GRPO).
    - "seq-mean-token-sum": mean over sequences of each sequence's token sum (Dr. GRPO-style).
    Sequences with no response token are left out of the sequence means.
    `loss_denominator` replaces the token (or sequence) count: pass the count over the whole
    global batch when it is split into micro-batches or ranks, so that accumulated gradients
    equal the full-batch ones.
    """
    shape = logprobs.shape
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("advantages", advantages),
        ("response_mask", response_mask),
    ):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprobs shape {tuple(shape)}")
    if behaviour_logprobs is not None and behaviour_logprobs.shape != shape:
        raise ValueError(f"behaviour_logprobs shape {tuple(behaviour_logprobs.shape)} != {tuple(shape)}")
    if logprobs.dim() != 2:
        raise ValueError(f"expected (B, T) tensors, got shape {tuple(shape)}")
    if eps_clip < 0 or (eps_clip_high is not None and eps_clip_high < 0):
        raise ValueError("clip ranges must be non-negative")
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be positive, got {tis_cap}")
    high = eps_clip if eps_clip_high is None else eps_clip_high
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    # Mask the inputs before exp: a padded exp(inf) would give 0 * inf = NaN in backward.
    old = old_logprobs.detach()
    logratio = torch.where(mask, logprobs - old, zero).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(logratio)
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + high)
    pg_losses = torch.maximum(pg_loss1, pg_loss2)

    if behaviour_logprobs is not None:
        log_w = torch.where(mask, old - behaviour_logprobs.detach(), zero).clamp(max=_LOG_RATIO_CLAMP)
        raw_w = torch.exp(log_w)
        tis_weight = raw_w if tis_cap is None else raw_w.clamp(max=tis_cap)
        tis_clipped = (raw_w > tis_cap) if tis_cap is not None else torch.zeros_like(mask)
        pg_losses = pg_losses * tis_weight
    else:
        tis_weight = torch.ones_like(ratio)
        tis_clipped = torch.zeros_like(mask)

    loss = aggregate(pg_losses, mask, loss_agg, loss_denominator)

    with torch.no_grad():
        # Clip "active" = the clipped branch was chosen, so this token's gradient is zero (verl's
        # pg_clipfrac). CleanRL counts |ratio - 1| > eps regardless of the advantage's sign,
        # which also counts tokens the pessimistic max leaves unclipped.
        clipfrac = masked_mean((pg_loss2 > pg_loss1).to(ratio.dtype), mask)
        approx_kl = masked_mean((ratio - 1) - logratio, mask)  # CleanRL's k3 estimator
        ratio_mean = masked_mean(ratio, mask)
        tis_weight_mean = masked_mean(tis_weight, mask)
        tis_clipped_frac = masked_mean(tis_clipped.to(ratio.dtype), mask)
    return PolicyLossOutput(
        loss=loss,
        clipfrac=clipfrac,
        approx_kl=approx_kl,
        ratio_mean=ratio_mean,
        tis_weight_mean=tis_weight_mean,
        tis_clipped_frac=tis_clipped_frac,
    )


def aggregate(x: Tensor, mask: Tensor, loss_agg: LossAgg, denominator: float | None = None) -> Tensor:
    """Reduce (B, T) per-token values (the policy loss, a KL penalty) to a scalar as `loss_agg` says (see
    `policy_loss`); positions outside `mask` are selected out first, so nothing there can leak in.
    `denominator` replaces the token (or sequence) count: the count over the whole global batch when it
    is split into micro-batches or ranks."""
    m = mask.bool()
    x = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if loss_agg == "token-mean":
        count = m.sum().clamp(min=1).to(x.dtype)
        return x.sum() / (count if denominator is None else denominator)
    tokens_per_seq = m.sum(dim=-1)
    if loss_agg == "seq-mean-token-mean":
        per_seq = x.sum(dim=-1) / tokens_per_seq.clamp(min=1).to(x.dtype)
    elif loss_agg == "seq-mean-token-sum":
        per_seq = x.sum(dim=-1)
    else:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; expected one of {LossAgg.__args__}")
    # An empty sequence has per_seq == 0 and is not counted.
    seqs = (tokens_per_seq > 0).sum().clamp(min=1).to(x.dtype)
    return per_seq.sum() / (seqs if denominator is None else denominator)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman, "Approximating
    KL Divergence", 2020). Mask and average with `masked_mean`.

    - k1 = log r'          with log r' = logprobs - ref_logprobs: unbiased, high variance, can be < 0.
    - k2 = 0.5 (log r')^2: biased, low variance, >= 0.
    - k3 = exp(-log r') + log r' - 1: unbiased and >= 0 (e^x >= 1 + x); the PRM mode of OpenClaw-RL's
      GUI-RL uses k3 with coefficient 0.01. Clamped as verl's `low_var_kl` does (log ratio to +-20,
      value to +-10), because exp of a large gap between two bf16 policies overflows.
    """
    log_r = logprobs - ref_logprobs.detach()
    if kind == "k1":
        return log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    if kind == "k3":
        x = (-log_r).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # log(pi_ref / pi_theta)
        return (torch.exp(x) - x - 1).clamp(-_K3_CLAMP, _K3_CLAMP)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KLKind.__args__}")


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = None) -> Tensor:
    """Per-position entropy of softmax(logits) over the last dim, in float32.

    H = logsumexp(z) - sum(softmax(z) * z) (verl's `entropy_from_logits`), with z shifted by its max
    first: H is shift-invariant, and two float32 terms near a large logit would otherwise cancel to an
    error of ~1e-4 (the last bits of each depend on the CPU's vector kernels). `chunk_size`
    bounds the float32 upcast to that many positions at a time, for bf16 logits with a 150k
    vocabulary.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    step = flat.shape[0] if chunk_size is None else chunk_size
    if step <= 0 and flat.shape[0] > 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    parts = []
    for start in range(0, flat.shape[0], max(step, 1)):
        z = flat[start : start + step].float()
        z = z - z.amax(dim=-1, keepdim=True)
        parts.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])
