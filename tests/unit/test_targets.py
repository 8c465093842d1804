"""The targets family: layouts drawn from seeds, and the suites `guirl tasks generate` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.cli.main import main
from guirl.vmpool import targets
from guirl.vmpool.apps import needed_apps
from guirl.vmpool.targets import COLOURS, KINDS, N_TARGETS, layout, parse_goals
from guirl.vmpool.tasks.check import check
from guirl.vmpool.tasks.generate import GenerateSpec, generate
from guirl.vmpool.tasks.model import load_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", KINDS)
def test_a_layout_is_its_seed_and_fits_the_screen(kind: str) -> None:
    seen = set()
    for seed in range(200):
        lay = layout(kind, seed, 640, 400)
        assert lay == layout(kind, seed, 640, 400)
        boxes = [*lay.targets, *([lay.button] if lay.button else []), *([lay.field] if lay.field else [])]
        for b in boxes:
            assert 0 <= b.x and b.x + b.w <= 640 and 0 <= b.y and b.y + b.h <= 400, (seed, b)
            assert b.w >= 40 and b.h >= 30  # a policy seeing the screen at 256x160 still sees it
        for i, a in enumerate(boxes):
            assert not any(a.overlaps(b, 0) for b in boxes[i + 1 :]), (seed, boxes)
        if kind == "type":
            assert lay.field is not None and not lay.targets and lay.expected == f"field {lay.goal}"
            seen.add((lay.goal, lay.field.centre))
        else:
            assert len(lay.targets) == N_TARGETS and len({t.label for t in lay.targets}) == N_TARGETS
            assert lay.goal_box().contains(*lay.goal_box().centre)
            seen.add((lay.goal, lay.goal_box().centre))
    assert len(seen) > 150  # the seeds draw different layouts


def test_bad_layout_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        layout("drag", 1, 640, 400)
    with pytest.raises(ValueError, match="too small"):
        layout("click", 1, 100, 100)
    with pytest.raises(ValueError, match="labels"):
        layout("click", 1, 640, 400, ("red", "green", "blue"))
    with pytest.raises(ValueError, match="labels"):
        layout("click", 1, 640, 400, ("red", "green", "blue", "mauve"))


def test_a_generated_suite_is_osworld_tasks_with_disjoint_splits(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    info = generate(GenerateSpec(str(out), train=12, test=6, kinds=["click", "type", "menu"], hard_labels=2))
    assert info["tasks"] == {"train.json": 12, "test.json": 6, "test-labels.json": 6}
    hard = set(info["hard_labels"])
    assert hard == set(list(COLOURS)[-2:])
    metas = {n: json.loads((out / n).read_text())["targets"] for n in info["tasks"]}
    assert not set(metas["train.json"]) & set(metas["test.json"])
    assert not set(metas["test-labels.json"]) & (set(metas["train.json"]) | set(metas["test.json"]))
    report = check([out / n for n in info["tasks"]])
    assert report.errors == [] and report.domains["targets"].supported == 24
    for name, ids in metas.items():
        for task_id in ids:
            task = load_task(out / "examples" / "targets" / f"{task_id}.json")
            assert {a.name for a in needed_apps(task)} == {"targets"}
            command = task.config[0].parameters["command"]
            args = dict(zip(command[3::2], command[4::2], strict=True))
            lay = layout(args["--kind"], int(args["--seed"]), 640, 400, tuple(args["--labels"].split(",")))
            assert task.instruction == lay.instruction
            assert task.evaluator.expected["rules"]["expected"] == lay.expected
            shown = {t.label for t in lay.targets}
            if name == "test-labels.json":
                assert lay.goal in hard
            else:
                assert not shown & hard and lay.goal not in hard  # never shown where they are held back
            steps = [json.loads(x) for x in (out / "solutions" / f"{task_id}.jsonl").read_text().splitlines()]
            if lay.kind == "type":
                assert steps == [{"type": "type", "text": lay.goal}]
            else:
                assert lay.goal_box().contains(steps[-1]["x"], steps[-1]["y"])
    # generating again replaces the suite; a directory that is not one is never overwritten
    assert generate(GenerateSpec(str(out), train=2, test=1))["tasks"] == {"train.json": 2, "test.json": 1}
    assert not (out / "test-labels.json").exists() and len(list((out / "solutions").iterdir())) == 3
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="not overwriting"):
        generate(GenerateSpec(str(tmp_path / "mine")))
    # a request that cannot be drawn leaves the suite there as it was, and nothing beside it
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ValueError, match="too small"):
        generate(GenerateSpec(str(out), train=2, test=1, width=100))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "suite"]


BAD_GENERATE = [
    (["--kinds", "click,drag"], "kinds"),
    (["--train", "0", "--test", "0"], "not both 0"),
    (["--hard-labels", "9"], "hard_labels"),
    (["--kinds", "type", "--hard-labels", "2"], "asks for colours"),
    (["--width", "100"], "too small"),
    (["--seed", "-1"], "seed"),
    (["--goals", "mauve"], "guirl tasks generate: goals: one or more of"),
    (["--goals", "cyan", "--hard-labels", "2"], "guirl tasks generate: goals:"),  # cyan: held back
    (["--out", "/proc/version"], "not overwriting"),
    (["--out", "/proc/guirl-suite"], "guirl tasks generate:"),
]


def _guirl(capsys, *argv: str) -> tuple[int, str]:
    """`guirl ARGV` in this process (a process per case cost the suite seconds each): its code and stderr."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    return code, capsys.readouterr().err


