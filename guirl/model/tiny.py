"""A tiny random Qwen3-VL checkpoint in Hugging Face format, built offline.

It has the real model class, the real chat-template shape, Qwen's special tokens and the Qwen2-VL image
processing (patch 16, temporal 2, merge 2), so every code path that serves or trains Qwen3-VL runs on it
in milliseconds on a CPU. The tokenizer is byte-level BPE, its merges learnt at build time from the
computer-use system prompts (so a prompt costs about as many tokens as with Qwen's real tokenizer, not
one per byte), plus Qwen's special and added tokens. Its chat template has the shape of Qwen3-VL-Instruct's,
or with `thinking=True` of Qwen3-VL-Thinking's (`guirl/model/templates.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from guirl.model.templates import CHAT_TEMPLATE, THINKING_CHAT_TEMPLATE

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
"""Control tokens (special: dropped by `skip_special_tokens`)."""
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
"""Single tokens that are part of the text (kept when decoding, as in Qwen's tokenizer)."""


def _learn_merges(
    vocab_size: int = 1024, extra_corpus: Sequence[str] = ()
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE vocabulary and merges learnt from the agent's system prompts (deterministic: the
    same guirl gives the same tokenizer). Without merges a ~4 KB system prompt costs ~4 k tokens, and
    prefill would swamp everything a benchmark or a test measures. `extra_corpus` adds texts to learn from
    (e.g. GUI-R1 prompts and answers, so that an answer costs ~20 tokens instead of ~70)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from guirl.agent.prompt import system_prompt

    corpus = [system_prompt(1000, 1000, "relative"), system_prompt(1280, 800, "absolute"), *extra_corpus]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(corpus, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return dict(model["vocab"]), merges


def build_tokenizer(*, vocab_size: int = 1024, extra_corpus: Sequence[str] = (), thinking: bool = False):
    """The offline Qwen2 tokenizer: byte-level BPE (see `_learn_merges`), then the special and added
    tokens; its chat template is `THINKING_CHAT_TEMPLATE` with `thinking`, else `CHAT_TEMPLATE`."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _learn_merges(vocab_size, extra_corpus)
    for token in SPECIAL_TOKENS + ADDED_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # Without these the processor machinery cannot find the image token (NOTES: "Offline tokenizer").
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )
    # Registered as added tokens, or "<|im_start|>" would be split into bytes.
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tokenizer.chat_template = THINKING_CHAT_TEMPLATE if thinking else CHAT_TEMPLATE
    return tokenizer


def build_image_processor(*, min_pixels: int = 32 * 32 * 4, max_pixels: int = 512 * 512):
    """Qwen2-VL image processing with Qwen3-VL's geometry (patch 16, temporal 2, merge 2, mean/std 0.5).

    The pixel bounds are smaller than the real model's (65536 .. 16777216) so a 1280x800 screenshot
    stays a few hundred tokens on a CPU."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def tiny_config(
    tokenizer,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 32768,
    vision_depth: int = 2,
    vision_hidden: int = 64,
    vision_heads: int = 2,
    head_dim: int = 32,
    mrope_section: Sequence[int] = (6, 5, 5),
    intermediate: int = 0,
    vision_intermediate: int = 0,
    vision_positions: int = 256,
    deepstack_visual_indexes: Sequence[int] = (0,),
    model_vocab: int = 0,
    tie_word_embeddings: bool = False,
):
    """A Qwen3VLConfig at toy scale whose token ids agree with `tokenizer` (`vision_*`: the vision tower's
    blocks, width and heads).

    The other knobs reach real sizes (bench/gpu_check.py builds a 2B-class one): `mrope_section` must sum
    to `head_dim / 2`; `intermediate` / `vision_intermediate` default (0) to 3x / 2x the width;
    `vision_positions` is the vision tower's learnt position table; `model_vocab` (0: the tokenizer's
    size) pads the embedding to a real vocabulary's rows, the ids past the tokenizer decoding to nothing."""
    from transformers import Qwen3VLConfig

    if 2 * sum(mrope_section) != head_dim:
        raise ValueError(f"mrope_section {list(mrope_section)} must sum to head_dim / 2 = {head_dim // 2}")
    if model_vocab and model_vocab < len(tokenizer):
        raise ValueError(f"model_vocab {model_vocab} is smaller than the tokenizer ({len(tokenizer)} ids)")
    ids = tokenizer.convert_tokens_to_ids
    text_config = {
        "vocab_size": model_vocab or len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": intermediate or hidden * 3,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": list(mrope_section),
            "mrope_interleaved": True,
        },
        "pad_token_id": ids("<|endoftext|>"),
    }
    vision_config = {
        "depth": vision_depth,
        "hidden_size": vision_hidden,
        "intermediate_size": vision_intermediate or vision_hidden * 2,
        "num_heads": vision_heads,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "out_hidden_size": hidden,
        "num_position_embeddings": vision_positions,
        "deepstack_visual_indexes": list(deepstack_visual_indexes),
    }
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=tie_word_embeddings,
    )


