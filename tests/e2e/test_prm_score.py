"""`guirl prm score RUN_DIR` end to end, on the episodes of a real eval run (scripted policy, local desktops).

One eval run per module: `terminal-echo-hello` played to success (5 steps), `terminal-rename` ending in a
response that does not parse at its third step (a failure, and a step judged with the same screen after).
The scripted judge's verdicts are known (`scripted_verdict`), so every number is checked by hand:
- every step of every episode gets a line with its verdict, and the summary adds up;
- a second scoring does not clobber the first without --overwrite; invalid votes are counted, never scores;
- a damaged copy of the run (a traj line that is not JSON, a truncated screenshot, a missing one, no saved
  config) is scored as far as it can be, with warnings; a directory that is not a run is refused (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS
from guirl.inference.scripted import scripted_verdict

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]
# fast heartbeats, but 5 s of silence before a peer is declared dead: none of these runs is about liveness,
# and a loaded machine (the other test worker's chaos run) can starve a process of CPU for a second
FAST = [
    *("--set", "runtime.heartbeat_interval_s=0.25", "--set", "runtime.heartbeat_liveness=20"),
    *("--set", "logging.level=WARNING"),
]
JUDGE = ["--set", "prm.backend=scripted", *FAST]
OUT = "prm_offline.jsonl"


def _env() -> dict[str, str]:
    # OpenClaw-RL's GUI-RL variables of whoever runs the tests must not leak into the runs
    return {k: v for k, v in os.environ.items() if k not in ENV_VARS}


def _guirl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GUIRL, *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT
    )


def _score(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return _guirl("prm", "score", str(run_dir), *JUDGE, *args)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _episodes(run_dir: Path) -> list[Path]:
    return sorted(p.parent for p in run_dir.glob("episodes/*/*/traj.jsonl"))


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("prm_score")
    scripts = base / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "tasks/local/solutions/terminal-echo-hello.jsonl", scripts)
    (scripts / "terminal-rename.jsonl").write_text(
        '{"type": "wait", "seconds": 0.2}\n{"type": "click", "x": 300, "y": 200}\n'
        '{"response": "I am not sure what to do next."}\n'
    )
    out = _guirl(
        "eval",
        "--config",
        str(ROOT / "configs" / "local_eval.toml"),
        "--backend",
        "scripted",
        "--domain",
        "terminal",
        "--limit",
        "2",
        "--max-steps",
        "15",
        "--set",
        f"run.root_dir={base / 'runs'}",
        "--set",
        f"inference.scripted.dir={scripts}",
        *FAST,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = (base / "runs").iterdir()
    results = {json.loads(p.read_text())["outcome"] for p in run_dir.glob("episodes/*/*/result.json")}
    assert results == {"done", "parse_error"}, results
    return run_dir


@pytest.fixture
def run_copy(eval_run, tmp_path) -> Path:
    """The eval run's folder for one test to score (and damage) on its own."""
    dest = tmp_path / "run"
    shutil.copytree(eval_run, dest, ignore=shutil.ignore_patterns("vms", "downloads"))
    return dest


def _expected(run_dir: Path, invalid_every: int = 0) -> dict:
    """The summary's numbers computed from the episode folders and the scripted judge's verdicts."""
    steps = pos = neg = none = agree = compared = 0
    for ep in _episodes(run_dir):
        result = json.loads((ep / "result.json").read_text())
        success = result["score"] >= 1.0
        for line in _lines(ep / "traj.jsonl"):
            steps += 1
            verdict = scripted_verdict(ep.name, line["step"], invalid_every)
            pos += verdict == 1
            neg += verdict == -1
            none += verdict is None
            if verdict is not None:
                compared += 1
                agree += (verdict > 0) == success
    return {"steps": steps, "+1": pos, "-1": neg, "none": none, "agree": agree, "compared": compared}


