"""`bench/learning.py --quick` end to end: the learning proof on a small budget (its own file: one of the
longest tests, which the two test workers can then balance around)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(660)  # above the subprocess's own 600 s
def test_the_learning_benchmark_runs(tmp_path):
    """`bench/learning.py --quick --no-control`: the proof (model, SFT, A0, GRPO with its curve, A1) end to
    end on a small budget, ending with its one line of JSON (the figures are the full run's job). The control
    is the same GRPO run with `train.shuffle_rewards` (tests/unit/test_shuffled_rewards.py, and a learner's
    updates in tests/integration/test_learner_ranks.py): not run twice here, to keep the suite in budget."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "learning.py"),
            "--quick",
            "--no-control",
            "--keep",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"A0", "A1", "curve", "params"} <= set(figures) and figures["control_A1"] is None
    assert 0 <= figures["A0"] <= 1 and 0 <= figures["A1"] <= 1 and figures["params"] <= 20_000_000
    assert [v for v, _, _ in figures["curve"]] == [1] and figures["control_curve"] is None
