"""bench/scaling.py runs small (1 and 2 env workers on real local desktops, short latencies, a few short
episodes) so that it cannot rot: it exits 0, every episode plays its whole script, and each point reports
its steady steps/s and scaling efficiency. No speed is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]


def test_scaling_bench_reports_every_point() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    cmd = [sys.executable, str(ROOT / "bench" / "scaling.py"), "--points", "1,2", "--latency", "0.1,0.2"]
    cmd += ["--episodes", "3", "--steps", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bench"] == "scaling" and result["setup"]["points"] == [1, 2]
    points = result["points"]
    assert [(p["workers"], p["vms"], p["tasks"]) for p in points] == [(1, 1, 3), (2, 2, 6)]
    assert result["valid"], points  # every episode scored 1 in exactly 4 steps, no environment error
    for p in points:
        assert p["steps"] == 4 * p["tasks"]
        assert p["steady_steps"] >= 2 and p["steady_steps_per_s"] > 0 and p["steady_span_s"] > 0, p
        assert p["efficiency"] is not None and p["efficiency"] > 0, p
        assert p["policy_wait_s_mean"] >= 0.1  # each step waited at least the policy's latency
    assert points[0]["efficiency"] == 1.0
    assert result["efficiency"] == {"1": 1.0, "2": points[1]["efficiency"]}