def test_every_step_gets_its_verdict_and_the_summary_adds_up(run_copy):
    out = _score(run_copy)
    assert out.returncode == 0, out.stderr[-3000:]
    episodes = _episodes(run_copy)
    assert len(episodes) == 2
    for ep in episodes:
        result = json.loads((ep / "result.json").read_text())
        traj = _lines(ep / "traj.jsonl")
        lines = _lines(ep / OUT)
        assert [x["step"] for x in lines] == [t["step"] for t in traj] == list(range(result["steps"]))
        for x in lines:
            assert x["score"] == float(scripted_verdict(ep.name, x["step"]))
            assert x["votes"] == 1 and x["invalid"] == 0 and x["errors"] == []
            assert (x["task_id"], x["episode_id"]) == (ep.parent.name, ep.name)
            assert (x["episode_outcome"], x["episode_score"]) == (result["outcome"], result["score"])
            assert x["template"].startswith("guirl-prm-v1@") and x["latency_s"] >= 0
        assert not (ep / "prm.jsonl").exists()  # the live PRM's file is never written
    want = _expected(run_copy)
    s = json.loads((run_copy / "prm_score_summary.json").read_text())
    assert s["episodes"] == 2 and s["episodes_skipped"] == 0 and s["skipped"] == []
    assert s["steps"] == s["steps_judged"] == want["steps"] == 8 and s["steps_bad_input"] == 0
    assert s["scores"] == {
        "+1": want["+1"],
        "-1": want["-1"],
        "other": 0,
        "no_valid_vote": 0,
        "judge_error": 0,
    }
    assert s["votes"] == 8 and s["invalid_votes"] == 0 and s["invalid_vote_rate"] == 0.0
    assert s["judge_errors"] == 0 and s["vote_errors"] == 0
    assert s["agreement"] == {
        "steps": want["compared"],
        "agree": want["agree"],
        "rate": round(want["agree"] / want["compared"], 4),
    }
    assert 0 <= s["latency_s"]["mean"] <= s["latency_s"]["max"]
    assert s["template"].startswith("guirl-prm-v1@") and s["judge"]["backend"] == "scripted"
    assert f"{want['agree']}/{want['compared']}" in out.stdout and "8 steps: 8 judged" in out.stdout

    # a second scoring refuses to clobber the first, and leaves it as it was
    before = {ep: (ep / OUT).read_bytes() for ep in episodes}
    summary = (run_copy / "prm_score_summary.json").read_bytes()
    again = _score(run_copy)
    assert again.returncode == 2 and "exists" in again.stderr and "--overwrite" in again.stderr, again.stderr
    assert {ep: (ep / OUT).read_bytes() for ep in episodes} == before
    assert (run_copy / "prm_score_summary.json").read_bytes() == summary
    again = _score(run_copy, "--overwrite")
    assert again.returncode == 0, again.stderr[-3000:]
    assert [_lines(ep / OUT)[-1]["score"] for ep in episodes] == [
        json.loads(before[ep].splitlines()[-1])["score"] for ep in episodes
    ]


def test_invalid_votes_are_counted_never_scored(run_copy):
    out = _score(run_copy, "--set", "prm.scripted.invalid_every=2", "--out", "judge_b.jsonl")
    assert out.returncode == 0, out.stderr[-3000:]
    want = _expected(run_copy, invalid_every=2)
    assert want["none"] > 0  # the scripted verdicts of these (episode, step) pairs include invalid ones
    for ep in _episodes(run_copy):
        assert not (ep / OUT).exists()
        for x in _lines(ep / "judge_b.jsonl"):
            verdict = scripted_verdict(ep.name, x["step"], 2)
            if verdict is None:
                assert x["score"] is None and x["invalid"] == x["votes"] == 1
                assert x["invalid_reasons"] == ["no_box"] and x["errors"] == []
            else:
                assert x["score"] == float(verdict) and x["invalid"] == 0
    s = json.loads((run_copy / "prm_score_summary.judge_b.json").read_text())
    assert s["out"] == "judge_b.jsonl" and not (run_copy / "prm_score_summary.json").exists()
    assert s["scores"]["no_valid_vote"] == s["invalid_votes"] == want["none"]
    assert s["scores"]["+1"] == want["+1"] and s["scores"]["-1"] == want["-1"]
    assert s["invalid_vote_rate"] == round(want["none"] / want["steps"], 4) and s["judge_errors"] == 0
    assert s["agreement"]["steps"] == want["compared"] and s["agreement"]["agree"] == want["agree"]


