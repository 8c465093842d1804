"""The tiny Qwen3-VL checkpoint: it loads offline, is deterministic per seed, and tokenizes and templates as
Qwen3-VL does. (Integration, not unit: building one takes about a second after importing transformers.)"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

from pathlib import Path

import pytest

from guirl.cli import main as cli_main
from guirl.model.tiny import count_parameters, ensure_tiny_checkpoint, write_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "seed0", seed=0)


def test_loads_back_offline(ckpt: Path) -> None:
    from transformers import (
        AutoImageProcessor,
        AutoTokenizer,
        GenerationConfig,
        Qwen3VLForConditionalGeneration,
    )

    model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    processor = AutoImageProcessor.from_pretrained(ckpt, local_files_only=True)
    gen = GenerationConfig.from_pretrained(ckpt, local_files_only=True)
    ids = tokenizer.convert_tokens_to_ids
    assert model.config.image_token_id == ids("<|image_pad|>")
    assert model.config.vision_start_token_id == ids("<|vision_start|>")
    assert model.config.text_config.vocab_size == len(tokenizer)
    assert gen.eos_token_id[0] == ids("<|im_end|>") and gen.pad_token_id == ids("<|endoftext|>")
    assert (processor.patch_size, processor.temporal_patch_size, processor.merge_size) == (16, 2, 2)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(ckpt)


def test_weights_are_deterministic_per_seed(ckpt: Path, tmp_path: Path) -> None:
    again = write_tiny_checkpoint(tmp_path / "again", seed=0)
    other = write_tiny_checkpoint(tmp_path / "other", seed=1)
    weights = (ckpt / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights


def test_special_tokens_stay_whole(ckpt: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    for token in [
        "<|image_pad|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<tool_call>",
        "</think>",
    ]:
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [
            tokenizer.convert_tokens_to_ids(token)
        ]
    text = 'Action: click\n<tool_call>{"name": "computer_use"}</tool_call><|im_end|>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    # <tool_call> is text the policy writes, not a control token: it survives skip_special_tokens
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.removesuffix("<|im_end|>")
    assert len(tokenizer("é", add_special_tokens=False)["input_ids"]) == 2  # byte level, no merges


def test_chat_template_has_qwen3_vl_shape(ckpt: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    conversation = [
        {"role": "system", "content": [{"type": "text", "text": "You are a GUI agent."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click OK."}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Action: click\n<tool_call>{}</tool_call>"}],
        },
        {"role": "user", "content": [{"type": "text", "text": "Next: "}, {"type": "image"}]},
    ]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a GUI agent.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Click OK.<|im_end|>\n"
        "<|im_start|>assistant\nAction: click\n<tool_call>{}</tool_call><|im_end|>\n"
        "<|im_start|>user\nNext: <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_ensure_builds_once(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "tiny-qwen3vl"
    first = ensure_tiny_checkpoint(target)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_checkpoint(target) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in target.parent.iterdir()) == ["tiny-qwen3vl"]  # no temporary left behind
    with pytest.raises(ValueError, match="seed"):
        ensure_tiny_checkpoint(target, seed=7)


def test_cli_writes_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert cli_main(["model", "tiny", str(out), "--seed", "3", "--hidden", "64", "--layers", "1"]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and f"{count_parameters(out):,} parameters" in printed
    assert (out / "config.json").exists() and (out / "chat_template.jinja").exists()


def test_thinking_template_opens_a_think_block_and_drops_past_reasoning(tmp_path: Path) -> None:
    """`thinking=True`: Qwen3-VL-Thinking's shape. The generation prompt opens `<think>`; an assistant turn
    before the last user query keeps only what follows its last `</think>` (leading newlines dropped), one
    after it keeps its reasoning in a `<think>` block; the system turn and tools block are the Instruct
    template's, byte for byte."""
    import json

    from transformers import AutoTokenizer

    thinking = AutoTokenizer.from_pretrained(
        write_tiny_checkpoint(tmp_path / "thinking", thinking=True), local_files_only=True
    )
    instruct = AutoTokenizer.from_pretrained(
        write_tiny_checkpoint(tmp_path / "instruct"), local_files_only=True
    )

    def text(part: str) -> list[dict]:
        return [{"type": "text", "text": part}]

    conversation = [
        {"role": "system", "content": text("You are a GUI agent.")},
        {"role": "user", "content": [{"type": "image"}]},
        {
            "role": "assistant",
            "content": text("first idea\n</think>\nsecond\n</think>\n\nAction: click<|im_end|>"),
        },
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Next?"}]},
        {"role": "assistant", "content": text("<think>\nplan\n</think>\n\nAction: type")},
        {"role": "tool", "content": text("ok")},
        {"role": "assistant", "content": text("no reasoning here")},
    ]
    tools = [{"type": "function", "function": {"name": "computer_use", "description": "Use a mouse."}}]
    got = thinking.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
    system = instruct.apply_chat_template(conversation[:1], tools=tools, tokenize=False)
    assert system.count("<|im_start|>") == 1 and got.startswith(system)
    assert "\n<tools>\n" + json.dumps(tools[0]) + "\n</tools>\n" in system
    assert got[len(system) :] == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\nAction: click<|im_end|><|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Next?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nplan\n</think>\n\nAction: type<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nno reasoning here<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    plain = [{"role": "user", "content": "hi"}]
    assert thinking.apply_chat_template(plain, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert instruct.apply_chat_template(plain, add_generation_prompt=True, tokenize=False).endswith(
        "<|im_start|>assistant\n"
    )


def test_the_thinking_variant_is_its_own_cache_entry(tmp_path: Path) -> None:
    """Only the template differs (same weights and vocabulary), the default checkpoint does not record the
    knob at all (its bytes are as before), and a cache directory holds one variant."""
    import json

    target = tmp_path / "tiny-thinking"
    ckpt = ensure_tiny_checkpoint(target, thinking=True)
    assert json.loads((ckpt / "guirl_tiny.json").read_text())["thinking"] is True
    assert "<think>" in (ckpt / "chat_template.jinja").read_text()
    plain = write_tiny_checkpoint(tmp_path / "plain")
    assert "thinking" not in json.loads((plain / "guirl_tiny.json").read_text())
    assert (plain / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    assert (plain / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match="Thinking chat template"):
        ensure_tiny_checkpoint(target)
    with pytest.raises(ValueError, match="Instruct chat template"):
        ensure_tiny_checkpoint(plain, thinking=True)
