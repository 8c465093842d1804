"""The learner's checkpoints (`guirl.learner.checkpoint`): written whole with `learner.json` last, the last
two kept, the newest complete one found, and a restarted learner resumes from the run's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guirl.learner.checkpoint import (
    LearnerState,
    checkpoint_version,
    latest_checkpoint,
    load_learner_state,
    resume_point,
    save_checkpoint,
)


def _save_model(tmp: Path) -> None:
    (tmp / "model").mkdir()
    (tmp / "model" / "model.safetensors").write_bytes(b"weights")


def _state(version: int) -> LearnerState:
    return LearnerState(
        version=version, trained_groups=["t@0"], trained_episodes=["e1", "e2"], buffer={"ready_groups": 0}
    )


def test_a_checkpoint_round_trips_and_the_last_two_are_kept(tmp_path: Path) -> None:
    for v in (1, 2, 3):
        final = save_checkpoint(tmp_path, _state(v), _save_model)
    assert final == tmp_path / "checkpoints" / "v000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["v000002", "v000003"]
    assert load_learner_state(final) == _state(3) and checkpoint_version(final) == 3
    # the file a resumed run's driver reads (guirl/train.py) keeps its keys
    doc = json.loads((final / "learner.json").read_text())
    assert doc == {
        "version": 3,
        "trained_groups": ["t@0"],
        "trained_episodes": ["e1", "e2"],
        "buffer": {"ready_groups": 0},
    }
    assert (final / "model" / "model.safetensors").read_bytes() == b"weights"


def test_a_save_that_fails_leaves_the_previous_checkpoint_the_latest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(1), _save_model)

    def dies(tmp: Path) -> None:
        _save_model(tmp)
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, _state(2), dies)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "v000001"


def test_latest_skips_an_incomplete_directory_and_resume_prefers_the_runs_own(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None and resume_point(tmp_path, None) is None
    save_checkpoint(tmp_path, _state(4), _save_model)
    (tmp_path / "checkpoints" / "v000005" / "model").mkdir(parents=True)  # no learner.json: cut short
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "v000004"
    older = save_checkpoint(tmp_path / "elsewhere", _state(2), _save_model)
    newer = save_checkpoint(tmp_path / "later", _state(9), _save_model)
    assert resume_point(tmp_path, None) == tmp_path / "checkpoints" / "v000004"
    assert resume_point(tmp_path, older) == tmp_path / "checkpoints" / "v000004"  # restarted mid-run
    assert resume_point(tmp_path, newer) == newer
    with pytest.raises(ValueError, match="not a learner checkpoint"):
        load_learner_state(tmp_path / "checkpoints" / "v000005")
