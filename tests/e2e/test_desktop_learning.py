"""`bench/desktop_learning.py --quick --no-control` end to end: the targets suite, the warm start (reference
solutions played on local desktops, behaviour cloning), S0, GRPO through the actor system with the held-out
curve, the plots — on a small budget (the learning target is the full run's job). The shuffled-reward
control is the same GRPO run with `train.shuffle_rewards` (tests/unit/test_shuffled_rewards.py, and a
learner's updates in tests/integration/test_learner_ranks.py): not run a second time here, to keep the suite
in its budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(960)  # above the subprocess's own 900 s
def test_the_desktop_learning_benchmark_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "desktop_learning.py"),
            "--quick",
            "--no-control",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0 <= figures["S0"] <= 1 and 0 <= figures["S1"] <= 1
    # an evaluation of the held-out tasks at every version
    assert [v for v, _, _ in figures["curve"]] == [1, 2] and figures["control_curve"] is None
    assert all(0 <= acc <= 1 for _, _, acc in figures["curve"])
    assert figures["env_errors"] == 0 and figures["episodes"] >= 2 * 2 * 2
    assert figures["warm_start"]["demonstrations"] == 4 and figures["warm_start"]["sft_steps"] >= 1
    assert "did not score 1" not in out.stdout  # every demonstration scored: the app drew what was generated
    assert "held-out success at version 2" in out.stdout and "S0 =" in out.stdout
    run = Path(figures["run_dir"])
    with Image.open(run / "curve.png") as plot:
        assert plot.format == "PNG" and plot.size[0] > 300
    curves = json.loads((run / "curve.json").read_text())
    assert [v for v, _ in curves["GRPO"]] == [0, 1, 2] and curves["GRPO"][0][1] == figures["S0"]
    # the desktops the policy played are there to look at
    assert list((run / "grpo" / "episodes").glob("*/*/step_000.png"))
