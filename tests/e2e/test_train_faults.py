"""`guirl train` end to end with the learner SIGKILLed once the engines serve a version it has no checkpoint
of (the standing chaos suite, `tests/chaos/`, draws its faults at random: an env worker killed mid-run
among them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]


def _local_rl(tmp_path: Path, tiny_ckpt: str, updates: int, *sets: str) -> subprocess.CompletedProcess:
    """`guirl train` with local_rl.toml, 2 steps an episode, `updates` updates and `sets`: it must succeed."""
    cmd = [
        *GUIRL,
        "train",
        "--config",
        str(ROOT / "configs" / "local_rl.toml"),
        "--ckpt",
        tiny_ckpt,
        "--updates",
        str(updates),
        "--max-steps",
        "2",
        "--set",
        f"run.root_dir={tmp_path}",
        *[x for s in sets for x in ("--set", s)],
    ]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_a_restarted_learner_never_trains_a_sample_of_weights_it_does_not_hold(tmp_path, tiny_ckpt):
    """SIGKILL the learner once the engines serve version 2. It has no checkpoint (local_rl.toml saves one
    at the end only), so it restarts from the starting weights as lineage epoch 1, gives the engines those
    weights back first, and never trains an episode played by the dead learner's versions 1-2 (they are
    rejected and handed out again): no update ever trains a sample of a version ahead of its own (a lag
    below 0, as this run trained before), and the run still makes its 4 updates."""
    out = _local_rl(tmp_path, tiny_ckpt, 4, "faults.kill_learner_at_version=2")
    assert "fault injection: SIGKILLed the learner" in out.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert json.loads((run_dir / "lineage.json").read_text()) == {"forks": [0, 0]}
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics][0] == 0 and metrics[-1]["epoch"] == 1
    assert [m["version"] for m in metrics if m["epoch"] == 1] == [1, 2, 3, 4]
    for m in metrics:
        assert 0 <= m["version_lag_min"] <= m["version_lag_max"] <= 1, m
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 4 and summary["final_version"] == 4 and summary["learner_restarts"] == 1
    # every trained step's (epoch, version) against the lineage, every episode one end, none trained twice
    from guirl.chaos import check_run

    report = check_run(run_dir, updates=4)
    assert report["violations"] == [] and report["samples_trained"] >= 16, report
