"""`guirl train` end to end: real actor processes (broker with the tiny model, learner, env worker with
local desktops), decoupled and `--sync`: versions advance, metrics per update, a summary. The decoupled
run trains on 2 learner ranks (FSDP2 over gloo) and logs to an offline W&B run; the `--sync` run logs each
step's advantage and is looked at through `guirl view` in Chromium (tests/viewer_checks.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS
from tests.helpers import history, read_records
from tests.viewer_checks import check_train_site

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]


BUSY = [
    *("--set", "runtime.fault_injection=true", "--set", "chaos.seed=5", "--set", "chaos.faults=0"),
    *("--set", "chaos.busy=2", "--set", "chaos.span_s=3", "--set", "runtime.heartbeat_interval_s=0.5"),
]
"""The decoupled run's broker or learner holds the GIL twice, for 2 to 4 transport deadlines (3 to 6 s), as a
Python-heavy save does, while episodes are played: busy, never taken for dead, nothing lost."""


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
        *(["--sync", "--set", "train.log_advantages=true"] if sync else []),
        *([] if sync else ["--set", "train.ranks=2", "--set", "wandb.mode=offline", *BUSY]),
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
    if not sync:  # the busy faults: struck and answered, and nobody was taken for dead
        busy = [json.loads(x) for x in (run_dir / "chaos.jsonl").read_text().splitlines()]
        assert [b["kind"] for b in busy if "kind" in b] == ["busy", "busy"], busy
        assert sum(1 for b in busy if str(b.get("busy", "")).startswith("held the GIL")) == 2, busy
        # the only peer declared dead is the chaos monkey's hostile one (a hex id), when the run ends
        dead = re.findall(r"peer_dead=(\S+)", out.stderr)
        assert summary["env_errors"] == 0 and all(d.startswith("0x") for d in dead), out.stderr[-3000:]
        assert " is hung" not in out.stderr
    if not sync:  # each update in the offline W&B run, with the coordinator's view beside it
        (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        rows = [r for r in history(read_records(log)) if "version" in r]
        assert [r["version"] for r in rows] == [1, 2] and [r["_step"] for r in rows] == [1, 2]
        assert all("env/utilisation" in r and r["samples"] >= 4 for r in rows)
        assert (run_dir / "logs" / "learner-rank1.log").is_file()
    if sync:  # the run as `guirl view` shows it, in Chromium
        check_train_site(run_dir, updates=2)


def test_train_with_the_sglang_backend_broadcasts_through_sglang_routes(tmp_path, tiny_ckpt):
    """The production layout on CPU: the broker launches two SGLang servers (the stand-in, started with
    SGLang's launch flags on the placement's GPU ids), the learner broadcasts each version over gloo in
    SGLang's layout, bucket by bucket, overlapped with the next update; every engine serves every version
    and the metrics carry the publish phases."""
    standin = json.dumps([sys.executable, "-m", "guirl.testing.fakes", "sglang"])
    sets = [
        f"run.root_dir={tmp_path}",
        "inference.backend=sglang",
        f"inference.sglang.server_command={standin}",
        "inference.sglang.start_timeout_s=120",
        "cluster.num_gpus=2",
        "cluster.actor_gpus=0",
        "cluster.rollout_gpus=2",
        "train.device=cpu",
        "train.weight_dtype=float32",
        "train.weight_bucket_mb=1",
    ]
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
        *[x for s in sets for x in ("--set", s)],
    ]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [1, 2, 3]
    published = [m for m in metrics if "publish.version" in m]
    assert published, metrics
    for m in published:
        assert m["publish.gather_s"] >= 0 and m["publish.broadcast_s"] >= 0 and m["publish.engine_s"] >= 0
    assert metrics[-1]["version_lag_max"] <= 1
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {"sglang0.log", "sglang1.log"} <= logs
    assert not (run_dir / "weights").exists()  # every version went by broadcast, none by the disk fallback
    assert "weight broadcast of version" not in out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_version"] == 3
    # the episodes of the last version's groups were played by engines serving a broadcast version
    versions = set()
    for traj in run_dir.glob("episodes/*/*/traj.jsonl"):
        for line in traj.read_text().splitlines():
            rec = json.loads(line)
            if "policy_version" in rec:
                versions.add(rec["policy_version"])
    assert max(versions, default=-1) >= 1, versions
