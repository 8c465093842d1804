"""`guirl runs`: every run under a directory, whatever state it was left in, never one left out."""

import json
from pathlib import Path

import pytest

from guirl.errors import InputError
from guirl.runs import list_runs, render_list, show


def _run(root: Path, name: str, **files: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.toml").write_text("")
    for file, text in files.items():
        (path / file.replace("_", ".", 1)).write_text(text)
    return path


def test_every_run_is_listed_with_its_state(tmp_path: Path) -> None:
    _run(
        tmp_path,
        "local-eval-20261201-100000-aaaa",
        summary_json=json.dumps(
            {"mode": "eval", "tasks": 6, "accuracy": 0.5, "accuracy_all": 0.25, "aborted": 2}
        ),
    )
    # a train run whose driver died (its status names a pid that is gone), two updates logged, one cut short
    dead = {"format": 1, "mode": "train", "driver_pid": 2**22 + 12345}
    metrics = "\n".join(json.dumps({"version": v, "reward_mean": -0.5 * v}) for v in (1, 2)) + '\n{"vers'
    _run(tmp_path, "local-rl-20261201-110000-bbbb", status_json=json.dumps(dead), metrics_jsonl=metrics)
    _run(tmp_path, "odd-name")  # no stamp, nothing written yet
    (tmp_path / "not-a-run").mkdir()
    infos = list_runs(tmp_path)
    assert [(i.path.name, i.mode, i.state) for i in infos] == [
        ("odd-name", "?", "stopped"),  # its directory's time: now
        ("local-rl-20261201-110000-bbbb", "train", "stopped"),
        ("local-eval-20261201-100000-aaaa", "eval", "done"),
    ]
    text = render_list(infos)
    assert "2026-12-01 11:00" in text and "version 2" in text and "last update: reward -1.00" in text
    assert "accuracy 50.0%, all (0) 25.0%, aborted 2" in text
    assert "(no summary: the run ended before writing it)" in show(tmp_path / "local-rl-20261201-110000-bbbb")


def test_what_is_no_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory"):
        list_runs(tmp_path / "nope")
    with pytest.raises(InputError, match="not a run directory"):
        show(tmp_path)
    assert render_list(list_runs(tmp_path)) == "no runs"
