"""Which checkpoint a run loads: the policy's (`model.hf_ckpt`) and the PRM judge's (`model.prm_model_path`),
checked before anything starts; "tiny" names the tiny random Qwen3-VL, built offline on first use."""

from __future__ import annotations

import os
import re
from pathlib import Path

from guirl.config import GuirlConfig
from guirl.errors import InputError

TINY = "tiny"
"""`model.hf_ckpt = "tiny"`: the tiny random Qwen3-VL, built offline on first use into guirl's cache
(`guirl.fileio.cache_dir`: `~/.cache/guirl/tiny-qwen3vl`)."""


def resolve_checkpoint(cfg: GuirlConfig) -> str:
    """The policy checkpoint path the broker loads ("" for backends that need none)."""
    ckpt = cfg.model.hf_ckpt
    if cfg.inference.backend not in ("hf", "sglang"):
        return ckpt  # an OpenAI-compatible server names its model itself; scripted answers need none
    return _hf_checkpoint(
        ckpt,
        "model.hf_ckpt",
        "no policy checkpoint: set HF_CKPT (or model.hf_ckpt) to a Hugging Face checkpoint directory, "
        'or to "tiny" for the tiny random Qwen3-VL (`guirl model tiny DIR` builds one)',
    )


def resolve_prm_checkpoint(cfg: GuirlConfig) -> str:
    """The PRM judge's checkpoint (`model.prm_model_path`, `PRM_MODEL_PATH`; "" for the scripted judge)."""
    path, backend = cfg.model.prm_model_path, cfg.prm.backend
    if backend == "scripted" or (backend == "openai" and cfg.prm.openai.model and not path):
        return ""  # the scripted judge needs no model; an OpenAI-compatible one is named by prm.openai.model
    missing = (
        "prm.enabled needs a judge: set PRM_MODEL_PATH (or model.prm_model_path) to its checkpoint, "
        '"tiny" for the tiny random Qwen3-VL, or prm.backend = "scripted"'
    )
    if backend in ("hf", "sglang"):  # an SGLang server is given a directory, never an id to download
        return _hf_checkpoint(path, "model.prm_model_path", missing)
    if not path:
        raise InputError(missing)
    return path


def _hf_checkpoint(path: str, key: str, missing: str) -> str:
    """A checkpoint directory the transformers backend loads: `path`, or the tiny model for "tiny";
    InputError (`missing` when unset) otherwise."""
    if path == TINY:
        from guirl.fileio import cache_dir
        from guirl.model.tiny import ensure_tiny_checkpoint

        return str(ensure_tiny_checkpoint(cache_dir("tiny-qwen3vl")))
    if not path:
        raise InputError(missing)
    if Path(path, "config.json").is_file():
        return path
    if HUB_ID.fullmatch(path) and not Path(path).exists():
        return _from_hub_cache(path, key)
    raise InputError(f"{key}={path!r} is not a checkpoint directory (no config.json in it)")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A Hugging Face model id (`Qwen/Qwen3-VL-4B-Instruct`): a checkpoint found in the local cache."""


def _from_hub_cache(repo_id: str, key: str) -> str:
    """The snapshot of `repo_id` in the local Hugging Face cache (`HF_HUB_CACHE`, or `HF_HOME`/hub); guirl
    never downloads at run time, so a model not there is an error saying how to get it."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    env = os.environ  # read now, not when huggingface_hub was imported
    cache = env.get("HF_HUB_CACHE") or (os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None)
    cache = cache or constants.HF_HUB_CACHE
    try:
        found = snapshot_download(repo_id, local_files_only=True, cache_dir=cache)
    except (LocalEntryNotFoundError, OSError, ValueError):
        found = None
    if found is None or not Path(found, "config.json").is_file():
        raise InputError(
            f"{key}={repo_id!r}: not a directory, and no complete snapshot of it in the local Hugging Face "
            f"cache ({cache}); guirl never downloads at run time: get it first with "
            f"`hf download {repo_id}` (huggingface_hub's CLI; `huggingface-cli download` in older "
            "releases), or give the checkpoint's directory"
        )
    return found
