"""The standing chaos suite: real runs on local desktops — `guirl train` in RL and PRM+RL mode (broker with
the tiny model, learner, PRM, env worker) and `guirl eval` of the scripted reference solutions — each under
a seeded fault schedule of SIGKILLs and SIGSTOP/SIGCONTs of every actor kind and of desktops, with a hostile
peer sending malformed messages to every actor throughout; every invariant of `guirl.chaos.check_run` must
hold. A failing seed prints the schedule and the command that reproduces it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from guirl.chaos import Schedule, check_run

GAP_BOUND_S = 60.0
"""No env step for longer than this: detection (3 s of missed heartbeats) + an actor's restart (the
broker loads its model: ~10 s on 2 cores, the learner ~10 s) + one episode (2 steps) + a SIGSTOP's hold
(<= 4 s), with room for a slow CI machine."""


TRAIN_RUNS = [
    # seed 32: the broker killed mid-broadcast and again, the learner SIGSTOPped, the env worker (mid-run)
    # and a desktop killed
    pytest.param("rl", 32, 6, 5, 20.0, id="rl-32"),
    # seed 59: the learner killed mid-checkpoint, the PRM killed twice while judging, the env worker
    # SIGSTOPped for 3.65 s (declared dead: its episodes played again, its late ends refused)
    pytest.param("prm", 59, 4, 4, 15.0, id="prm-59"),
]


@pytest.mark.parametrize(("mode", "seed", "updates", "faults", "span"), TRAIN_RUNS)
def test_a_train_run_under_chaos_keeps_every_invariant(
    tmp_path, tiny_ckpt, mode, seed, updates, faults, span
):
    """One run of `bench/chaos.py` (so the soak cannot rot): RL with the tiny model, and PRM+RL with the
    tiny model as policy and judge."""
    from bench.chaos import one_run

    args = argparse.Namespace(updates=updates, faults=faults, span=span, gap_bound=GAP_BOUND_S, mode=mode)
    result = one_run(args, seed, tiny_ckpt, tmp_path)
    reproduce = (
        f"reproduce: python bench/chaos.py --mode {mode} --seed {seed} --minutes 0 --updates {updates}"
    )
    reproduce += f" --faults {faults} --span {span:g}"
    assert result["violations"] == [], (
        f"{result.get('schedule', '')}\n{reproduce}\n{json.dumps(result, indent=1)}"
    )
    run_dir = Path(result["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "chaos.jsonl").read_text().splitlines()]
    injected = [x for x in lines if not x["done"].startswith("not injected")]
    assert len(lines) == faults and len(injected) >= 2  # the rest listed: the run may end before they are due
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["chaos"]["injected"] == len(injected) and summary["final_version"] == updates


@pytest.mark.parametrize("seed", [3])
def test_scripted_solutions_score_100_under_chaos(tmp_path, tiny_ckpt, seed):
    """An eval run of the scripted reference solutions under a seeded schedule (seed 3: the env worker
    killed and SIGSTOPped, a desktop and the broker killed): every invariant holds and the accuracy is the
    100 % it is without faults (`bench.chaos.one_run` checks it), every faulted episode played again."""
    from bench.chaos import one_run

    args = argparse.Namespace(faults=4, span=15.0, gap_bound=GAP_BOUND_S, mode="eval", updates=0)
    result = one_run(args, seed, tiny_ckpt, tmp_path)
    reproduce = f"reproduce: python bench/chaos.py --mode eval --seed {seed} --minutes 0 --faults 4 --span 15"
    assert result["violations"] == [], (
        f"{result.get('schedule', '')}\n{reproduce}\n{json.dumps(result, indent=1)}"
    )
    summary = json.loads((Path(result["run_dir"]) / "summary.json").read_text())
    assert summary["accuracy"] == 1.0 and summary["tasks"] == 6 and summary["chaos"]["injected"] >= 2
    retried = [r for r in summary["results"] if r["attempts"] > 1]
    assert summary["env_errors"] == sum(len(r["env_errors"]) for r in summary["results"])
    assert all(r["score"] == 1.0 for r in retried)


def test_a_schedule_is_its_seed():
    a = Schedule.generate(7, targets=["broker", "learner", "worker0", "vm"], n_faults=8, span_s=60)
    b = Schedule.generate(7, targets=["broker", "learner", "worker0", "vm"], n_faults=8, span_s=60)
    assert a == b and a.describe() == b.describe() and "chaos seed 7: 8 faults" in a.describe()
    assert [f.at_s for f in a.faults] == sorted(f.at_s for f in a.faults)
    assert all(f.kind == "kill" for f in a.faults if f.target == "vm")
    assert all(0.5 <= f.hold_s <= 4.0 for f in a.faults if f.kind == "stop")
    with pytest.raises(ValueError):
        Schedule.generate(7, targets=[], n_faults=1, span_s=60)
    # busy faults come from a stream of their own: the seed's other faults stay as they were
    busy = Schedule.generate(
        7, targets=["broker", "learner", "worker0", "vm"], n_faults=8, span_s=60, n_busy=3, busy_hold_s=(2, 4)
    )
    assert [f for f in busy.faults if f.kind != "busy"] == a.faults
    held = [f for f in busy.faults if f.kind == "busy"]
    assert len(held) == 3 and all(f.target in ("broker", "learner") and 2 <= f.hold_s <= 4 for f in held)
    assert [f.at_s for f in busy.faults] == sorted(f.at_s for f in busy.faults)
    with pytest.raises(ValueError, match="busy faults need"):
        Schedule.generate(7, targets=["worker0", "vm"], n_faults=1, span_s=60, n_busy=1)


def test_the_checker_finds_what_a_broken_run_did(tmp_path):
    """Each invariant, broken on purpose in a run directory written by hand, is reported."""
    run = tmp_path
    (run / "summary.json").write_text(json.dumps({"final_version": 2}))
    (run / "lineage.json").write_text(json.dumps({"forks": [0, 1]}))
    ledger = [
        {"kind": "assigned", "episode_id": "e1"},
        {"kind": "ended", "episode_id": "e1", "status": "completed", "env_error": ""},
        {"kind": "assigned", "episode_id": "e2"},
        {"kind": "ended", "episode_id": "e2", "status": "retried", "env_error": "VM died"},
        {"kind": "assigned", "episode_id": "e3"},  # never ended
        {"kind": "ended", "episode_id": "e4", "status": "completed", "env_error": ""},  # never handed out
        {"kind": "assigned", "episode_id": "e7"},
        {"kind": "ended", "episode_id": "e7", "status": "completed", "env_error": ""},
        {"kind": "assigned", "episode_id": "e6"},
        {"kind": "ended", "episode_id": "e6", "status": "retried", "env_error": "VM died", "score": 0.0},
    ]
    (run / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ledger))
    trained = [
        {"version": 1, "epoch": 0, "episodes": {"e1": [[0, 0]]}},
        # version 2 of epoch 0 died with its learner (epoch 1 began from version 1): e7 trained again is not
        # trained twice
        {"version": 2, "epoch": 0, "episodes": {"e7": [[0, 1]]}},
        {
            "version": 2,
            "epoch": 1,
            "episodes": {"e1": [[0, 0]], "e2": [[0, 1]], "e5": [[0, 2]], "e7": [[1, 1]]},
        },
    ]
    (run / "trained.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trained))
    ep = run / "episodes" / "t" / "e1"
    ep.mkdir(parents=True)
    (ep / "traj.jsonl").write_text(json.dumps({"time": 100.0}) + "\n" + json.dumps({"time": 190.0}) + "\n")
    report = check_run(run, updates=3, max_gap_s=60)
    text = "\n".join(report["violations"])
    assert "ended at version 2, not 3" in text
    assert "episode e3 has 0 end states" in text and "e4 ended without being handed out" in text
    assert "e1 trained twice" in text and "e2 ended in a fault but was trained" in text
    assert "episode e5: a step of version 2 (epoch 0)" in text  # past epoch 1's fork at version 1
    assert "90.0 s without an env step" in text
    assert "e6 ended in an environment fault but was scored" in text
    assert "e7 trained twice" not in text
    assert report["max_gap_s"] == 90.0