def write_tiny_checkpoint(
    outdir: str | Path,
    *,
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 32768,
    vision_depth: int = 2,
    vision_hidden: int = 64,
    vision_heads: int = 2,
    vocab_size: int = 1024,
    extra_corpus: Sequence[str] = (),
    head_dim: int = 32,
    mrope_section: Sequence[int] = (6, 5, 5),
    intermediate: int = 0,
    vision_intermediate: int = 0,
    vision_positions: int = 256,
    deepstack_visual_indexes: Sequence[int] = (0,),
    model_vocab: int = 0,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    min_pixels: int = 32 * 32 * 4,
    max_pixels: int = 512 * 512,
    thinking: bool = False,
) -> Path:
    """Write a random tiny `Qwen3VLForConditionalGeneration` (weights, config, generation config, tokenizer
    with chat template, image processor) to `outdir`; the same `seed` gives the same weight bytes.

    The defaults give the tiny model the tests pin; the other knobs make a bigger one (e.g. for
    bench/learning.py): `vision_*` size the vision tower, `vocab_size` and `extra_corpus` (texts the BPE
    merges are also learnt from) the tokenizer; `head_dim` .. `tie_word_embeddings` are `tiny_config`'s
    (real sizes, as bench/gpu_check.py's 2B-class model), `dtype` the stored weights' ("float32" or
    "bfloat16", as real checkpoints), `min_pixels` / `max_pixels` the image processor's bounds; `thinking`
    gives it a Qwen3-VL-Thinking-style chat template (`THINKING_CHAT_TEMPLATE`), not the Instruct one."""
    import torch
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=vocab_size, extra_corpus=extra_corpus, thinking=thinking)
    config = tiny_config(
        tokenizer,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        max_positions=max_positions,
        vision_depth=vision_depth,
        vision_hidden=vision_hidden,
        vision_heads=vision_heads,
        head_dim=head_dim,
        mrope_section=mrope_section,
        intermediate=intermediate,
        vision_intermediate=vision_intermediate,
        vision_positions=vision_positions,
        deepstack_visual_indexes=deepstack_visual_indexes,
        model_vocab=model_vocab,
        tie_word_embeddings=tie_word_embeddings,
    )
    # fork_rng: seed the init without touching the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).to(getattr(torch, dtype)).eval()
    im_end, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    # As Qwen's own generation config: both <|im_end|> and <|endoftext|> end a response.
    model.generation_config = GenerationConfig(eos_token_id=[im_end, pad], pad_token_id=pad, do_sample=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_image_processor(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(out)
    meta = {"format": TINY_FORMAT, "seed": seed, "hidden": hidden, "layers": layers, "heads": heads}
    meta["kv_heads"] = kv_heads
    # Only a non-default knob is recorded, so the default checkpoint's bytes stay as they were.
    extras = {"vision_depth": (vision_depth, 2), "vision_hidden": (vision_hidden, 64)}
    extras |= {"vision_heads": (vision_heads, 2), "vocab_size": (vocab_size, 1024)}
    extras |= {"head_dim": (head_dim, 32), "mrope_section": (list(mrope_section), [6, 5, 5])}
    extras |= {"intermediate": (intermediate, 0), "vision_intermediate": (vision_intermediate, 0)}
    extras |= {"vision_positions": (vision_positions, 256), "model_vocab": (model_vocab, 0)}
    extras |= {"deepstack_visual_indexes": (list(deepstack_visual_indexes), [0])}
    extras |= {"tie_word_embeddings": (tie_word_embeddings, False), "dtype": (dtype, "float32")}
    extras |= {"min_pixels": (min_pixels, 32 * 32 * 4), "max_pixels": (max_pixels, 512 * 512)}
    extras |= {"thinking": (thinking, False)}
    meta |= {k: v for k, (v, default) in extras.items() if v != default}
    if extra_corpus:
        meta["extra_corpus_texts"] = len(extra_corpus)
    (out / "guirl_tiny.json").write_text(json.dumps(meta))
    return out


def count_parameters(ckpt_dir: str | Path) -> int:
    """Number of parameters stored in a checkpoint's safetensors files (without building the model)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(ckpt_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                total += _numel(f.get_slice(key).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


TINY_FORMAT = 3
"""Bumped whenever the tiny checkpoint changes shape (2: 32k positions, 3: BPE merges); a cache of another
format is rebuilt by `ensure_tiny_checkpoint`."""


def ensure_tiny_checkpoint(cache_dir: str | Path, *, seed: int = 0, thinking: bool = False) -> Path:
    """The tiny checkpoint at `cache_dir` (with the Thinking-style chat template if `thinking`), built once:
    it is written to a temporary sibling directory and moved into place with `os.replace`, so a concurrent
    caller either finds a complete one or builds its own and loses the rename race harmlessly."""
    target = Path(cache_dir)
    meta = target / "guirl_tiny.json"
    if meta.exists() and json.loads(meta.read_text()).get("format") != TINY_FORMAT:
        shutil.rmtree(target)  # built by an older guirl: stale
    if (target / "config.json").exists():
        return _check_key(target, seed, thinking)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write_tiny_checkpoint(tmp, seed=seed, thinking=thinking)
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep other users (a sandboxed engine) out
        try:
            os.replace(tmp, target)
        except OSError:
            # Another caller put a complete checkpoint there first (os.replace cannot replace a non-empty
            # directory); theirs is as good as ours.
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _check_key(target, seed, thinking)


def _check_key(ckpt: Path, seed: int, thinking: bool) -> Path:
    """The cache directory is the cache key: a checkpoint built with another seed or template there is an
    error."""
    meta = ckpt / "guirl_tiny.json"
    found = json.loads(meta.read_text()) if meta.exists() else {}
    if found.get("seed") != seed:
        raise ValueError(
            f"{ckpt} holds a checkpoint with seed {found.get('seed')}, not {seed}: use another directory"
        )
    if found.get("thinking", False) != thinking:
        variant = "Thinking" if found.get("thinking", False) else "Instruct"
        raise ValueError(f"{ckpt} holds a checkpoint with the {variant} chat template: use another directory")
    return ckpt