def test_damaged_run_is_scored_as_far_as_it_can_be(run_copy):
    from guirl.prm_offline import read_episode, transition

    done, failed = sorted(_episodes(run_copy), key=lambda ep: ep.parent.name)  # echo-hello, rename
    # a task not in the run's task lists: its instruction is the one the policy's prompt stated
    ep = read_episode(done, {}, warn=lambda _msg: None)
    task = json.loads((ROOT / "tasks/local/examples/terminal/terminal-echo-hello.json").read_text())
    assert ep.instruction == task["instruction"] and len(ep.steps) == 5 and ep.success is True
    t = transition(ep, 4, history_images=2, seed=7)  # the last step: the final screen after it
    assert bytes(t.after.data) == (done / "final.png").read_bytes() and t.before.width > 0
    assert [bytes(h.data) for h in t.history] == [(done / f"step_00{i}.png").read_bytes() for i in (2, 3)]
    assert t.previous_actions == [x["action_line"] for x in ep.steps[:4]] and t.seed == 7
    ep = read_episode(failed, {}, warn=lambda _msg: None)
    assert ep.outcome == "parse_error" and ep.success is False and "action_line" not in ep.steps[2]
    t = transition(ep, 2, history_images=0, seed=0)  # nothing was executed: the same screen after
    assert bytes(t.after.data) == bytes(t.before.data) == (failed / "step_002.png").read_bytes()
    t = transition(ep, 1, history_images=0, seed=0)
    assert bytes(t.after.data) == (failed / "step_002.png").read_bytes() and t.history == []
    # two intact copies of the finished episode, one of them then missing a screenshot
    spare, holed = done.parent / "ep90000", done.parent / "ep90001"
    shutil.copytree(done, spare)
    shutil.copytree(done, holed)
    (holed / "step_003.png").unlink()
    png = done / "step_001.png"  # the screen after step 0 and before step 1
    png.write_bytes(png.read_bytes()[:200])
    traj = failed / "traj.jsonl"
    lines = traj.read_text().splitlines()
    traj.write_text("\n".join([lines[0], '{"step": 1, "resp', *lines[2:]]) + "\n")
    (run_copy / "config.toml").unlink()  # no task lists: instructions come from the prompts

    out = _score(run_copy)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{traj}:2: not a JSON line" in out.stderr
    assert f"{holed / 'step_003.png'}: missing" in out.stderr
    assert "config.toml" in out.stderr and "read from the prompts" in out.stderr
    assert not (failed / OUT).exists() and not (holed / OUT).exists()
    assert [x["score"] for x in _lines(spare / OUT)] == [
        float(scripted_verdict("ep90000", i)) for i in range(5)
    ]
    scored = _lines(done / OUT)
    assert [x["step"] for x in scored] == list(range(5))
    bad = [x["step"] for x in scored if "bad_input" in x]
    assert bad == [0, 1] and all(x["score"] is None for x in scored[:2])
    assert "does not decode" in scored[0]["bad_input"]
    assert [x["score"] for x in scored[2:]] == [float(scripted_verdict(done.name, i)) for i in (2, 3, 4)]
    s = json.loads((run_copy / "prm_score_summary.json").read_text())
    assert s["episodes"] == 2 and s["episodes_skipped"] == 2 and len(s["skipped"]) == 2
    assert s["steps"] == 10 and s["steps_judged"] == 8 and s["steps_bad_input"] == 2
    assert s["scores"]["+1"] + s["scores"]["-1"] == 8


def test_not_a_run_directory_is_refused(tmp_path):
    out = _score(tmp_path)
    assert out.returncode == 2 and "not a run directory" in out.stderr and "episodes/" in out.stderr
    out = _score(tmp_path / "nowhere")
    assert out.returncode == 2 and "no such directory" in out.stderr
    (tmp_path / "episodes").mkdir()
    out = _score(tmp_path)
    assert out.returncode == 2 and "holds no episode" in out.stderr
    for name in ("traj.jsonl", "TRAJ.JSONL", "final.png", "cache", "../x.jsonl"):  # an episode's own files
        out = _score(tmp_path, "--out", name)
        assert out.returncode == 2 and "plain *.jsonl file name" in out.stderr
