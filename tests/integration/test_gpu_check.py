"""bench/gpu_check.py, the one-GPU-machine check, in its smoke mode (the tiny model, on CPU here): every
phase runs through guirl's own code (Trainer on a one-rank group, full state dict and bucket plan, HFEngine
batching) and the last stdout line is the JSON a GPU run reports; `--require-gpu` without CUDA is an
error, not a silent CPU run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"
TIMEOUT_S = 300  # ~8 s on 2 CPU cores; the margin is for a loaded machine


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_smoke_run_reports_every_phase(tmp_path: Path) -> None:
    proc = run_script("--smoke", "--workdir", str(tmp_path), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = {"bench", "device", "mode", "params_m", "learner", "generation", "publish", "seconds"}
    assert keys <= set(report)
    assert report["bench"] == "gpu_check" and report["mode"] == "smoke" and report["failed"] == []
    assert report["params_m"] > 0 and report["seconds"] > 0
    on_gpu = torch.cuda.is_available()

    learner = report["learner"]
    assert learner["fsdp2"] is True and learner["world_size"] == 1  # a real one-rank group, sharded
    assert learner["tokens_per_s"] > 0 and learner["step_s"] > 0 and learner["microbatches"] >= 2
    assert learner["compute_dtype"] == ("bfloat16" if on_gpu else "float32")
    assert learner["attn_implementation"] in ("sdpa", "flash_attention_2")
    assert math.isfinite(learner["loss"]) and math.isfinite(learner["grad_norm"])
    assert (learner["peak_gib"] is None) == (not on_gpu)

    gen = report["generation"]
    sizes = sorted(int(k.removeprefix("batch_")) for k in gen if k.startswith("batch_"))
    assert len(sizes) == 2 and sizes[0] == 1
    for b in sizes:
        assert gen[f"batch_{b}"]["tokens_per_s"] > 0
        assert gen[f"batch_{b}"]["generate_calls"] == 1  # the whole batch in one generate call
    assert gen["batching_speedup"] > 0

    publish = report["publish"]
    assert publish["full_state_gbps"] > 0 and publish["device_copy_gbps"] > 0
    assert publish["full_state_tensors"] > 0 and publish["buckets_512mib"] >= 1
    assert "[gpu_check" in proc.stderr  # progress goes to stderr, not into the JSON line's stream


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available: --require-gpu would run")
def test_require_gpu_without_cuda_fails_clearly(tmp_path: Path) -> None:
    proc = run_script("--require-gpu", "--workdir", str(tmp_path), cwd=REPO)
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr
    assert proc.stdout == ""
