"""What can the desktop-learning policy learn at all? The targets family without desktops: each task's layout
(`guirl.vmpool.targets.layout`, the same seeds as `guirl tasks generate targets`) drawn with PIL as the app
draws it, made a GUI-R1 row (the goal's box as ground truth: the rule reward's accuracy is the app's success,
a click inside the goal's target). Then `guirl sft` on the train rows, greedy success A0 on held-out rows
(`guirl eval` on rows) with how spread the answers are, and with `--updates`, GRPO on the rows through the
actor system (dataset workers instead of desktops: a few seconds an update) with its greedy curve.

It separates what the policy can learn from what the desktops cost: `bench/desktop_learning.py` plays the
same family on local desktops. With `--targets 1` only the goal's target is drawn (no distractors: finding
a target, not reading its colour); with `--goals red` every row asks for red, among distractors of the other
colours (as `guirl learn`'s default suite).

    python bench/targets_rows.py [--train-n 512] [--heldout-n 64] [--epochs 8] [--targets 4] [--goals red]
        [--labels red,green,...] [--updates 0] [--eval-every 10] [--lr 1e-4]

Prints each stage, then one line of JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "gui_r1.toml"
CACHE = ROOT / ".cache" / "targets-rows"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
"""The app's font (Tk's "DejaVu Sans" bold; Debian's fonts-dejavu-core)."""
WIDTH, HEIGHT = 640, 400
ROWS_FORMAT = 1
"""Part of the rows' cache key: bump it when `render` or `rows` changes what they draw."""
TEST_SEEDS = 1_000_000
"""Held-out rows start here (as `guirl tasks generate` numbers its test split)."""


def render(lay) -> bytes:
    """The screen the targets app shows for `lay` (kind click), as PNG bytes."""
    from PIL import Image, ImageDraw, ImageFont

    from guirl.vmpool.targets import COLOURS, font_size, text_colour

    im = Image.new("RGB", (lay.width, lay.height), "#e8e8e8")
    draw = ImageDraw.Draw(im)
    font = ImageFont.truetype(FONT, font_size(lay.height))
    for b in lay.targets:
        draw.rectangle([b.x, b.y, b.x + b.w, b.y + b.h], fill=COLOURS[b.label], outline="#333333")
        draw.text(b.centre, b.label, fill=text_colour(b.label), font=font, anchor="mm")
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def rows(
    n: int, first_seed: int, targets: int = 4, labels: tuple | None = None, goals: tuple | None = None
) -> list:
    """`n` click rows from seeds `first_seed`...; with `targets` 1, the goal's target alone is drawn;
    `labels` and `goals` are `layout`'s (the colours drawn, and those asked for)."""
    from guirl.data.rows import GroundingRow
    from guirl.vmpool.targets import layout

    out = []
    for seed in range(first_seed, first_seed + n):
        lay = layout("click", seed, WIDTH, HEIGHT, labels, goals)
        goal_box = lay.goal_box()
        if targets == 1:
            lay = dataclasses.replace(lay, targets=(goal_box,))
        g = goal_box
        box = (g.x / WIDTH, g.y / HEIGHT, (g.x + g.w) / WIDTH, (g.y + g.h) / HEIGHT)
        out.append(
            GroundingRow(
                id=f"targets-click-{seed}",
                image=render(lay),
                width=WIDTH,
                height=HEIGHT,
                instruction=lay.instruction,
                task_type="low",
                gt_action="click",
                gt_bbox=box,
                domain="targets",
            )
        )
    return out


