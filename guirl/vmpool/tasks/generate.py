"""`guirl tasks generate`: suites of the targets family (`guirl/vmpool/targets.py`) in OSWorld's task format.

A generated suite is a directory like `tasks/local/`: `examples/targets/<id>.json` (each task launches the
targets app with its seed and scores the app's record with OSWorld's `vm_command_line` getter and
`exact_match` metric), `solutions/<id>.jsonl` (the reference solution: typed actions at the layout's
pixels), and meta lists:

- `train.json` — seeds from `seed`;
- `test.json` — held out: other seeds, the same labels (the policy has seen every colour, never these
  layouts);
- `test-labels.json` (with `hard_labels` > 0) — the harder split: the last `hard_labels` colours are never
  asked for or shown in `train.json`/`test.json`, and every task of this list asks for one of them.

With `goals`, every train and test task asks for one of those colours (the other targets are drawn from
the rest): "find the red one" instead of "read which colour is asked, then find it".

A task is generated for one screen size (the solution's pixels): run it on desktops of that size
(`env.screen_width`/`env.screen_height`); on another, the app refuses to start and the task's setup fails
(an environment fault, never a score). `suite.json` says how the suite was made.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from guirl.vmpool.targets import COLOURS, KINDS, TITLE, Layout, layout

DOMAIN = "targets"
HELD_OUT_OFFSET = 1_000_000
"""Held-out seeds start here (train seeds are below it): the splits never share a layout."""
HARD_OFFSET = 2_000_000


@dataclass
class GenerateSpec:
    out: str
    train: int = 256
    test: int = 64
    kinds: list[str] = field(default_factory=lambda: ["click"])
    width: int = 640
    height: int = 400
    seed: int = 0
    hard_labels: int = 0
    """Colours kept out of train and test for the harder `test-labels.json` split (0: no such split)."""
    goals: list[str] | None = None
    """The colours train and test tasks ask for (None: any colour drawn; the hard split: its own)."""


def task_json(
    lay: Layout, task_id: str, labels: tuple[str, ...], goals: tuple[str, ...] | None = None
) -> dict:
    """The OSWorld-format task of one layout."""
    app = [
        "python",
        "-m",
        "guirl.vmpool.targets",
        *("--kind", lay.kind, "--seed", str(lay.seed)),
        *("--width", str(lay.width), "--height", str(lay.height)),
        *("--labels", ",".join(labels)),
        *(("--goals", ",".join(goals)) if goals else ()),
    ]
    return {
        "id": task_id,
        "snapshot": "local",
        "instruction": lay.instruction,
        "source": "guirl tasks generate",
        "config": [
            {"type": "launch", "parameters": {"command": app}},
            # the app names its window once it covers the screen; never (a wrong screen size): a setup fault
            {
                "type": "execute",
                "parameters": {
                    "command": ["xdotool", "search", "--onlyvisible", "--name", f"^{TITLE}$"],
                    "until": {"returncode": 0},
                },
            },
        ],
        "related_apps": ["targets"],
        "evaluator": {
            "func": "exact_match",
            "result": {
                "type": "vm_command_line",
                "command": ["python", "-m", "guirl.vmpool.targets", "--read"],
            },
            "expected": {"type": "rule", "rules": {"expected": lay.expected}},
        },
    }


def solution(lay: Layout) -> list[dict]:
    """The reference solution's typed actions."""
    if lay.kind == "type":
        return [{"type": "type", "text": lay.goal}]
    x, y = lay.goal_box().centre
    opening = (
        []
        if lay.button is None
        else [{"type": "click", "x": lay.button.centre[0], "y": lay.button.centre[1]}]
    )
    return [*opening, {"type": "click", "x": x, "y": y}]


