"""The simulated learner (`train.simulated_update_s`): its checkpoints and a real learner's do not mix."""

from __future__ import annotations

import pytest


def test_a_learner_resumes_only_from_a_checkpoint_of_its_kind(tmp_path):
    """A simulated learner's checkpoint holds no model: a real learner refuses it, and the other way."""
    from guirl.learner.simulated import SimulatedTrainer, check_resumable

    simulated, real = tmp_path / "simulated", tmp_path / "real"
    real.mkdir()
    simulated.mkdir()
    SimulatedTrainer(0.5).save(simulated)
    check_resumable(simulated, simulated=True)
    check_resumable(real, simulated=False)
    check_resumable(None, simulated=False)
    with pytest.raises(ValueError, match="simulated learner's checkpoint .* holds no model"):
        check_resumable(simulated, simulated=False)
    with pytest.raises(ValueError, match="a real learner's checkpoint"):
        SimulatedTrainer(0.5).load(real)
    with pytest.raises(ValueError, match="positive time"):
        SimulatedTrainer(0)
