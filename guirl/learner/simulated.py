"""A learner rank without a model, for measuring the control plane (`train.simulated_update_s`).

Everything around the update is the real learner's: trajectories are received, checked for their policy's
lineage and staleness, buffered into GRPO groups, given advantages and turned into training samples; each
version is checkpointed (its bookkeeping), announced to the coordinator and published to the broker (on
the disk path, as a weight file with no tensors, which the scripted engines take as the new version). Only
the update itself is replaced: it takes `update_s` seconds on the torch thread, as a real one would hold
it, and changes nothing. So a benchmark can give the learner GUI-RL's update time without GUI-RL's GPUs,
and the decoupled layout's overlap is measured through the real actors (`bench/control_plane.py`,
`bench/decoupling.py`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from guirl.learner.samples import TrainSample

SIMULATED_MARKER = "simulated.json"
"""What a simulated learner's checkpoint holds in place of the model (a real learner refuses to resume
from it)."""


class _NoVision:
    """The renderer's part the learner reads: no token is a vision token (the scripted engine's ids are
    bytes and image placeholders it never answers with)."""

    vision_token_ids: frozenset[int] = frozenset()


class SimulatedTrainer:
    """Stands where `guirl.learner.trainer.Trainer` stands, one rank only (see the module docstring)."""

    model = None
    info = None

    def __init__(self, update_s: float) -> None:
        if not update_s > 0:
            raise ValueError(f"a simulated update takes a positive time, not {update_s}")
        self.update_s = update_s
        self.renderer = _NoVision()

    def load(self, resume_from: Path | None = None, **_: Any) -> None:
        """Nothing to load; a checkpoint to resume from must be a simulated learner's."""
        check_resumable(resume_from, simulated=True)

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        """Hold the torch thread for `update_s` (a blocking wait: the actor's loop stays free, as with a
        real update) and report the batch as a real step would, with no loss."""
        time.sleep(self.update_s)
        return {
            "loss": 0.0,
            "tokens": float(sum(len(s.response_ids) for s in samples)),
            "prompt_tokens": float(sum(len(s.prompt_ids) for s in samples)),
            "samples": float(len(samples)),
            "simulated_update_s": self.update_s,
        }

    def full_state(self) -> dict[str, Any]:
        """No weights: the version travels alone."""
        return {}

    def save(self, path: Path) -> None:
        (Path(path) / SIMULATED_MARKER).write_text(json.dumps({"update_s": self.update_s}))

    def stop(self) -> None:
        """Nothing to release."""


def check_resumable(resume_from: Path | None, *, simulated: bool) -> None:
    """ValueError when `resume_from` is a checkpoint of the other kind: a simulated learner's holds no model
    for a real one to load, and a real one's weights mean nothing to a simulated one."""
    if resume_from is None:
        return
    marked = (Path(resume_from) / SIMULATED_MARKER).is_file()
    if marked and not simulated:
        raise ValueError(
            f"{resume_from} is a simulated learner's checkpoint (train.simulated_update_s): it holds no "
            "model to resume from"
        )
    if simulated and not marked:
        raise ValueError(f"{resume_from} is a real learner's checkpoint, not a simulated one's")
