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
from pathlib import Path

from tests.e2e.test_eval import ROOT, _episodes, _eval


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
