"""SFT is the learner's own update with advantage 1: its gradient is exactly the token-mean NLL's."""

from __future__ import annotations

import copy

import torch

from guirl.agent.prompt import PromptConfig
from guirl.data.synth import synthesize
from guirl.inference.chat import ChatRenderer
from guirl.learner.logprobs import token_logprobs
from guirl.learner.samples import collate
from guirl.learner.step import train_step
from guirl.sft import sft_samples
from tests.helpers import shared_tiny


def test_the_sft_step_is_a_token_mean_nll_step(tmp_path_factory, tmp_path):
    from transformers import Qwen3VLForConditionalGeneration

    ckpt = shared_tiny(tmp_path_factory)
    renderer = ChatRenderer.load(ckpt)
    rows = list(synthesize(3, seed=4, split="train", sizes=((320, 240),)))
    samples = sft_samples(rows, renderer, PromptConfig(max_pixels=160 * 160, min_pixels=32 * 32))
    assert len(samples) == 3 and all(s.advantage == 1.0 for s in samples)
    end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(s.response_ids[-1] == end for s in samples)
    text = renderer.tokenizer.decode(samples[0].response_ids[:-1])
    assert text.startswith("<think>") and "<answer>[{'action': " in text

    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, torch_dtype=torch.float32)
    reference = copy.deepcopy(model)
    # the same update by hand: one SGD step (lr 1) on the token-mean NLL of the responses
    batch = collate(samples, renderer, renderer.tokenizer.pad_token_id)
    reference.train()
    logprobs = token_logprobs(reference, batch)
    nll = -(logprobs * batch.response_mask).sum() / batch.response_mask.sum()
    nll.backward()
    nll = nll.detach()
    expected = {n: p.detach() - p.grad for n, p in reference.named_parameters() if p.grad is not None}

    metrics = train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        samples,
        renderer,
        eps_clip=0.2,
        eps_clip_high=0.28,
        tis_cap=0.0,
        loss_agg="token-mean",
        max_tokens=1 << 20,
        max_grad_norm=1e9,
    )
    assert abs(metrics["nll"] - nll.item()) < 1e-5
    params = dict(model.named_parameters())
    assert expected and all(torch.allclose(params[n], w, atol=1e-6, rtol=1e-5) for n, w in expected.items())
