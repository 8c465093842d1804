"""The learner's checkpoints: `checkpoints/v<version>/` in a run directory.

Each holds the model in Hugging Face format (loadable by transformers, with the tokenizer and image
processor), the optimizer (keyed by parameter name: any number of ranks can resume from it), the RNG
states (all written by `Trainer.save`), and `learner.json` (version, groups and episodes trained, the
buffer's counts) written last. A checkpoint is built in a temporary directory and renamed into place
(`guirl.fileio.write_dir_atomic`), so a kill mid-write leaves the previous one the latest complete one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from guirl.fileio import write_dir_atomic

LEARNER_STATE = "learner.json"
KEEP = 2
"""Checkpoints kept: the newest and the one before it."""


class LearnerState(msgspec.Struct, frozen=True, kw_only=True):
    """`learner.json`: the learner's bookkeeping at the checkpoint (the trainer saves the rest)."""

    version: int
    trained_groups: list[str] = []
    trained_episodes: list[str] = []
    buffer: dict[str, Any] = {}
    """The trajectory buffer's counts then (for reading; not restored)."""


def save_checkpoint(run_dir: str | Path, state: LearnerState, save_trainer: Any) -> Path:
    """`checkpoints/v<version>/` of `run_dir`: `save_trainer(directory)` writes the model, optimizer and RNG
    states into it, then `learner.json` is written; older checkpoints are pruned to `KEEP`."""

    def fill(tmp: Path) -> None:
        save_trainer(tmp)
        (tmp / LEARNER_STATE).write_bytes(msgspec.json.encode(state))

    final = Path(run_dir) / "checkpoints" / f"v{state.version:06d}"
    return write_dir_atomic(final, fill, keep=KEEP)


def load_learner_state(ckpt: str | Path) -> LearnerState:
    """The bookkeeping of the checkpoint directory `ckpt` (ValueError when it is not readable as one)."""
    path = Path(ckpt) / LEARNER_STATE
    try:
        return msgspec.json.decode(path.read_bytes(), type=LearnerState)
    except (OSError, msgspec.DecodeError) as exc:
        raise ValueError(f"{path}: not a learner checkpoint's state: {exc}") from exc


def checkpoint_version(ckpt: str | Path) -> int:
    return load_learner_state(ckpt).version


def resume_point(run_dir: str | Path, resume_from: Path | None) -> Path | None:
    """Where a learner starting in `run_dir` resumes from: the run's latest checkpoint when it has one newer
    than `resume_from` (a learner restarted mid-run carries on from there, never from the starting weights
    or the checkpoint the run was resumed from: the engines are ahead of those), else `resume_from`."""
    latest = latest_checkpoint(run_dir)
    if latest is not None and (
        resume_from is None or checkpoint_version(latest) > checkpoint_version(resume_from)
    ):
        return latest
    return resume_from


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (a directory renamed into place has its learner.json)."""
    found = sorted(p for p in Path(run_dir, "checkpoints").glob("v*") if (p / LEARNER_STATE).is_file())
    return found[-1] if found else None
