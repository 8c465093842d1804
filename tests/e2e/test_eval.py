"""`guirl eval` end to end: real actor processes, real local desktops, real evaluators.

- the scripted backend playing the reference solutions scores 100 % on tasks/local/test.json, even with a
  VM killed mid-episode (that episode is retried elsewhere and counted as an environment error);
- OSWorld's pyautogui action space (programs composed from typed actions, run through `/execute`);
- the tiny Qwen3-VL through the hf backend runs every task to an end state;
- bad configuration and bad task lists fail fast with a clear message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]
CONFIG = str(ROOT / "configs" / "local_eval.toml")
BASIC = ("--domain", "terminal", "--domain", "text_editor", "--domain", "spreadsheet")
"""The shipped test list's three light applications (6 tasks: xterm, Mousepad, Calc), for the runs that are
about the eval loop rather than the suite."""
# fast heartbeats, but 5 s of silence before a peer is declared dead: none of these runs is about liveness,
# and a loaded machine (the other test worker's chaos run) can starve a process of CPU for a second
FAST = [
    *("--set", "runtime.heartbeat_interval_s=0.25", "--set", "runtime.heartbeat_liveness=20"),
    *("--set", "logging.level=WARNING"),
]


def _env() -> dict[str, str]:
    # OpenClaw-RL's GUI-RL variables of whoever runs the tests must not leak into the runs
    return {k: v for k, v in os.environ.items() if k not in ENV_VARS}


def _eval(tmp_path: Path, *args: str, timeout: float = 400) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [*GUIRL, "eval", "--config", CONFIG, "--set", f"run.root_dir={tmp_path}", *FAST, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT)
    found = list(tmp_path.glob("*/summary.json"))
    summary = json.loads(found[0].read_text()) if len(found) == 1 else {}
    return out, summary


def _episodes(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("episodes/*/*/result.json"))]


def test_scripted_reference_solutions_score_100_even_with_a_vm_killed(tmp_path):
    """The shipped test list's light applications (the whole suite, every application, is played in both
    action spaces by tests/integration/test_shipped_tasks.py and `bench/local_suite.py`)."""
    meta = json.loads((ROOT / "tasks" / "local" / "test.json").read_text())
    n = sum(len(meta[d]) for d in BASIC[1::2])
    out, summary = _eval(
        tmp_path, "--backend", "scripted", "--max-steps", "15", "--set", "faults.kill_vm_at_step=1", *BASIC
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert summary["tasks"] == n == 6 and summary["accuracy"] == 1.0, summary
    assert set(summary["domains"]) == {*BASIC[1::2], "all"}
    # the killed VM's episode: an environment error, retried once, never a policy failure
    assert summary["env_errors"] == 1 and summary["aborted"] == 0 and summary["episodes"] == n + 1
    retried = [r for r in summary["results"] if r["attempts"] == 2]
    assert len(retried) == 1 and retried[0]["score"] == 1.0 and len(retried[0]["env_errors"]) == 1
    # the infeasible task is solved by FAIL, not by time
    assert summary["outcomes"] == {"done": n - 1, "fail": 1}
    # the progress display and the result table
    assert f"[eval] {n}/{n} tasks" in out.stdout and "accuracy" in out.stdout and "100.0%" in out.stdout
    run_dir = Path(summary["run_dir"])
    episodes = _episodes(run_dir)
    assert len(episodes) == n + 1
    assert sorted(e["status"] for e in episodes) == ["completed"] * n + ["retried"]
    broken = next(e for e in episodes if e["status"] == "retried")
    assert broken["outcome"] == "env_error" and broken["score"] is None and "VM" in broken["env_error"]
    done = next(e for e in episodes if e["task_id"] == "terminal-echo-hello" and e["status"] == "completed")
    ep_dir = run_dir / "episodes" / "terminal-echo-hello" / done["episode_id"]
    lines = [json.loads(x) for x in (ep_dir / "traj.jsonl").read_text().splitlines()]
    assert len(lines) == done["steps"] and lines[-1]["actions"] == [{"type": "done"}]
    for line in lines:
        assert (ep_dir / line["screenshot"]).read_bytes().startswith(b"\x89PNG")
        assert line["prompt"][0]["role"] == "system" and "timing" in line and line["response"]
    assert (ep_dir / "final.png").exists()
    assert (run_dir / "config.toml").exists() or any(run_dir.glob("config*"))
    # behaviour cloning (guirl sft's sft.run_dirs) rebuilds every step of the successful episodes
    from guirl.fileio import cache_dir
    from guirl.inference.chat import ChatRenderer
    from guirl.model.tiny import ensure_tiny_checkpoint
    from guirl.sft import episode_samples

    renderer = ChatRenderer.load(ensure_tiny_checkpoint(cache_dir("tiny-qwen3vl")))  # the one `tiny` names
    problems: list[str] = []
    samples = episode_samples(run_dir, renderer, problems=problems)
    assert problems == [] and len(samples) == sum(e["steps"] for e in episodes if e["status"] == "completed")
    multi = [s for s in samples if s.step >= 2]
    assert multi and all(len(s.images) == 3 for s in multi)  # two history screens and the current one
    assert all(s.response_ids[-1] == renderer.tokenizer.convert_tokens_to_ids("<|im_end|>") for s in samples)


def _suite_with_an_unsupported_task(root: Path) -> Path:
    """The shipped terminal tasks, plus one whose metric guirl does not have."""
    src = ROOT / "tasks" / "local"
    ids = json.loads((src / "test.json").read_text())["terminal"]
    (root / "examples" / "terminal").mkdir(parents=True)
    for i in ids:
        (root / "examples" / "terminal" / f"{i}.json").write_text(
            (src / "examples" / "terminal" / f"{i}.json").read_text()
        )
    task = json.loads((src / "examples" / "terminal" / f"{ids[0]}.json").read_text())
    task["id"] = "terminal-unscorable"
    task["evaluator"] = {
        "func": "no_such_metric",
        "result": {"type": "vm_file", "path": "/tmp/x", "dest": "x"},
    }
    (root / "examples" / "terminal" / "terminal-unscorable.json").write_text(json.dumps(task))
    (root / "list.json").write_text(json.dumps({"terminal": [*ids, "terminal-unscorable"]}))
    return root / "list.json"


def test_pyautogui_action_space_and_a_suite_with_an_unsupported_task(tmp_path):
    """A suite with a task guirl cannot score is refused before anything starts, naming the task and what
    it lacks; with --skip-unsupported the task is listed as skipped (never run, never scored) and the rest
    run, here in OSWorld's pyautogui action space."""
    suite = _suite_with_an_unsupported_task(tmp_path / "suite")
    runs = tmp_path / "runs"
    args = ["--backend", "scripted", "--max-steps", "15", "--tasks", str(suite)]
    out, _ = _eval(runs, *args)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "1 of 4 tasks need what guirl does not implement" in out.stderr
    assert (
        "terminal/terminal-unscorable: metric:no_such_metric" in out.stderr
        and "--skip-unsupported" in out.stderr
    )
    assert not runs.exists() or not any(runs.iterdir())  # refused before any run directory or VM

    out, summary = _eval(
        runs,
        *args,
        "--skip-unsupported",
        "--set",
        "env.action_space=pyautogui",
        "--set",
        "env.vms_per_worker=1",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert summary["tasks"] == 3 and summary["accuracy"] == 1.0 and summary["env_errors"] == 0, summary
    assert summary["skipped"] == [
        {"task_id": "terminal-unscorable", "domain": "terminal", "missing": ["metric:no_such_metric"]}
    ]
    assert summary["episodes"] == 3  # never played
    terminal = summary["domains"]["terminal"]
    assert (terminal["tasks"], terminal["scored"], terminal["skipped"], terminal["aborted"]) == (4, 3, 1, 0)
    assert "skipped" in out.stdout and "1 unsupported tasks skipped" in out.stdout


def test_tiny_model_runs_every_task_to_an_end_state(tmp_path, tiny_ckpt):
    out, summary = _eval(tmp_path, "--ckpt", tiny_ckpt, "--max-steps", "3", *BASIC)
    assert out.returncode == 0, out.stderr[-3000:]
    assert summary["tasks"] == 6 and summary["aborted"] == 0 and summary["env_errors"] == 0, summary
    assert all(r["status"] == "completed" and r["score"] is not None for r in summary["results"])
    assert summary["accuracy"] is not None and 0.0 <= summary["accuracy"] <= 1.0
    # a random model's text is a policy failure when it does not parse, never an environment error
    assert set(summary["outcomes"]) <= {"parse_error", "truncated", "done", "fail"}
    for ep in _episodes(Path(summary["run_dir"])):
        traj = Path(summary["run_dir"]) / "episodes" / ep["task_id"] / ep["episode_id"] / "traj.jsonl"
        first = json.loads(traj.read_text().splitlines()[0])
        assert first["engine"] == "hf0" and first["policy_version"] == -1
        assert first["prompt_tokens"] > 0 and 0 < first["response_tokens"] <= 48
    # behaviour cloning rebuilds each step's prompt to the very tokens the engine saw
    from guirl.inference.chat import ChatRenderer
    from guirl.sft import episode_samples

    run_dir = Path(summary["run_dir"])
    samples = episode_samples(run_dir, ChatRenderer.load(tiny_ckpt), min_score=0.0)
    assert len(samples) == sum(r["steps"] for r in summary["results"])
    for s in samples:
        traj = run_dir / "episodes" / s.group_id / s.episode_id / "traj.jsonl"
        line = json.loads(traj.read_text().splitlines()[s.step])
        assert len(s.prompt_ids) == line["prompt_tokens"]


def test_bad_inputs_fail_fast_with_a_clear_message(tmp_path):
    out, _ = _eval(tmp_path, "--ckpt", "")
    assert out.returncode == 2 and "no policy checkpoint" in out.stderr
    out, _ = _eval(tmp_path, "--ckpt", str(tmp_path))
    assert out.returncode == 2 and "not a checkpoint directory" in out.stderr
    bad = tmp_path / "list.json"
    bad.write_text('{"terminal": ["../../secret"]}')
    out, _ = _eval(tmp_path, "--backend", "scripted", "--tasks", str(bad))
    assert out.returncode == 2 and "plain file name" in out.stderr
    out, _ = _eval(tmp_path, "--backend", "scripted", "--domain", "nope")
    assert out.returncode == 2 and "no domain" in out.stderr
    out, _ = _eval(tmp_path, "--backend", "scripted", "--set", "env.workers=0")
    assert out.returncode == 2 and "env.workers" in out.stderr
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # nothing started, no run directory left


def test_an_interrupted_eval_resumes_and_runs_are_listed(tmp_path):
    """An eval cut short (here: stopped after its first 2 tasks) is finished with `--resume`: the tasks it
    scored are kept, not played again, the rest run with new episode ids, and one summary holds all six;
    `guirl runs` lists it and `guirl runs show` prints its table again."""
    out, first = _eval(tmp_path, "--backend", "scripted", "--max-steps", "15", "--limit", "2", *BASIC)
    assert out.returncode == 0, out.stderr[-3000:]
    assert first["tasks"] == 2 and first["accuracy"] == 1.0
    (run_dir,) = (p.parent for p in tmp_path.glob("*/summary.json"))
    kept = {r["task_id"]: r["episode_id"] for r in first["results"]}
    cmd = [*GUIRL, "eval", "--resume", str(run_dir), "--set", "eval.limit=0", *FAST]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 task(s) scored earlier are kept, 4 to run" in out.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"] == 6 and summary["accuracy"] == 1.0 and summary["resumed_with"] == 2
    # both sessions' episodes and steps: the kept tasks were not played again (an episode an environment
    # fault ended is played again under a new id: counted, and counted as an env error)
    assert summary["episodes"] - summary["env_errors"] == first["episodes"] - first["env_errors"] + 4 == 6
    played = sum(r["steps"] for r in summary["results"])  # the scored episodes'; + any retried one's
    assert summary["steps"] == played if summary["env_errors"] == 0 else summary["steps"] > played
    by_task = {r["task_id"]: r["episode_id"] for r in summary["results"]}
    assert all(by_task[t] == e for t, e in kept.items())
    assert len(set(by_task.values())) == 6  # no episode id reused
    # a finished eval resumed plays nothing and keeps its figures
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=_env(), cwd=tmp_path)
    assert out.returncode == 0 and "6 task(s) scored earlier are kept, 0 to run" in out.stdout, out.stderr
    again = json.loads((run_dir / "summary.json").read_text())
    assert {k: again[k] for k in ("tasks", "accuracy", "episodes", "steps")} == {
        k: summary[k] for k in ("tasks", "accuracy", "episodes", "steps")
    }
    # the runs under the results directory, and the run's table again
    listed = subprocess.run([*GUIRL, "runs", str(tmp_path)], capture_output=True, text=True, env=_env())
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(run_dir.name)]
    assert row.split()[1:2] == ["eval"] and " done " in row and "accuracy 100.0%, all (0) 100.0%" in row
    shown = subprocess.run([*GUIRL, "runs", "show", str(run_dir)], capture_output=True, text=True, env=_env())
    assert shown.returncode == 0, shown.stderr
    assert "all                      6      6       6       0       0    100.0%    100.0%" in shown.stdout
    # a directory that is no run is refused
    out = subprocess.run(
        [*GUIRL, "eval", "--resume", str(tmp_path)], capture_output=True, text=True, env=_env(), cwd=tmp_path
    )
    assert out.returncode == 2 and "not a run directory" in out.stderr
