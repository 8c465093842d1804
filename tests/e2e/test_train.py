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


def test_a_worker_killed_mid_run_does_not_stall_the_learner(tmp_path, tiny_ckpt):
    """SIGKILL the env worker after the first update: the supervisor restarts it (its desktops are reaped),
    the coordinator retries the episodes it was playing, and the learner makes every update."""
    out = _local_rl(tmp_path, tiny_ckpt, 3, "train.fault_kill_worker_at_version=1")
    assert "fault injection: SIGKILLed worker0" in out.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 3 and summary["final_version"] == 3
    assert summary["env_errors"] >= 1  # the killed worker's episodes: retried, never trained as failures


def test_a_restarted_learner_never_trains_a_sample_of_weights_it_does_not_hold(tmp_path, tiny_ckpt):
    """SIGKILL the learner once the engines serve version 2. It has no checkpoint (local_rl.toml saves one
    at the end only), so it restarts from the starting weights as lineage epoch 1, gives the engines those
    weights back first, and never trains an episode played by the dead learner's versions 1-2 (they are
    rejected and handed out again): no update ever trains a sample of a version ahead of its own (a lag
    below 0, as this run trained before), and the run still makes its 4 updates."""
    out = _local_rl(tmp_path, tiny_ckpt, 4, "train.fault_kill_learner_at_version=2")
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


# -- PRM+RL mode ------------------------------------------------------------------------------------------


def _prm_train(tmp_path: Path, tiny_ckpt: str, *sets: str, updates: int = 2) -> tuple[Path, str]:
    cmd = [
        *GUIRL,
        "train",
        "--config",
        str(ROOT / "configs" / "local_prm_rl.toml"),
        "--ckpt",
        tiny_ckpt,
        "--updates",
        str(updates),
        "--max-steps",
        "2",
        "--set",
        f"run.root_dir={tmp_path}",
        "--set",
        f"model.prm_model_path={tiny_ckpt}",
        *[x for s in sets for x in ("--set", s)],
    ]
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir, out.stdout + out.stderr


def _zscore(values: list[float], eps: float = 1e-6) -> list[float]:
    """A z-score by hand: unbiased std; equal values give 0."""
    n = len(values)
    mean = sum(values) / n
    if max(values) == min(values):
        return [0.0] * n
    std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return [(v - mean) / (std + eps) for v in values]


def _expected_advantages(lines: list[dict], coef: float) -> dict[tuple[str, int], float]:
    """Step-wise advantages of one update's steps, worked out from the logged rewards and PRM scores."""
    from collections import defaultdict

    expected: dict[tuple[str, int], float] = {}
    rewards: dict[str, dict[str, float]] = defaultdict(dict)  # group -> episode -> reward
    for x in lines:
        rewards[x["group_id"]][x["episode_id"]] = x["reward"]
    outcome: dict[str, float] = {}
    for episodes in rewards.values():
        ids = list(episodes)
        adv = _zscore([episodes[e] for e in ids]) if len(ids) > 1 else [0.0]
        outcome.update(zip(ids, adv, strict=True))
    buckets: dict[tuple[str, int], list[dict]] = defaultdict(list)
    reached: dict[tuple[str, int], int] = defaultdict(int)
    for x in lines:
        reached[(x["group_id"], x["step"])] += 1
        if x["prm_score"] is None:  # no score: the episode's outcome advantage, nothing invented
            expected[(x["episode_id"], x["step"])] = outcome[x["episode_id"]]
        else:
            buckets[(x["group_id"], x["step"])].append(x)
    for key, members in buckets.items():
        if len(members) == 1 and reached[key] > 1:  # its peers' scores are missing: the outcome alone
            expected[(members[0]["episode_id"], members[0]["step"])] = outcome[members[0]["episode_id"]]
            continue
        values = [m["reward"] + coef * m["prm_score"] for m in members]
        adv = values if len(values) == 1 else _zscore(values)  # a bucket of one keeps its score
        for m, a in zip(members, adv, strict=True):
            expected[(m["episode_id"], m["step"])] = a
    return expected


