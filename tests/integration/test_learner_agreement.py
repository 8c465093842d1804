"""The learner against the `hf` engine on the tiny Qwen3-VL: the learner's recomputed log-probs equal the
engine's behaviour log-probs (same weights, fp32 CPU) to 1e-4 per token, a wrong template, image token or
position is caught, and one update moves a response's log-prob the way its advantage says, all the way to
the engine after a weight reload."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3VLForConditionalGeneration

from guirl.inference.base import GenRequest, GenResult
from guirl.inference.chat import ChatRenderer
from guirl.inference.hf import HFEngine
from guirl.learner.advantages import grpo_advantages
from guirl.learner.logprobs import token_logprobs
from guirl.learner.samples import Batch, TrainSample, collate, samples_from_trajectory
from guirl.learner.step import train_step
from guirl.messages.blob import Blob
from guirl.messages.types import (
    ChatMessage,
    Image,
    ImagePart,
    SamplingParams,
    StepSample,
    Tensor,
    TextPart,
    Trajectory,
)
from guirl.messages.weights import WeightsFromDisk
from tests.helpers import run, sharp_tiny_checkpoint
from tests.integration.test_hf_engine import png

TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
HOT = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
WARM = SamplingParams(temperature=0.7, max_new_tokens=12, seed=5)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with its LM head scaled by 20 (`sharp_tiny_checkpoint`): fp32 rounding at realistic
    magnitudes, and a scorer cannot pass by flatness."""
    return sharp_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def renderer(ckpt: Path) -> ChatRenderer:
    return ChatRenderer.load(ckpt)


def load_model(ckpt: Path) -> torch.nn.Module:
    return Qwen3VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()


def request(parts: list[TextPart | ImagePart], images: list[bytes], sampling: SamplingParams) -> GenRequest:
    messages = [
        ChatMessage(role="system", parts=[TextPart("You are a GUI agent.")]),
        ChatMessage(role="user", parts=parts),
    ]
    return GenRequest(messages=messages, images=images, sampling=sampling)


def prompt_images(req: GenRequest) -> list[bytes]:
    """The request's images in the order the prompt shows them (the order of its image-pad runs)."""
    return [req.images[p.index] for m in req.messages for p in m.parts if isinstance(p, ImagePart)]


def trajectory(episode: str, req: GenRequest, res: GenResult, reward: float, group: str = "g") -> Trajectory:
    """A one-step episode as an env worker delivers it (the screenshot once, referenced by the step)."""
    assert res.prompt_ids is not None and res.response_ids is not None and res.logprobs is not None
    screens = [Image(data=Blob(b)) for b in prompt_images(req)]
    step = StepSample(
        step=0,
        prompt_ids=Tensor.from_list(res.prompt_ids, "int32"),
        response_ids=Tensor.from_list(res.response_ids, "int32"),
        logprobs=Tensor.from_list(res.logprobs, "float32"),
        policy_version=res.policy_version,
        image_refs=list(range(len(screens))),
    )
    return Trajectory(
        episode_id=episode,
        task_id="t",
        group_id=group,
        sample_index=0,
        status="completed",
        reward=reward,
        steps=[step],
        screens=screens,
    )


def generate(ckpt: Path, reqs: list[GenRequest]) -> list[GenResult]:
    async def scenario() -> list[GenResult]:
        engine = HFEngine("hf-agree", ckpt)
        await engine.start()
        try:
            return await engine.generate(reqs)
        finally:
            await engine.close()

    return run(scenario())


def row_diffs(recomputed: torch.Tensor, batch: Batch) -> list[float]:
    """Largest |recomputed - behaviour| over each row's response tokens."""
    diff = (recomputed - batch.behaviour_logprobs).abs()
    return [float(diff[i][batch.response_mask[i]].max()) for i in range(diff.shape[0])]


# -- training-inference agreement ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_samples(ckpt: Path) -> tuple[list[TrainSample], list[float]]:
    """Fresh samples from one engine batch, with the temperature each was drawn at (greedy rows are
    scored at 1: the engine reports raw log-probs for them)."""
    reqs = [
        # greedy: 0, 1 and 2 images of different sizes (the second shown first), different prompt lengths
        request([TextPart("Open the file menu and pick Save. " * 2)], [], GREEDY),
        request([ImagePart(0), TextPart("Click OK.")], [png(64, 48)], GREEDY),
        request(
            [TextPart("Before: "), ImagePart(1), TextPart(" after: "), ImagePart(0)],
            [png(96, 64, 2), png(200, 120, 3)],
            GREEDY,
        ),
        # sampled at temperature 1.0 and 0.7: each its own left-padded sub-batch in the engine
        request([ImagePart(0), TextPart("Scroll down.")], [png(320, 180, 4)], HOT),
        request([TextPart("Type hello.")], [], HOT),
        request([ImagePart(0), TextPart("Close the dialog, then save.")], [png(128, 96, 5)], WARM),
        request([TextPart("Press enter.")], [], WARM),
    ]
    results = generate(ckpt, reqs)
    samples = [
        s
        for i, (req, res) in enumerate(zip(reqs, results))
        for s in samples_from_trajectory(trajectory(f"ep{i}", req, res, 1.0), advantage=1.0 - 0.5 * i)
    ]
    return samples, [r.sampling.temperature or 1.0 for r in reqs]


