"""`write_dir_atomic`, behind checkpoints and published weights: a directory appears whole or not at all,
a failed write leaves the previous one as it was, and older versions are pruned to the number kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from guirl.fileio import write_dir_atomic


def _writer(text: str):
    def fill(tmp: Path) -> None:
        (tmp / "model.bin").write_text(text)
        (tmp / "learner.json").write_text("{}")

    return fill


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_a_failed_write_leaves_the_previous_directory_intact(tmp_path: Path) -> None:
    final = tmp_path / "v000002"
    write_dir_atomic(final, _writer("old"))

    def half_then_fail(tmp: Path) -> None:
        (tmp / "model.bin").write_text("half of the new")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_dir_atomic(final, half_then_fail, keep=1)
    assert (final / "model.bin").read_text() == "old" and (final / "learner.json").is_file()
    assert _names(tmp_path) == ["v000002"]  # the temporary directory is gone too


def test_a_write_replaces_the_same_version_and_clears_a_leftover_temporary(tmp_path: Path) -> None:
    (tmp_path / ".v000001.tmp" / "model").mkdir(parents=True)  # a previous attempt killed mid-write
    (tmp_path / ".v000001.tmp" / "model" / "stale").write_text("x")
    final = write_dir_atomic(tmp_path / "v000001", _writer("first"))
    assert final == tmp_path / "v000001" and _names(final) == ["learner.json", "model.bin"]
    write_dir_atomic(final, _writer("again"))
    assert (final / "model.bin").read_text() == "again" and _names(tmp_path) == ["v000001"]


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_older_versions_are_pruned_to_keep(tmp_path: Path, keep: int) -> None:
    for v in range(1, 6):
        write_dir_atomic(tmp_path / f"v{v:06d}", _writer(str(v)), keep=keep)
    assert _names(tmp_path) == [f"v{v:06d}" for v in range(6 - keep, 6)]


def test_pruning_spares_newer_versions_and_other_names(tmp_path: Path) -> None:
    for name in ("v000007", "v000001", "v000002", "notes"):
        (tmp_path / name).mkdir()
    write_dir_atomic(tmp_path / "v000003", _writer("3"), keep=2)  # a restarted learner behind v7
    assert _names(tmp_path) == ["notes", "v000002", "v000003", "v000007"]
    write_dir_atomic(tmp_path / "v000004", _writer("4"))  # keep=0: nothing pruned
    assert _names(tmp_path) == ["notes", "v000002", "v000003", "v000004", "v000007"]