def test_prm_rl_delivers_every_score_and_trains_on_step_advantages(tmp_path, tiny_ckpt):
    """A scripted judge (known verdicts, every third step answered without a score): every trained step
    carries the judge's verdict or is marked invalid, and its advantage is the hand-computed step-wise one."""
    from guirl.inference.scripted import scripted_verdict

    coef = 0.5
    run_dir, stdout = _prm_train(
        tmp_path,
        tiny_ckpt,
        "prm.backend=scripted",
        "prm.scripted.invalid_every=3",
        f"train.prm_step_coef={coef}",
    )
    lines = [json.loads(x) for x in (run_dir / "advantages.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted({x["version"] for x in lines}) == [1, 2]
    for x in lines:
        verdict = scripted_verdict(x["episode_id"], x["step"], 3)
        if verdict is None:
            assert (x["prm_score"], x["prm_status"]) == (None, "invalid")
        else:  # delivered as the judge gave it (two votes that agree)
            assert (x["prm_score"], x["prm_status"]) == (float(verdict), "scored")
        recorded = [
            json.loads(r)
            for r in (run_dir / "episodes" / x["task_id"] / x["episode_id"] / "prm.jsonl")
            .read_text()
            .splitlines()
        ]
        assert [r["score"] for r in recorded if r["step"] == x["step"]] == [x["prm_score"]]
    for m in metrics:
        batch = [x for x in lines if x["version"] == m["version"]]
        expected = _expected_advantages(batch, coef)
        for x in batch:
            assert x["advantage"] == pytest.approx(expected[(x["episode_id"], x["step"])], abs=1e-5)
        assert m["prm.steps_scored"] + m["prm.steps_invalid"] == len(batch) == m["samples"]
        assert m["prm.steps_missing"] == 0 and m["prm.invalid_vote_rate"] >= 0
        assert 0 <= m["prm.agreement"] <= 1 and "prm.judge_latency_mean_s" in m
    assert " agree " in stdout  # the PRM's columns in the update table


def test_prm_rl_with_the_tiny_model_as_judge_counts_invalid_votes(tmp_path, tiny_ckpt):
    """The tiny random model never boxes a score: every vote is invalid, counted; nothing crashes, and the
    steps train on their outcome alone."""
    run_dir, _ = _prm_train(tmp_path, tiny_ckpt, updates=1)
    (m,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert m["prm.steps_invalid"] == m["samples"] >= 4 and m["prm.steps_scored"] == 0
    assert m["outcome_only_steps"] == m["samples"]
    recorded = [
        json.loads(r) for p in run_dir.glob("episodes/*/*/prm.jsonl") for r in p.read_text().splitlines()
    ]
    assert recorded and all(r["score"] is None and r["invalid"] == r["votes"] == 2 for r in recorded)
    assert all(set(r["invalid_reasons"]) <= {"no_box", "not_a_score", "empty"} for r in recorded)


def test_a_prm_killed_mid_run_stalls_nobody(tmp_path, tiny_ckpt):
    """SIGKILL the PRM after the first update (a slow judge, so transitions are queued there): the env
    workers keep acting (their transitions wait in their own queues), the learner marks the lost steps'
    scores missing after the timeout, and the restarted PRM judges again."""
    run_dir, stdout = _prm_train(
        tmp_path,
        tiny_ckpt,
        "prm.backend=scripted",
        "prm.scripted.latency_s=1.5",
        "prm.max_concurrency=1",
        "prm.score_timeout_s=6",
        "train.fault_kill_prm_at_version=1",
        updates=3,
    )
    assert "fault injection: SIGKILLed the PRM" in stdout and "actor prm exited" in stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 3 and summary["env_errors"] == 0  # a lost judge is never an env fault
    lines = [json.loads(x) for x in (run_dir / "advantages.jsonl").read_text().splitlines()]
    assert {x["prm_status"] for x in lines} <= {"scored", "missing"}
    assert any(x["prm_status"] == "scored" for x in lines if x["version"] == 3)  # judging resumed


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