def test_learner_logprobs_equal_engine_behaviour_logprobs(
    ckpt: Path, renderer: ChatRenderer, engine_samples: tuple[list[TrainSample], list[float]]
) -> None:
    samples, temps = engine_samples
    assert len({s.n_tokens for s in samples}) == len(samples)  # every row padded differently
    assert {len(s.images) for s in samples} == {0, 1, 2}
    batch = collate(samples, renderer, renderer.tokenizer.pad_token_id)

    model = load_model(ckpt)  # fresh: same weights as the engine, no state shared with it
    diffs = row_diffs(score(model, batch, temps), batch)
    print(f"max |learner - engine| per row: {[f'{d:.2e}' for d in diffs]}")
    assert max(diffs) < TOL, diffs
    # not agreement by flatness: the log-probs spread widely, and each row is scored as itself
    behaviour = batch.behaviour_logprobs[batch.response_mask]
    assert float(behaviour.min()) < -1.0 and float(behaviour.max()) > -0.5
    # the temperature matters: scoring the 0.7 rows at 1.0 is far off
    assert min(row_diffs(score(model, batch, [1.0] * len(temps)), batch)[5:]) > 1e-2

    # -- each kind of mismatch is caught, loudly ------------------------------------------------------
    # Positions: without the image-token types the model gives the image tokens 1-D text positions (and
    # the text after an image other positions): the image rows' log-probs move far beyond the tolerance.
    flat_types = dataclasses.replace(batch, mm_token_type_ids=torch.zeros_like(batch.mm_token_type_ids))
    wrong = row_diffs(score(model, flat_types, temps), batch)
    image_rows = [i for i, s in enumerate(samples) if s.images]
    print(f"zeroed mm_token_type_ids: max |diff| per row {[f'{d:.2f}' for d in wrong]}")
    assert min(wrong[i] for i in image_rows) > 1e-2, wrong
    # ... and without them at all, the model refuses (transformers 5 requires them with images).
    inputs = batch.model_inputs()
    del inputs["mm_token_type_ids"]
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        model(**inputs)

    # Image tokens: one image-pad token of a prompt replaced by a text token is refused by name.
    s = samples[1]
    k = s.prompt_ids.index(renderer.image_token_id)
    broken = dataclasses.replace(s, prompt_ids=s.prompt_ids[:k] + [0] + s.prompt_ids[k + 1 :])
    with pytest.raises(ValueError, match=r"episode 'ep1' step 0: image 0: prompt_ids hold"):
        collate([samples[0], broken], renderer, renderer.tokenizer.pad_token_id)

    # Template: the prompt re-rendered without the generation prompt's trailing newline (an off-by-one
    # template) scores the same response very differently.
    off = [dataclasses.replace(x, prompt_ids=x.prompt_ids[:-1]) for x in samples[:3]]
    off_batch = collate(off, renderer, renderer.tokenizer.pad_token_id)
    with torch.no_grad():
        assert min(row_diffs(token_logprobs(model, off_batch), off_batch)) > 1e-2


def test_the_older_transformers_path_scores_the_same(
    ckpt: Path, renderer: ChatRenderer, engine_samples: tuple[list[TrainSample], list[float]], monkeypatch
) -> None:
    """Where transformers takes no boolean `logits_to_keep` (before 5.2x: a GPU box's), the log-probs come
    from the logits at the union of the rows' response positions: the same values, row by row."""
    import guirl.learner.logprobs as lp

    batch = collate(engine_samples[0], renderer, renderer.tokenizer.pad_token_id)
    model = load_model(ckpt)
    with torch.no_grad():
        monkeypatch.setattr(lp, "_BOOLEAN_KEEP", True)
        masked = lp.token_logprobs(model, batch)
        monkeypatch.setattr(lp, "_BOOLEAN_KEEP", False)
        indexed = lp.token_logprobs(model, batch)
    assert lp._takes_boolean_keep()  # this machine's transformers has the newer path
    assert torch.allclose(masked, indexed, atol=1e-5) and masked[batch.response_mask].abs().sum() > 0