def generate(spec: GenerateSpec) -> dict:
    """Write the suite; returns what `suite.json` holds."""
    unknown = [k for k in spec.kinds if k not in KINDS]
    if unknown or not spec.kinds:
        raise ValueError(f"kinds: one or more of {', '.join(KINDS)} (got {spec.kinds})")
    if spec.train < 0 or spec.test < 0 or spec.train + spec.test == 0:
        raise ValueError("train and test: counts of tasks, not both 0")
    if not 0 <= spec.hard_labels <= len(COLOURS) - 4:
        raise ValueError(f"hard_labels: 0 to {len(COLOURS) - 4} (4 colours must stay for the other splits)")
    if spec.hard_labels and spec.kinds == ["type"]:
        raise ValueError("hard_labels: the harder split asks for colours (kinds click or menu)")
    if not 0 <= spec.seed < HELD_OUT_OFFSET - max(spec.train, 1):
        raise ValueError(f"seed: 0 to {HELD_OUT_OFFSET - max(spec.train, 1) - 1}")
    names = tuple(COLOURS)
    shown = names[: len(names) - spec.hard_labels]
    hard = names[len(names) - spec.hard_labels :]
    goals = tuple(spec.goals) if spec.goals is not None else None
    for kind in spec.kinds:  # the screen size, the labels and the goals (among those shown), before writing
        layout(kind, spec.seed, spec.width, spec.height, shown, goals)
    out = Path(spec.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not (out / "suite.json").is_file():
        raise ValueError(f"{out} is not empty and not a generated suite: not overwriting it")
    # written beside it, then swapped in: a failure leaves the old suite (or nothing) as it was
    build = out.with_name(f".{out.name}.new-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    (build / "examples" / DOMAIN).mkdir(parents=True)
    (build / "solutions").mkdir(parents=True)

    def write(split: str, seeds: range, labels: tuple[str, ...], pick: tuple[str, ...] = ()) -> list[str]:
        kinds = [k for k in spec.kinds if not pick or k != "type"]  # the hard split asks for colours
        asked = None if pick else goals
        ids = []
        for i, seed in enumerate(seeds):
            kind = kinds[i % len(kinds)]
            lay = layout(kind, seed, spec.width, spec.height, labels, asked)
            tries = 0
            while pick and lay.goal not in pick:  # the hard split: a layout whose goal is a held-back colour
                tries += 1
                lay = layout(kind, seed + tries * 10_000_000, spec.width, spec.height, labels)
            task_id = f"targets-{split}-{kind}-{lay.seed}"
            path = build / "examples" / DOMAIN / f"{task_id}.json"
            path.write_text(json.dumps(task_json(lay, task_id, labels, asked), indent=2) + "\n")
            (build / "solutions" / f"{task_id}.jsonl").write_text(
                "".join(json.dumps(a) + "\n" for a in solution(lay))
            )
            ids.append(task_id)
        return ids

    try:
        metas = {
            "train.json": write("train", range(spec.seed, spec.seed + spec.train), shown),
            "test.json": write(
                "test", range(HELD_OUT_OFFSET + spec.seed, HELD_OUT_OFFSET + spec.seed + spec.test), shown
            ),
        }
        if spec.hard_labels:
            seeds = range(HARD_OFFSET + spec.seed, HARD_OFFSET + spec.seed + spec.test)
            metas["test-labels.json"] = write("hard", seeds, names, hard)
        for name, ids in metas.items():
            (build / name).write_text(json.dumps({DOMAIN: ids}, indent=1) + "\n")
        info = suite_info(spec, shown, hard, metas)
        (build / "suite.json").write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(build, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(build, out)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return info


def suite_info(spec: GenerateSpec, shown: tuple[str, ...], hard: tuple[str, ...], metas: dict) -> dict:
    """What `suite.json` says of a suite: how it was made, its labels, its lists' sizes."""
    return asdict(spec) | {
        "family": DOMAIN,
        "labels": list(shown),
        "hard_labels": list(hard),
        "tasks": {k: len(v) for k, v in metas.items()},
    }
