"""Which checkpoint a run loads: the policy's (`model.hf_ckpt`) and the PRM judge's (`model.prm_model_path`),
checked before anything starts; "tiny" names the tiny random Qwen3-VL, built offline on first use."""

from __future__ import annotations

from pathlib import Path

from guirl.config import GuirlConfig
from guirl.errors import InputError

TINY = "tiny"
"""`model.hf_ckpt = "tiny"`: the tiny random Qwen3-VL, built offline on first use (see `TINY_CACHE`)."""
TINY_CACHE = Path(".cache") / "tiny-qwen3vl"


def resolve_checkpoint(cfg: GuirlConfig) -> str:
    """The policy checkpoint path the broker loads ("" for backends that need none)."""
    ckpt = cfg.model.hf_ckpt
    if cfg.inference.backend != "hf":
        return ckpt
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
    if backend == "hf":
        return _hf_checkpoint(path, "model.prm_model_path", missing)
    if not path:
        raise InputError(missing)
    return path


def _hf_checkpoint(path: str, key: str, missing: str) -> str:
    """A checkpoint directory the transformers backend loads: `path`, or the tiny model for "tiny";
    InputError (`missing` when unset) otherwise."""
    if path == TINY:
        from guirl.model.tiny import ensure_tiny_checkpoint

        return str(ensure_tiny_checkpoint(TINY_CACHE))
    if not path:
        raise InputError(missing)
    if not Path(path, "config.json").is_file():
        raise InputError(f"{key}={path!r} is not a checkpoint directory (no config.json in it)")
    return path
