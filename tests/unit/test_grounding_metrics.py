"""Grounding metrics from episode folders, and where rows come from (`synth:` sources)."""

from __future__ import annotations

import json

import pytest

from guirl.data.metrics import grounding_metrics, grounding_table
from guirl.data.source import resolve_rows
from guirl.data.tasks import task_id_of
from guirl.errors import InputError


def _result(root, task, episode, domain, parts, status="completed"):
    folder = root / "episodes" / task / episode
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(
        json.dumps({"status": status, "domain": domain, "reward_parts": parts})
    )


def test_metrics_by_domain_count_only_what_applies(tmp_path):
    _result(tmp_path, "a", "e1", "web", {"format": 1, "type": 1, "point": 1, "accuracy": 1})
    _result(tmp_path, "b", "e2", "web", {"format": 1, "type": 1, "point": 0, "accuracy": 0})
    _result(tmp_path, "c", "e3", "mobile", {"format": 0, "type": 1, "text": 1, "accuracy": 1})
    _result(tmp_path, "d", "e4", "mobile", {"format": 1, "type": 0, "accuracy": 0}, status="retried")
    (tmp_path / "episodes" / "e" / "e5").mkdir(parents=True)
    (tmp_path / "episodes" / "e" / "e5" / "result.json").write_text("not json")  # skipped
    m = grounding_metrics(tmp_path)
    assert list(m) == ["mobile", "web", "all"]
    assert m["web"] == {
        "rows": 2,
        "step_success": 0.5,
        "type_accuracy": 1.0,
        "grounding_accuracy": 0.5,
        "grounding_accuracy_rows": 2,
        "text_accuracy": None,
        "text_accuracy_rows": 0,
        "format_rate": 1.0,
    }
    assert m["all"]["rows"] == 3 and m["all"]["step_success"] == 0.6667
    assert m["all"]["text_accuracy"] == 1.0 and m["all"]["format_rate"] == 0.6667
    table = grounding_table(m)
    assert table.splitlines()[-1].startswith("all") and "66.7%" in table
    # a resumed eval's final episodes: the others in the run directory are left out
    only = grounding_metrics(tmp_path, episodes={"e1", "e3"})
    assert (
        only["all"]["rows"] == 2
        and only["all"]["step_success"] == 1.0
        and list(only) == ["mobile", "web", "all"]
    )


def test_synth_sources_are_made_once_and_named_strictly(tmp_path):
    first = resolve_rows("synth:train:3:5", cache=tmp_path)
    assert first.is_file() and len(first.read_text().splitlines()) == 3
    stamp = first.stat().st_mtime_ns
    assert resolve_rows("synth:train:3:5", cache=tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert resolve_rows("some/file.jsonl") == tmp_path.__class__("some/file.jsonl")
    for bad in ("synth:train:3", "synth:valid:3:0", "synth:train:x:0", "synth:train:0:0", "synth:train:3:-1"):
        with pytest.raises(InputError, match="synth"):
            resolve_rows(bad, cache=tmp_path)


def test_task_ids_of_rows_are_plain_names():
    assert task_id_of("rows:12", "train") == "train-rows_12"
    assert task_id_of("../../etc/passwd", "eval") == "eval-.._.._etc_passwd"
    assert "/" not in task_id_of("a/b", "train") and len(task_id_of("x" * 500, "train")) == 200
