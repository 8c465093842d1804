"""A recorded run re-driven end to end with `guirl eval` on replayed desktops (`env.provider = "replay"`).

First a real run: the scripted backend plays the reference solutions of the shipped terminal tasks on real
local desktops, scored by their evaluators. Then `guirl eval` again on desktops replaying that run, with a
policy that takes the recorded actions on two tasks and other actions on the third: the two are scored by
the recording (the same scores, the recorded screens shown), the third leaves the recording and ends as an
environment error, aborted at once with the reason — never scored as a policy failure — and the
tasks with no recording (text_editor's) are listed as skipped, never played.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.e2e.test_eval import FAST, GUIRL, ROOT, _env, _episodes, _eval


def test_a_recorded_run_re_driven_on_replayed_desktops(tmp_path):
    out, recorded = _eval(
        tmp_path / "recorded", "--backend", "scripted", "--max-steps", "15", "--domain", "terminal"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert recorded["tasks"] == 3 and recorded["accuracy"] == 1.0, recorded
    recorded_dir = Path(recorded["run_dir"])

    scripts = tmp_path / "scripts"
    shutil.copytree(ROOT / "tasks" / "local" / "solutions", scripts)
    (scripts / "terminal-echo-hello.jsonl").write_text(  # another policy on this task
        json.dumps({"type": "type", "text": "echo goodbye\n"}) + "\n" + json.dumps({"type": "done"}) + "\n"
    )
    out, replayed = _eval(
        tmp_path / "replayed",
        "--backend",
        "scripted",
        "--max-steps",
        "15",
        "--domain",
        "terminal",
        "--domain",
        "text_editor",
        "--skip-unsupported",
        *("--set", f"inference.scripted.dir={scripts}"),
        *("--set", "env.provider=replay", "--set", f"env.replay.run={recorded_dir}"),
        *("--set", "env.action_space=computer_use"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["task_id"]: r for r in replayed["results"]}
    assert results["terminal-rename"]["score"] == 1.0
    assert results["terminal-infeasible-photoshop"]["score"] == 1.0  # FAIL, as recorded
    hello = results["terminal-echo-hello"]
    # aborted at once: another attempt could only match the recording by luck
    assert hello["status"] == "aborted" and hello["score"] is None and len(hello["env_errors"]) == 1
    assert "left recording terminal-echo-hello/" in hello["env_errors"][0], hello
    assert replayed["env_errors"] == 1 and replayed["aborted"] == 1
    assert replayed["skipped"] == [
        {"task_id": t, "domain": "text_editor", "missing": ["recording"]}
        for t in ("editor-append-line", "editor-delete-line")
    ]

    # the replayed desktops showed the recorded screens, and the scores came from the recording
    run_dir = Path(replayed["run_dir"])
    scored = [e for e in _episodes(run_dir) if e["status"] == "completed"]
    assert len(scored) == 2
    for e in scored:
        assert e["evaluation"]["replayed"].startswith(e["task_id"] + "/")
        source = recorded_dir / "episodes" / e["evaluation"]["replayed"]
        mine = run_dir / "episodes" / e["task_id"] / e["episode_id"]
        for step in range(e["steps"]):
            name = f"step_{step:03d}.png"
            assert (mine / name).read_bytes() == (source / name).read_bytes()
    pools = [json.loads(p.read_text()) for p in run_dir.glob("pools/*.json")]
    assert sum(p["replay"]["scored"] for p in pools) == 2 and sum(p["replay"]["diverged"] for p in pools) == 1


def test_a_simulated_learner_trains_on_replayed_desktops(tmp_path):
    """`guirl train` with no model anywhere (`train.simulated_update_s`, the scripted backend's tokens):
    the learner's intake, groups, advantages, versions, checkpoints and weight files are the real ones;
    only the update is a timed wait. Every version reaches the engines, and nothing is dropped as stale."""
    from guirl.testing.recording import write_recording

    # 20-step episodes: a trajectory of 82 wire frames (4 per step), which a codec limit of 64 frames once
    # refused, crashing the env worker at every hand-over
    rec = write_recording(tmp_path / "recording", tasks=4, steps=20, size=(1280, 800), distinct_screens=20)
    cmd = [
        *GUIRL,
        "train",
        "--config",
        str(ROOT / "configs" / "local_rl.toml"),
        *FAST,
        *("--set", f"run.root_dir={tmp_path / 'runs'}", "--set", "inference.backend=scripted"),
        *("--set", "inference.scripted.tokens=true", "--set", f"inference.scripted.dir={rec['scripts']}"),
        *("--set", "env.provider=replay", "--set", f"env.replay.run={tmp_path / 'recording'}"),
        *("--set", f"train.tasks={rec['suite']}", "--set", "train.domains=[]", "--set", "train.updates=3"),
        *("--set", "train.simulated_update_s=0.5", "--set", "train.max_staleness=1"),
        *("--set", "env.max_envs=4", "--set", "env.prewarm_envs=4", "--set", "agent.max_steps=24"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "simulated update" in out.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [json.loads(x) for x in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [t["version"] for t in trained] == [1, 2, 3]
    for m, t in zip(metrics, trained, strict=True):
        assert m["simulated_update_s"] == 0.5 and m["update_s"] >= 0.5 and m["groups"] == 2
        assert m["samples"] == sum(len(steps) for steps in t["episodes"].values())  # every step, as tokens
        # each prompt holds its screen as Qwen3-VL's tokens (640x384 after agent.max_pixels: 20 x 12)
        assert m["prompt_tokens"] >= m["samples"] * 20 * 12
        # 20 screens each (26-57 KB resized), sent once, and token ids: 0.5 to 1.6 MB a trajectory
        received = m["trajectories_received"]
        assert received * 500_000 < m["trajectories_bytes"] < received * 1_600_000
    assert metrics[-1]["buffer.steps.stale_dropped"] == 0
    # the engines took a version the learner made: episodes were played on it
    played = {
        json.loads(line)["policy_version"]
        for traj in run_dir.glob("episodes/*/*/traj.jsonl")
        for line in traj.read_text().splitlines()
    }
    assert max(played) >= 1, played
    assert (run_dir / "weights" / "v000003" / "model.safetensors").is_file()
    marker = run_dir / "checkpoints" / "v000003" / "simulated.json"
    assert json.loads(marker.read_text()) == {"update_s": 0.5}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_version"] == 3 and summary["env_errors"] == 0, summary
