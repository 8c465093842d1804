"""`guirl train` end to end in PRM+RL mode: every step's score delivered and trained on as step-wise
advantages, the tiny model as a judge whose votes are all invalid, and the PRM killed mid-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]


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
        "faults.kill_prm_at_version=1",
        updates=3,
    )
    assert "fault injection: SIGKILLed the PRM" in stdout and "actor prm exited" in stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 3 and summary["env_errors"] == 0  # a lost judge is never an env fault
    lines = [json.loads(x) for x in (run_dir / "advantages.jsonl").read_text().splitlines()]
    assert {x["prm_status"] for x in lines} <= {"scored", "missing"}
    assert any(x["prm_status"] == "scored" for x in lines if x["version"] == 3)  # judging resumed
