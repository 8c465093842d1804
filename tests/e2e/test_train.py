"""`guirl train` end to end: real actor processes (broker with the tiny model, learner, env worker with
local desktops), decoupled and `--sync`: versions advance, metrics per update, a summary. The decoupled
run trains on 2 learner ranks (FSDP2 over gloo) and logs to an offline W&B run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS
from tests.helpers import history, read_records

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from guirl.model.tiny import ensure_tiny_checkpoint

    return str(ensure_tiny_checkpoint(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.mark.parametrize("sync", [False, True])
def test_train_makes_its_updates(tmp_path, tiny_ckpt, sync):
    cmd = [
        *GUIRL,
        "train",
        "--config",
        str(ROOT / "configs" / "local_rl.toml"),
        "--ckpt",
        tiny_ckpt,
        "--updates",
        "2",
        "--max-steps",
        "2",
        "--set",
        f"run.root_dir={tmp_path}",
        *(["--sync"] if sync else ["--set", "train.ranks=2", "--set", "wandb.mode=offline"]),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["groups"] == 2 and m["trajectories"] == 4 and m["samples"] >= 4
        assert m["reward_mean"] in (-1.0, -0.5, 0.0, 0.5, 1.0) and m["grad_norm"] >= 0
        for key in (
            "clipfrac",
            "approx_kl",
            "entropy",
            "version_lag_mean",
            "learner_idle_frac",
            "success_rate",
        ):
            assert key in m
        if sync:  # no overlap: every sample was made by the version being trained
            assert m["version_lag_max"] == 0
        assert m["version_lag_max"] <= 1  # never beyond the staleness bound (local_rl.toml: 1)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["final_version"] == 2 and summary["sync"] is sync
    assert "[train] version 2" in out.stdout
    if not sync:  # each update in the offline W&B run, with the coordinator's view beside it
        (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        rows = [r for r in history(read_records(log)) if "version" in r]
        assert [r["version"] for r in rows] == [1, 2] and [r["_step"] for r in rows] == [1, 2]
        assert all("env/utilisation" in r and r["samples"] >= 4 for r in rows)
        assert (run_dir / "logs" / "learner-rank1.log").is_file()


def test_a_worker_killed_mid_run_does_not_stall_the_learner(tmp_path, tiny_ckpt):
    """SIGKILL the env worker after the first update: the supervisor restarts it (its desktops are reaped),
    the coordinator retries the episodes it was playing, and the learner makes every update."""
    cmd = [
        *GUIRL,
        "train",
        "--config",
        str(ROOT / "configs" / "local_rl.toml"),
        "--ckpt",
        tiny_ckpt,
        "--updates",
        "3",
        "--max-steps",
        "2",
        "--set",
        f"run.root_dir={tmp_path}",
        "--set",
        "train.fault_kill_worker_at_version=1",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fault injection: SIGKILLed worker0" in out.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 3 and summary["final_version"] == 3
    assert summary["env_errors"] >= 1  # the killed worker's episodes: retried, never trained as failures