def test_tasks_generate_refuses_bad_requests_clearly(tmp_path: Path, capsys) -> None:
    for flags, message in BAD_GENERATE:
        code, err = _guirl(capsys, "tasks", "generate", "targets", "--out", str(tmp_path / "s"), *flags)
        assert code == 2 and message in err and "Traceback" not in err, (flags, err)
    assert not (tmp_path / "s").exists()


BAD_LEARN = [
    (["agent.response_format=computer_use"], "GUI-R1's format"),
    (["env.provider=aws"], "GUI-R1's format"),
    (["train.eval_every=0"], "train.eval_every"),
    (["--kinds", "click,drag"], "--kinds"),
    (["--kinds", "menu"], "two steps"),
    (["--kinds", "type"], "offers typing"),
    (["--test-tasks", "0"], "at least 1"),
    (["--goals", "red,mauve"], "guirl learn: --goals: one or more of"),
    (["--goals", ","], "guirl learn: --goals: one or more of"),
]


def test_guirl_learn_refuses_a_recipe_it_cannot_run_before_starting_anything(
    tmp_path: Path, capsys, monkeypatch, restore_root_logger
) -> None:
    # run in-process, `guirl learn` sets up logging (the fixture puts pytest's back) and an environment
    # variable (monkeypatch's record puts it back)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for sets, message in BAD_LEARN:
        flags = [x for x in sets if x.startswith("--") or not x.count("=")]  # flags, then settings
        args = [
            x
            for s in [f"run.root_dir={tmp_path}", *(s for s in sets if s not in flags)]
            for x in ("--set", s)
        ]
        code, err = _guirl(
            capsys, "learn", "--config", str(ROOT / "configs" / "desktop_learning.toml"), *args, *flags
        )
        assert code == 2 and message in err and "Traceback" not in err, (sets, err)
        assert list(tmp_path.iterdir()) == []  # no run directory


def test_the_default_draw_is_pinned() -> None:
    # what every suite generated so far was drawn from: a change to the default draws breaks them all
    lay = layout("click", 3, 640, 400)
    assert lay.goal == "brown"
    assert [(t.label, t.x, t.y, t.w, t.h) for t in lay.targets] == [
        ("yellow", 354, 246, 229, 133),
        ("brown", 64, 55, 243, 118),
        ("green", 347, 55, 233, 120),
        ("orange", 22, 212, 250, 127),
    ]
    lay = layout("menu", 5, 640, 400)
    assert lay.goal == "pink" and [t.label for t in lay.targets] == ["cyan", "purple", "green", "pink"]
    assert (lay.button.x, lay.button.y) == (280, 180) and (lay.targets[0].x, lay.targets[0].y) == (417, 51)


