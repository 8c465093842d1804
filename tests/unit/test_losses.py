"""Policy loss, KL estimators, entropy and masking against numbers (and gradients) worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from guirl.learner.losses import aggregate, entropy_from_logits, kl_penalty, masked_mean, policy_loss

F64 = torch.float64

# Two sequences, T = 3; sequence 1's last position is padding.
#   seq 0: advantage +1, ratio = pi_theta / pi_proximal = 1.25, 1.5, 0.5
#   seq 1: advantage -1, ratio = 0.7, 1.1, (pad)
# eps_clip = 0.2, eps_clip_high = 0.28 (DAPO): clip range [0.8, 1.28].
#   pg_loss1 = -A * ratio, pg_loss2 = -A * clamp(ratio, 0.8, 1.28), pg = max(pg_loss1, pg_loss2)
#   seq 0, r 1.25: pg1 -1.25, pg2 -1.25  -> -1.25  unclipped (would clip at a symmetric 1.2)
#   seq 0, r 1.5 : pg1 -1.5,  pg2 -1.28  -> -1.28  CLIPPED, gradient 0
#   seq 0, r 0.5 : pg1 -0.5,  pg2 -0.8   -> -0.5   unclipped (the pessimistic max keeps the ratio)
#   seq 1, r 0.7 : pg1  0.7,  pg2  0.8   ->  0.8   CLIPPED, gradient 0
#   seq 1, r 1.1 : pg1  1.1,  pg2  1.1   ->  1.1   unclipped
# d pg / d logprob on an unclipped token = -A * ratio: -1.25, 0, -0.5 | 0, 1.1
RATIOS = [[1.25, 1.5, 0.5], [0.7, 1.1, 1.0]]
OLD = [[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]]
ADV = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
PAD = (1, 2)
TOKEN_GRAD = [[-1.25, 0.0, -0.5], [0.0, 1.1, 0.0]]


def assert_values(actual: torch.Tensor, expected: list, atol: float = 1e-7) -> None:
    torch.testing.assert_close(
        actual.detach().double(), torch.tensor(expected, dtype=F64), atol=atol, rtol=1e-7
    )


def make_batch(pad_value: float = 0.0) -> dict[str, torch.Tensor]:
    old = torch.tensor(OLD, dtype=F64)
    logprobs = old + torch.tensor(RATIOS, dtype=F64).log()
    adv = torch.tensor(ADV, dtype=F64)
    mask = torch.tensor(MASK, dtype=torch.bool)
    logprobs[PAD] = pad_value
    old[PAD] = -pad_value
    adv[PAD] = pad_value
    return {
        "logprobs": logprobs.requires_grad_(True),
        "old_logprobs": old,
        "advantages": adv,
        "response_mask": mask,
    }


def loss_and_grad(batch: dict[str, torch.Tensor], **kwargs):
    out = policy_loss(**batch, **kwargs)
    out.loss.backward()
    return out, batch["logprobs"].grad


# --- aggregation modes ------------------------------------------------------------------------------


def test_token_mean_value_and_gradient() -> None:
    out, grad = loss_and_grad(make_batch(), eps_clip=0.2, eps_clip_high=0.28)
    # (-1.25 - 1.28 - 0.5 + 0.8 + 1.1) / 5 = -1.13 / 5 = -0.226
    assert out.loss.item() == pytest.approx(-0.226)
    # each unclipped token's -A * ratio over 5 tokens: -0.25, 0, -0.1 | 0, 0.22, 0 (pad)
    assert_values(grad, [[-0.25, 0.0, -0.1], [0.0, 0.22, 0.0]])
    assert_values(grad, [[g / 5 for g in row] for row in TOKEN_GRAD])


def test_seq_mean_token_mean_value_and_gradient() -> None:
    out, grad = loss_and_grad(make_batch(), eps_clip=0.2, eps_clip_high=0.28, loss_agg="seq-mean-token-mean")
    # seq 0 mean -3.03 / 3 = -1.01; seq 1 mean 1.9 / 2 = 0.95; (-1.01 + 0.95) / 2 = -0.03
    assert out.loss.item() == pytest.approx(-0.03)
    # seq 0 tokens / (3 * 2), seq 1 tokens / (2 * 2): -1.25/6, 0, -0.5/6 | 0, 1.1/4, 0
    assert_values(grad, [[-1.25 / 6, 0.0, -0.5 / 6], [0.0, 0.275, 0.0]])


def test_seq_mean_token_sum_value_and_gradient() -> None:
    out, grad = loss_and_grad(make_batch(), eps_clip=0.2, eps_clip_high=0.28, loss_agg="seq-mean-token-sum")
    # (-3.03 + 1.9) / 2 = -0.565
    assert out.loss.item() == pytest.approx(-0.565)
    assert_values(grad, [[-0.625, 0.0, -0.25], [0.0, 0.55, 0.0]])


def test_loss_denominator_replaces_the_count() -> None:
    # A micro-batch of a global batch of 10 tokens: -1.13 / 10.
    out, grad = loss_and_grad(make_batch(), eps_clip=0.2, eps_clip_high=0.28, loss_denominator=10)
    assert out.loss.item() == pytest.approx(-0.113)
    assert_values(grad, [[g / 10 for g in row] for row in TOKEN_GRAD])


def test_unknown_aggregation_is_refused() -> None:
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(**make_batch(), loss_agg="sum")  # type: ignore[arg-type]


# --- clipping and metrics ---------------------------------------------------------------------------


def test_metrics_asymmetric_clip() -> None:
    out, _ = loss_and_grad(make_batch(), eps_clip=0.2, eps_clip_high=0.28)
    assert out.clipfrac.item() == pytest.approx(2 / 5)  # r 1.5 (A > 0) and r 0.7 (A < 0)
    assert out.ratio_mean.item() == pytest.approx(5.05 / 5)  # (1.25 + 1.5 + 0.5 + 0.7 + 1.1) / 5
    # (r - 1) - log r:  1.25: 0.25 - 0.2231436 = 0.0268564   1.5: 0.5 - 0.4054651 = 0.0945349
    #   0.5: -0.5 + 0.6931472 = 0.1931472   0.7: -0.3 + 0.3566749 = 0.0566749
    #   1.1: 0.1 - 0.0953102 = 0.0046898    sum 0.3759032 / 5 = 0.0751806
    assert out.approx_kl.item() == pytest.approx(0.0751806, abs=1e-7)
    assert out.tis_weight_mean.item() == 1.0
    assert out.tis_clipped_frac.item() == 0.0
    assert not out.clipfrac.requires_grad and not out.approx_kl.requires_grad


def test_symmetric_clip_when_high_is_not_given() -> None:
    out, grad = loss_and_grad(make_batch(), eps_clip=0.2)
    # Range [0.8, 1.2]: now r 1.25 with A > 0 clips too: pg -1.2.
    # (-1.2 - 1.2 - 0.5 + 0.8 + 1.1) / 5 = -1.0 / 5 = -0.2
    assert out.loss.item() == pytest.approx(-0.2)
    assert out.clipfrac.item() == pytest.approx(3 / 5)
    assert_values(grad, [[0.0, 0.0, -0.1], [0.0, 0.22, 0.0]])


def test_low_side_clip_for_negative_advantage_and_high_side_for_positive() -> None:
    # One token each: A > 0 with r 0.5 is NOT clipped (gradient -0.5); A < 0 with r 0.5 IS clipped (pg 0.8).
    lp = torch.tensor([[math.log(0.5), math.log(0.5)]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=F64)
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    out = policy_loss(lp, old, adv, torch.ones(1, 2, dtype=torch.bool), eps_clip=0.2, eps_clip_high=0.28)
    out.loss.backward()
    assert out.loss.item() == pytest.approx((-0.5 + 0.8) / 2)
    assert_values(lp.grad, [[-0.25, 0.0]])
    assert out.clipfrac.item() == pytest.approx(0.5)


def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage() -> None:
    # Proximal == current: ratio 1, approx_kl 0, loss -mean(A), d loss / d lp = -A / n.
    lp = torch.tensor([[-0.7, -1.3]], dtype=F64, requires_grad=True)
    out = policy_loss(lp, lp.detach().clone(), torch.tensor([[2.0, -1.0]], dtype=F64), torch.ones(1, 2))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.5)
    assert_values(lp.grad, [[-1.0, 0.5]])
    assert out.approx_kl.item() == 0.0
    assert out.clipfrac.item() == 0.0


# --- truncated importance sampling ------------------------------------------------------------------

# w = exp(old - behaviour) = 2.0, 0.5, 1.0 | 1.0, 3.0, (pad); cap 2.5 truncates 3.0 to 2.5.
#   weighted pg: -1.25*2 = -2.5, -1.28*0.5 = -0.64, -0.5*1 = -0.5 | 0.8*1 = 0.8, 1.1*2.5 = 2.75
#   token-mean (-2.5 - 0.64 - 0.5 + 0.8 + 2.75) / 5 = -0.09 / 5 = -0.018
#   gradient -A * r * w / 5: -1.25*2/5 = -0.5, 0, -0.5/5 = -0.1 | 0, 1.1*2.5/5 = 0.55
W = [[2.0, 0.5, 1.0], [1.0, 3.0, 1.0]]


def with_behaviour(batch: dict[str, torch.Tensor], pad_value: float = 0.0) -> dict[str, torch.Tensor]:
    behaviour = (batch["old_logprobs"] - torch.tensor(W, dtype=F64).log()).requires_grad_(False)
    behaviour[PAD] = pad_value
    return {**batch, "behaviour_logprobs": behaviour}


def test_tis_weights_with_cap() -> None:
    batch = with_behaviour(make_batch())
    batch["old_logprobs"].requires_grad_(True)  # the weight must be detached from it
    out, grad = loss_and_grad(batch, eps_clip=0.2, eps_clip_high=0.28, tis_cap=2.5)
    assert out.loss.item() == pytest.approx(-0.018)
    assert_values(grad, [[-0.5, 0.0, -0.1], [0.0, 0.55, 0.0]])
    assert out.tis_weight_mean.item() == pytest.approx(7.0 / 5)  # (2 + 0.5 + 1 + 1 + 2.5) / 5
    assert out.tis_clipped_frac.item() == pytest.approx(1 / 5)
    assert batch["old_logprobs"].grad is None


def test_tis_weights_without_cap() -> None:
    out, grad = loss_and_grad(with_behaviour(make_batch()), eps_clip=0.2, eps_clip_high=0.28)
    # 1.1 * 3 = 3.3 replaces 2.75: (-3.64 + 0.8 + 3.3) / 5 = 0.46 / 5 = 0.092
    assert out.loss.item() == pytest.approx(0.092)
    assert grad[1, 1].item() == pytest.approx(1.1 * 3 / 5)
    assert out.tis_weight_mean.item() == pytest.approx(7.5 / 5)
    assert out.tis_clipped_frac.item() == 0.0


def test_tis_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tis_cap"):
        policy_loss(**with_behaviour(make_batch()), tis_cap=0.0)


# --- padding ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("pad_value", [1e30, float("inf"), float("nan")])
def test_padding_changes_nothing(loss_agg: str, pad_value: float) -> None:
    kwargs = {"eps_clip": 0.2, "eps_clip_high": 0.28, "tis_cap": 2.5, "loss_agg": loss_agg}
    clean, clean_grad = loss_and_grad(with_behaviour(make_batch()), **kwargs)
    dirty, dirty_grad = loss_and_grad(with_behaviour(make_batch(pad_value), pad_value), **kwargs)
    for field in ("loss", "clipfrac", "approx_kl", "ratio_mean", "tis_weight_mean", "tis_clipped_frac"):
        assert getattr(dirty, field).item() == getattr(clean, field).item(), field
    assert torch.equal(dirty_grad, clean_grad)
    assert dirty_grad[PAD].item() == 0.0


def test_fully_masked_batch_gives_zero_loss_and_gradient() -> None:
    batch = make_batch()
    batch["response_mask"] = torch.zeros(2, 3, dtype=torch.bool)
    out, grad = loss_and_grad(batch)
    assert out.loss.item() == 0.0
    assert torch.count_nonzero(grad) == 0


def test_shape_mismatch_is_refused() -> None:
    batch = make_batch()
    batch["advantages"] = batch["advantages"][:, :2]
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(**batch)


# --- masked_mean ------------------------------------------------------------------------------------


def test_masked_mean_all_and_per_row() -> None:
    x = torch.tensor([[1.0, 2.0, 1e30], [4.0, float("inf"), float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.5, 4.0])
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


# --- KL estimators ----------------------------------------------------------------------------------

# logprobs -1.0, -2.0, -0.5; ref -1.5, -1.0, -0.5; log r' = lp - ref = 0.5, -1.0, 0.0
#   k1 = log r'                      0.5, -1.0, 0
#   k2 = 0.5 (log r')^2              0.125, 0.5, 0
#   k3 = e^x - x - 1, x = ref - lp = -0.5, 1.0, 0:
#        0.6065307 + 0.5 - 1 = 0.1065307;  2.7182818 - 1 - 1 = 0.7182818;  0
#   d k3 / d lp = 1 - e^x            1 - 0.6065307 = 0.3934693;  1 - 2.7182818 = -1.7182818;  0
KL_LP = [-1.0, -2.0, -0.5]
KL_REF = [-1.5, -1.0, -0.5]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("k1", [0.5, -1.0, 0.0]), ("k2", [0.125, 0.5, 0.0]), ("k3", [0.1065307, 0.7182818, 0.0])],
)
def test_kl_values(kind: str, expected: list[float]) -> None:
    kl = kl_penalty(torch.tensor(KL_LP, dtype=F64), torch.tensor(KL_REF, dtype=F64), kind)  # type: ignore[arg-type]
    assert kl.tolist() == pytest.approx(expected, abs=1e-7)


def test_k3_gradient() -> None:
    lp = torch.tensor(KL_LP, dtype=F64, requires_grad=True)
    kl_penalty(lp, torch.tensor(KL_REF, dtype=F64), "k3").sum().backward()
    assert lp.grad.tolist() == pytest.approx([0.3934693, -1.7182818, 0.0], abs=1e-7)


def test_k3_is_non_negative_and_clamped() -> None:
    gen = torch.Generator().manual_seed(0)
    lp = torch.randn(1000, generator=gen) * 3
    ref = torch.randn(1000, generator=gen) * 3
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    # ref - lp = 100 -> clamped to 20 -> e^20 - 21 ~ 4.85e8 -> clamped to 10
    assert kl_penalty(torch.tensor([-100.0]), torch.tensor([0.0]), "k3").item() == 10.0


def test_kl_masked_mean_ignores_padding() -> None:
    lp = torch.tensor([KL_LP + [1e30]], dtype=F64)
    ref = torch.tensor([KL_REF + [-1e30]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]])
    for kind in ("k1", "k2", "k3"):
        padded = masked_mean(kl_penalty(lp, ref, kind), mask)  # type: ignore[arg-type]
        unpadded = kl_penalty(lp[:, :3], ref[:, :3], kind).mean()  # type: ignore[arg-type]
        assert padded.item() == pytest.approx(unpadded.item()), kind


@pytest.mark.parametrize(
    ("loss_agg", "expected", "grad"),
    [
        # seq 0: 1 + 2 + 3 = 6 over 3 tokens; seq 1: 4 over 1 token (inf and nan are padding)
        ("token-mean", 10 / 4, [[1 / 4, 1 / 4, 1 / 4], [1 / 4, 0, 0]]),
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2, [[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0, 0]]),
        ("seq-mean-token-sum", (6 + 4) / 2, [[1 / 2, 1 / 2, 1 / 2], [1 / 2, 0, 0]]),
    ],
)
def test_aggregate_by_hand_ignores_padding(loss_agg: str, expected: float, grad: list[list[float]]) -> None:
    """The one aggregation of per-token values, for the policy loss and the KL penalty alike (a KL value
    at a padded position is anything: it must not reach the loss or a gradient)."""
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, math.inf, math.nan]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    out = aggregate(x, mask, loss_agg)  # type: ignore[arg-type]
    out.backward()
    assert out.item() == pytest.approx(expected)
    assert x.grad is not None and torch.allclose(x.grad, torch.tensor(grad, dtype=F64))
    # a denominator (the global batch's count) replaces the count
    count = 4 if loss_agg == "token-mean" else 2
    with_denominator = aggregate(x.detach(), mask, loss_agg, 8.0)  # type: ignore[arg-type]
    assert with_denominator.item() == pytest.approx(expected * count / 8)


def test_unknown_kl_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="KL"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]


# --- entropy ----------------------------------------------------------------------------------------


def test_entropy_by_hand() -> None:
    # Uniform over 4: log 4 = 1.3862944. One-hot-ish (logit 1e4 on one entry): 0.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [1e4, 0.0, 0.0, 0.0]]])
    assert_values(entropy_from_logits(logits), [[1.3862944, 0.0]])


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 100])
def test_entropy_matches_direct_computation(chunk_size: int | None) -> None:
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1)) * 4 + 1000  # large offset
    direct = -(torch.softmax(logits.double(), -1) * torch.log_softmax(logits.double(), -1)).sum(-1)
    got = entropy_from_logits(logits, chunk_size=chunk_size)
    assert got.shape == (2, 5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), direct, atol=1e-4, rtol=1e-5)


def test_entropy_upcasts_bf16() -> None:
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    direct = -(torch.softmax(logits.float(), -1) * torch.log_softmax(logits.float(), -1)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits), direct)
