"""bench/vm_reset.py runs small against the AWS stand-in (so it cannot rot): both reset methods and both
launch rounds report, and the methods make the calls they should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_vm_reset_bench_reports_both_methods() -> None:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("AWS_")}
    cmd = [sys.executable, str(ROOT / "bench" / "vm_reset.py"), "--vms", "2", "--resets", "1"]
    cmd += ["--boot-s", "0.1", "--replace-s", "0.1", "--rate", "20"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    by = {r["method"]: r for r in result["resets"]}
    assert by["replace_root"]["resets"] == 2 and by["relaunch"]["resets"] == 2
    assert (
        by["replace_root"]["api_calls"]["replace_root"] == 2
        and by["replace_root"]["api_calls"]["launch"] == 2
    )
    assert by["relaunch"]["api_calls"]["launch"] == 4 and "replace_root" not in by["relaunch"]["api_calls"]
    assert [r["vms"] for r in result["launch"]] == [2, 2] and result["launch"][0]["launches_per_s"] > 0
    assert "replacing it" not in out.stderr  # the pool's health checks go through the provider's probe