def test_goals_make_every_task_ask_for_those_colours_among_distractors(tmp_path: Path, monkeypatch) -> None:
    asked, distractors = set(), set()
    for seed in range(100):
        lay = layout("click", seed, 640, 400, goals=("red", "blue"))
        assert lay == layout("click", seed, 640, 400, goals=("red", "blue"))
        labels = [t.label for t in lay.targets]
        assert lay.goal in ("red", "blue") and len(set(labels)) == N_TARGETS and lay.goal in labels
        asked.add(lay.goal)
        distractors |= set(labels) - {lay.goal}
    assert asked == {"red", "blue"} and distractors == set(COLOURS)  # the other goal among them, at times
    cells = {layout("click", seed, 640, 400, goals=("red",)).goal_box().centre[0] < 320 for seed in range(40)}
    assert cells == {True, False}  # the goal's place is drawn, not fixed by its colour
    with pytest.raises(ValueError, match="goals"):
        layout("click", 1, 640, 400, ("red", "green", "blue", "orange"), goals=("pink",))
    with pytest.raises(ValueError, match="goals"):
        layout("click", 1, 640, 400, goals=())
    with pytest.raises(ValueError, match="labels"):
        layout("click", 1, 640, 400, ("red", "red", "green", "blue", "orange"))
    assert (
        parse_goals("any") is None
        and parse_goals(" red, blue ") == ("red", "blue")
        and parse_goals(",") == ()
    )

    out = tmp_path / "suite"
    info = generate(
        GenerateSpec(str(out), train=6, test=4, kinds=["click", "menu"], hard_labels=1, goals=["red"])
    )
    assert info["goals"] == ["red"]
    drawn: list = []
    monkeypatch.setattr(targets, "run_app", lambda lay, record: drawn.append(lay))
    for name in ("train.json", "test.json", "test-labels.json"):
        for task_id in json.loads((out / name).read_text())["targets"]:
            task = load_task(out / "examples" / "targets" / f"{task_id}.json")
            command = task.config[0].parameters["command"]
            assert command[:3] == ["python", "-m", "guirl.vmpool.targets"]
            assert targets.main(command[3:]) == 0  # the app, started as the task starts it
            lay = drawn.pop()
            assert task.instruction == lay.instruction
            assert task.evaluator.expected["rules"]["expected"] == lay.expected
            steps = [json.loads(x) for x in (out / "solutions" / f"{task_id}.jsonl").read_text().splitlines()]
            assert lay.goal_box().contains(steps[-1]["x"], steps[-1]["y"])  # its solution clicks the goal
            if name == "test-labels.json":
                assert (
                    "--goals" not in command and lay.goal == "black"
                )  # the hard split: its held-back colour
            else:
                assert "--goals" in command and lay.goal == "red"


def test_tasks_generate_goals_flag(tmp_path: Path, capsys) -> None:
    # the real command once, as a user starts it
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bin" / "guirl"),
            "tasks",
            "generate",
            "targets",
            "--out",
            str(tmp_path / "a"),
            "--train",
            "3",
            "--test",
            "1",
            "--goals",
            "red, blue",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "a" / "suite.json").read_text())["goals"] == ["red", "blue"]
    code, err = _guirl(
        capsys,
        "tasks",
        "generate",
        "targets",
        "--out",
        str(tmp_path / "b"),
        "--train",
        "3",
        "--test",
        "1",
        "--goals",
        "any",
    )
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "suite.json").read_text())["goals"] is None
    for task in (tmp_path / "b" / "examples" / "targets").iterdir():
        assert "--goals" not in json.loads(task.read_text())["config"][0]["parameters"]["command"]


def test_the_learn_summary_says_what_a_change_does_not_show() -> None:
    from guirl.learn import caveat, noise_points

    assert round(noise_points(0.781, 1.0, 32), 1) == 14.6
    assert caveat(0.781, 1.0, 32) == ""  # +21.9 points: more than two standard errors
    assert "within two standard errors" in caveat(0.594, 0.406, 32)  # -18.8 points, 24.6 of noise
    assert "no room" in caveat(1.0, 1.0, 32) and "no room" in caveat(1.0, 0.969, 32)
    assert caveat(1.0, 0.5, 32) == ""  # a real fall from the top is not explained away
    assert caveat(None, 0.5, 32) == "" and caveat(0.5, None, 32) == ""