def score(model: torch.nn.Module, batch: Batch, temps: list[float]) -> torch.Tensor:
    """The learner's log-probs, each row at its own sampling temperature."""
    out = torch.zeros_like(batch.behaviour_logprobs)
    with torch.no_grad():
        for t in sorted(set(temps)):
            rows = torch.tensor([x == t for x in temps])
            out[rows] = token_logprobs(model, batch, temperature=t)[rows]
    return out


# -- one update, all the way to the engine -------------------------------------------------------------


def sequence_logprobs(
    model: torch.nn.Module, samples: list[TrainSample], renderer: ChatRenderer
) -> list[float]:
    batch = collate(samples, renderer, renderer.tokenizer.pad_token_id)
    with torch.no_grad():
        return token_logprobs(model, batch).sum(dim=1).tolist()


def test_update_raises_positive_and_lowers_negative_response_up_to_the_engine(
    ckpt: Path, renderer: ChatRenderer, tmp_path: Path
) -> None:
    good = request([ImagePart(0), TextPart("Click the OK button.")], [png(96, 64, 1)], GREEDY)
    bad = request([TextPart("Open the terminal.")], [], GREEDY)

    async def scenario() -> None:
        engine = HFEngine("hf-update", ckpt)
        await engine.start()
        try:
            [res_good, res_bad] = await engine.generate([good, bad])
            # the evaluator's outcomes (+1 / -1) in one GRPO group -> +-0.707
            trajs = [trajectory("good", good, res_good, 1.0), trajectory("bad", bad, res_bad, -1.0)]
            adv = grpo_advantages(torch.tensor([t.reward for t in trajs]), [t.group_id for t in trajs])
            samples = [
                s for t, a in zip(trajs, adv.advantages.tolist()) for s in samples_from_trajectory(t, a)
            ]
            assert samples[0].advantage > 0 > samples[1].advantage

            model = load_model(ckpt)
            before = sequence_logprobs(model, samples, renderer)
            # The scaled LM head makes the tiny model very sensitive: Adam's first (sign-like) step of 1e-3
            # on every weight overshoots and both log-probs fall; 1e-5 moves each a few nats the right way.
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
            metrics = train_step(
                model,
                optimizer,
                samples,
                renderer,
                eps_clip=0.2,
                eps_clip_high=0.28,
                tis_cap=2.0,
                loss_agg="token-mean",
                max_tokens=10_000,
            )
            assert metrics["optimizer_steps"] == 1 and metrics["skipped_steps"] == 0
            assert metrics["tokens"] == sum(len(s.response_ids) for s in samples)
            # same weights generated and scored: the importance weight is 1, the ratio 1, nothing clipped
            assert metrics["behaviour_abs_diff"] < TOL and metrics["clipfrac"] == 0.0
            after = sequence_logprobs(model, samples, renderer)
            print(f"sequence log-probs before {before} after {after}")
            assert after[0] > before[0] + 0.1 and after[1] < before[1] - 0.1

            # Publish: the learner's state dict as safetensors, reloaded by the engine between batches.
            weights = tmp_path / "v1"
            weights.mkdir()
            save_file(
                {k: v.contiguous() for k, v in model.state_dict().items()}, str(weights / "model.safetensors")
            )
            await engine.update_weights(1, WeightsFromDisk(path=str(weights)))

            # The engine's own scoring path: the positive response was the greedy one, so the engine
            # (token-in, the same prompt ids and images) generates it again and reports its behaviour
            # log-probs, which must have gone up and equal the learner's recompute.
            [again] = await engine.generate(
                [GenRequest(prompt_ids=samples[0].prompt_ids, images=samples[0].images, sampling=GREEDY)]
            )
            assert again.policy_version == 1
            assert again.response_ids == samples[0].response_ids
            assert (
                again.logprobs is not None and sum(again.logprobs) > sum(samples[0].behaviour_logprobs) + 0.1
            )
            assert abs(sum(again.logprobs) - after[0]) < TOL * len(again.logprobs)
            # The engine cannot score a response it would not draw (no scoring API), so for the negative one
            # the engine's loaded model is scored with the learner's code: it holds the new weights exactly.
            served = sequence_logprobs(engine._model, samples, renderer)
            assert served == pytest.approx(after, abs=TOL)
            assert served[1] < sum(samples[1].behaviour_logprobs) - 0.1
        finally:
            await engine.close()

    run(scenario())