def rows_file(
    n: int, first_seed: int, targets: int, labels: tuple | None = None, goals: tuple | None = None
) -> Path:
    """The rows, written once under .cache/targets-rows."""
    from guirl.data.rows import write_rows_jsonl

    variant = (f"-{'.'.join(labels)}" if labels else "") + (f"-goals.{'.'.join(goals)}" if goals else "")
    path = CACHE / f"rows-v{ROWS_FORMAT}-{n}-{first_seed}-{targets}{variant}" / "rows.jsonl"
    if not path.exists():
        tmp = path.parent.with_name(path.parent.name + f".tmp{os.getpid()}")
        try:
            write_rows_jsonl(rows(n, first_seed, targets, labels, goals), tmp / "rows.jsonl")
            os.replace(tmp, path.parent)
        except OSError:
            if not path.exists():  # not another run's complete copy: a real error
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def spread(run_dir: Path) -> dict:
    """How the greedy answers spread: the distinct 32-pixel cells of the image shown they point into, and
    the share of the commonest (a policy that ignores the screen answers one point)."""
    cells: Counter = Counter()
    malformed = 0
    number = r"(-?\d+(?:\.\d+)?)"
    for traj in run_dir.glob("episodes/*/*/traj.jsonl"):
        for line in traj.read_text().splitlines():
            found = re.findall(rf"'point': \[{number}, {number}\]", json.loads(line).get("response", ""))
            if found:  # the last answer's point, as the parser takes the last answer
                x, y = (float(v) for v in found[-1])
                cells[(int(x // 32), int(y // 32))] += 1
            else:
                malformed += 1
    total = sum(cells.values())
    commonest = cells.most_common(1)[0][1] / total if total else 0.0
    return {"cells": len(cells), "commonest_share": round(commonest, 3), "no_point": malformed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-n", type=int, default=512)
    p.add_argument("--heldout-n", type=int, default=64)
    p.add_argument("--targets", type=int, choices=(1, 4), default=4)
    p.add_argument("--labels", default="", help="the colours drawn from, comma-separated (default: all)")
    p.add_argument(
        "--goals", default="any", help="the colours asked for, comma-separated, or 'any' (default)"
    )
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--sft-lr", type=float, default=5e-4)
    p.add_argument("--updates", type=int, default=0, help="GRPO updates after the warm start (0: none)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--run", default="", help="run directory (default: .cache/targets-rows/run-<time>)")
    args = p.parse_args()

    import uvloop

    from guirl.config import load_config
    from guirl.eval import run_eval
    from guirl.learn import build_policy
    from guirl.log import setup_logging
    from guirl.sft import run_sft
    from guirl.train import run_train
    from guirl.vmpool.targets import layout, parse_goals

    setup_logging("bench", level="WARNING")
    started = time.time()
    labels = tuple(args.labels.split(",")) if args.labels else None
    goals = parse_goals(args.goals or "any")
    try:
        layout("click", 0, WIDTH, HEIGHT, labels, goals)
    except ValueError as exc:
        p.error(str(exc))
    train = rows_file(args.train_n, 0, args.targets, labels, goals)
    heldout = rows_file(args.heldout_n, TEST_SEEDS, args.targets, labels, goals)
    policy = build_policy(CACHE / "models")
    run = Path(args.run or CACHE / f"run-{time.strftime('%Y%m%d-%H%M%S')}")
    run.mkdir(parents=True, exist_ok=True)
    base = [
        "data.task_type=low",
        f"data.eval={heldout}",
        "agent.max_pixels=40960",  # 256x160, as configs/desktop_learning.toml
        "agent.max_new_tokens=48",
        "logging.level=WARNING",
        "env.max_envs=32",
        "inference.max_batch=32",
        "env.vms_per_worker=16",
    ]

    def evaluate(model: Path, name: str) -> tuple[float, dict]:
        cfg = load_config(CONFIG, env={}, overrides=[*base, f"model.hf_ckpt={model}", "agent.temperature=0"])
        (run / name).mkdir()
        summary = uvloop.run(run_eval(cfg, run / name, out=io.StringIO()))
        return float(summary["grounding"]["all"]["step_success"]), spread(run / name)

    sets = [f"model.hf_ckpt={policy}", f"sft.data={train}", f"sft.epochs={args.epochs}"]
    sets.append(f"sft.lr={args.sft_lr}")
    (run / "sft").mkdir()
    sft = run_sft(load_config(CONFIG, env={}, overrides=[*base, *sets]), run / "sft", out=io.StringIO())
    warm = Path(sft["model"])
    print(f"SFT: {sft['steps']} steps, nll {sft['nll_first']} -> {sft['nll_last']}, {sft['seconds']:.0f} s")
    a0, a0_spread = evaluate(warm, "eval-a0")
    cells, share = a0_spread["cells"], a0_spread["commonest_share"]
    print(f"A0 = {a0:.1%} (answers in {cells} cells of 32 px, {share:.0%} in the commonest)")
    curve: list = []
    if args.updates:
        sets = [
            f"model.hf_ckpt={warm}",
            f"data.train={train}",
            f"train.updates={args.updates}",
            f"train.eval_every={args.eval_every}",
            f"train.lr={args.lr}",
            "rollout.batch_size=4",
            "rollout.n_samples_per_prompt=8",
            "agent.temperature=1.0",
        ]
        (run / "grpo").mkdir()
        t0 = time.time()
        cfg = load_config(CONFIG, env={}, overrides=[*base, *sets])
        uvloop.run(run_train(cfg, run / "grpo", out=io.StringIO(), on_eval=lambda e: curve.append(e)))
        curve = [[e["version"], e["accuracy"]] for e in curve]
        print(f"GRPO: {args.updates} updates in {time.time() - t0:.0f} s; greedy curve {curve}")
    settings = {k: v for k, v in vars(args).items() if k != "run"}
    result = {"A0": a0, "A0_spread": a0_spread, "curve": curve, "sft_steps": sft["steps"]}
    result |= {"sft_s": sft["seconds"], "wall_s": round(time.time() - started, 1), "settings": settings}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
