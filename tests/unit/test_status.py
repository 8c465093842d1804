"""`guirl status`: reading a run's status.json (and refusing what is not one), and rendering it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guirl.status import FORMAT, STATUS_FILE, read_status, render

ROOT = Path(__file__).resolve().parents[2]


def _doc(**over) -> dict:
    doc = {
        "format": FORMAT,
        "mode": "train",
        "driver_pid": os.getpid(),
        "written_at": time.time(),
        "started_at": time.time() - 60,
        "actors": {
            "broker": {"up": True, "pid": 11, "host": "", "restarts": 0, "heard_s_ago": 0.4},
            "learner": {"up": False, "pid": 12, "host": "", "restarts": 1, "heard_s_ago": None},
        },
        "learner": {"version": 3, "epoch": 1},
        "engines": {"hf0": {"version": 2, "epoch": 0, "healthy": 1}},
        "pending_weight_updates": 1,
        "weight_updates": 4,
        "weight_updates_abandoned": 1,
        "requests_queued": 2,
        "requests_inflight": 1,
        "episodes_running": [
            {
                "episode_id": "ep00007",
                "task_id": "editor-save",
                "worker": "worker0",
                "attempt": 1,
                "running_s": 42.0,
            }
        ],
        "episodes": {"completed": 5, "retried": 1},
        "groups_reissued": 2,
    }
    doc.update(over)
    return doc


def test_render_says_what_is_down_behind_and_in_flight():
    text = render(_doc())
    assert "driver pid" in text and "running" in text
    assert "learner        DOWN" in text
    assert "engine hf0: version 2 (epoch 0), healthy  <- not the learner's weights" in text
    assert "1 under way" in text and "1 abandoned" in text
    assert "ep00007" in text and "running 42 s" in text


def test_a_dead_driver_and_an_old_status_are_said():
    assert "NOT RUNNING" in render(_doc(driver_pid=2**22 + 12345))
    assert "may be stuck" in render(_doc(written_at=time.time() - 120))


@pytest.mark.parametrize(
    "content, error",
    [
        (None, "no status yet"),
        ("{", "unreadable"),
        ("[]", "not a status"),
        (json.dumps({"format": 99}), "not a status"),
    ],
)
def test_what_is_not_a_status_is_refused_clearly(tmp_path, content, error):
    if content is not None:
        (tmp_path / STATUS_FILE).write_text(content)
    with pytest.raises(ValueError, match=error):
        read_status(tmp_path)
    with pytest.raises(ValueError, match="no such run"):
        read_status(tmp_path / "missing")


def test_the_command_prints_it_and_fails_cleanly_without_one(tmp_path):
    (tmp_path / STATUS_FILE).write_text(json.dumps(_doc()))
    guirl = [sys.executable, str(ROOT / "bin" / "guirl"), "status"]
    out = subprocess.run([*guirl, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "engine hf0" in out.stdout, out.stderr
    raw = subprocess.run([*guirl, str(tmp_path), "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(raw.stdout)["learner"] == {"version": 3, "epoch": 1}
    bad = subprocess.run([*guirl, str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such run directory" in bad.stderr and "Traceback" not in bad.stderr