# -- micro-batches, mini-batches, stale samples ------------------------------------------------------------

STEP = {"eps_clip": 0.2, "eps_clip_high": 0.28, "tis_cap": 2.0}


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_does_not_change_the_update(
    ckpt: Path, renderer: ChatRenderer, engine_samples: tuple[list[TrainSample], list[float]], loss_agg: str
) -> None:
    samples = engine_samples[0][:5]  # the rows drawn at temperature 1 (greedy or sampled)
    whole, split = load_model(ckpt), load_model(ckpt)
    # SGD: the update is the (clipped) gradient itself, so equal updates mean equal accumulated gradients.
    m_whole = train_step(
        whole,
        torch.optim.SGD(whole.parameters(), lr=1e-3),
        samples,
        renderer,
        loss_agg=loss_agg,
        max_tokens=100_000,
        **STEP,
    )
    m_split = train_step(
        split,
        torch.optim.SGD(split.parameters(), lr=1e-3),
        samples,
        renderer,
        loss_agg=loss_agg,
        max_tokens=1,
        **STEP,
    )
    assert (m_whole["microbatches"], m_split["microbatches"]) == (1, 5)
    # the loss is a sum of terms that nearly cancel (advantages sum to 0): float32 noise is absolute
    assert m_split["loss"] == pytest.approx(m_whole["loss"], abs=1e-5)
    assert m_split["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
    assert m_split["entropy"] == pytest.approx(m_whole["entropy"], rel=1e-5)
    # the updates compared, not the weights (a weight near 1 would hide an update of 1e-5 in its rtol)
    before = load_model(ckpt)
    for (name, a), b, w in zip(whole.named_parameters(), split.parameters(), before.parameters()):
        torch.testing.assert_close(a - w, b - w, atol=1e-6, rtol=1e-4, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(whole.parameters(), before.parameters()))


def test_mini_batches_clip_against_the_proximal_policy_and_stale_samples_are_reweighted(
    ckpt: Path, renderer: ChatRenderer, engine_samples: tuple[list[TrainSample], list[float]]
) -> None:
    samples = engine_samples[0][:5]
    model = load_model(ckpt)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    first = train_step(
        model, optimizer, samples, renderer, loss_agg="token-mean", max_tokens=100_000, minibatches=2, **STEP
    )
    assert (first["optimizer_steps"], first["microbatches"]) == (2, 2)
    # the second mini-batch is scored by weights the first one moved, against the proximal log-probs
    # taken before it: the ratio leaves 1 and the clip engages
    assert first["approx_kl"] > 1e-4 and first["clipfrac"] > 0
    assert first["behaviour_abs_diff"] < TOL  # still the engine's weights at the start of the step
    # The same samples one update later are stale: behaviour != proximal, and the importance weight corrects
    again = train_step(model, optimizer, samples, renderer, loss_agg="token-mean", max_tokens=100_000, **STEP)
    assert again["behaviour_abs_diff"] > 1e-2
    assert again["tis_weight_mean"] != pytest.approx(1.0, abs=1e-3)
    assert again["approx_kl"] < 1e-9 and again["clipfrac"] == 0.0  # one optimizer step: ratio is 1


def test_kl_to_the_reference_is_zero_at_the_start_and_pulls_back_after(
    ckpt: Path, renderer: ChatRenderer, engine_samples: tuple[list[TrainSample], list[float]]
) -> None:
    """The KL term to a frozen reference: zero (and the loss unchanged) while the policy is the reference;
    positive once the policy has moved, and then it adds to the loss."""
    samples = engine_samples[0][:4]
    model, ref, plain = load_model(ckpt), load_model(ckpt), load_model(ckpt)
    common = {"loss_agg": "token-mean", "max_tokens": 100_000, **STEP}
    with_kl = train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        samples,
        renderer,
        ref_model=ref,
        kl_coef=0.5,
        **common,
    )
    without = train_step(plain, torch.optim.SGD(plain.parameters(), lr=1.0), samples, renderer, **common)
    assert with_kl["kl_ref"] == pytest.approx(0.0, abs=1e-7)
    assert with_kl["loss"] == pytest.approx(without["loss"], abs=1e-6)
    moved = train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        samples,
        renderer,
        ref_model=ref,
        kl_coef=0.5,
        **common,
    )
    unpenalised = train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        samples,
        renderer,
        ref_model=ref,
        kl_coef=0.0,
        **common,
    )
    assert moved["kl_ref"] > 1e-6
    assert moved["loss"] == pytest.approx(unpenalised["loss"] + 0.5 * moved["kl_ref"], rel=1e-4, abs=1e-6)
