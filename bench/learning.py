"""Does the RL loop learn? SFT a small Qwen3-VL briefly on synthetic grounding rows, measure greedy held-out
accuracy A0, run GRPO through the whole actor system (dataset workers, broker, learner, weight broadcast)
with a greedy evaluation every `--eval-every` versions (the curve), then A1; then the control: the same SFT
start, the same number of updates, with `train.shuffle_rewards = true` (rewards permuted across the batch:
no information about which answer was right). Issue 7's target: A1 >= A0 + 10 points; the control flat.

The task, made learnable on 2 CPU cores (each lever measured; see the report of issue 7 part 7):

- rows: the click rows of `guirl.data.synth` (train split, 640x400 screens), `task_type = "low"` (GUI-R1's
  click-only prompt); the policy sees them at `--pixels` (default 256x160: 40 image tokens);
- ground truth: the centre of the target's box as a *point*, so a click counts within `--radius` px of it
  (`data.point_radius_px`, the rule reward's own knob for point ground truth). With the boxes themselves
  (about 1 % of the screen) a 5 M-parameter model at 256x160 px scores ~3 % and rarely sees a reward;
- model: `write_tiny_checkpoint` with a wider text model, a 4-block vision tower and a tokenizer whose merges
  also learnt GUI-R1's prompts and answers (an answer costs ~35 tokens, not ~70);
- held-out set: unseen rows of the *train* distribution (another seed); the test split (other labels, other
  layouts) is reported beside it, A0 and A1 only.

Measured on 2 CPU cores (4.83 M parameters; 512 train rows, 64 held-out; 60 updates of 4 rows x 8 samples):
A0 7.8 % -> A1 23.4 % (+15.6 points; test split 9.4 % -> 15.6 %) in 875 s for SFT + GRPO + evals; the
control fell to 0 % (random-sign updates at lr 1e-4 break the answer format within ~8 updates). At lr 1e-4
the sampled policy's entropy starts to blow up near update 57, so 60 updates is about the limit; at lr 5e-5
it stays stable but gains only +6 points (peak +9) in 60 updates. 64 rows: one row is 1.6 points.

    python bench/learning.py [--quick] [--updates 60] [--eval-every 10] [--no-control] [--set KEY=VALUE ...]

Prints the SFT, A0, the curves and a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import uvloop  # noqa: E402

from guirl.config import load_config  # noqa: E402
from guirl.learn import POLICY  # noqa: E402
from guirl.log import setup_logging  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "gui_r1.toml"
CACHE = ROOT / ".cache" / "learning"
MODEL = POLICY  # write_tiny_checkpoint's knobs (the same policy `guirl learn` builds)
TARGET_POINTS = 10.0


def click_rows(split: str, n: int, seed: int, *, point: bool = True) -> Path:
    """`n` click rows of synth's (split, seed) stream at 640x400, the box turned into its centre point when
    `point`; written once under .cache/learning."""
    from guirl.data import synth
    from guirl.data.rows import write_rows_jsonl

    code = hashlib.sha256(Path(synth.__file__).read_bytes()).hexdigest()[:8]
    path = CACHE / f"rows-{split}-{n}-{seed}-{'pt' if point else 'box'}-{code}" / "rows.jsonl"
    if path.exists():
        return path
    rows = []
    for sample in synth.synthesize_samples(4 * n, seed=seed, split=split, sizes=((640, 400),)):
        row = sample.row
        if row.gt_action != "click":
            continue
        box = row.gt_bbox
        gt = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2) if point else box
        rows.append(dataclasses.replace(row, task_type="low", gt_bbox=gt))
        if len(rows) == n:
            break
    tmp = path.parent.with_name(path.parent.name + ".tmp")
    write_rows_jsonl(rows, tmp / "rows.jsonl")
    os.replace(tmp, path.parent)
    return path


def build_model(train_rows: Path) -> Path:
    """The bench's policy, built once: MODEL's sizes, a tokenizer that also learnt GUI-R1 prompts/answers."""
    from guirl.agent.unified import UnifiedAction, gui_r1_prompt, render_answer
    from guirl.data.rows import load_rows
    from guirl.model.tiny import write_tiny_checkpoint

    key = hashlib.sha256(json.dumps(MODEL, sort_keys=True).encode()).hexdigest()[:8]
    out = CACHE / f"model-{key}"
    if (out / "config.json").exists():
        return out
    rng = random.Random(0)
    corpus = [gui_r1_prompt(r.instruction, r.history, "low") for r in load_rows(train_rows)[:200]]
    corpus += [
        render_answer([UnifiedAction(action="click", point=(rng.randrange(256), rng.randrange(160)))])
        for _ in range(400)
    ]
    tmp = out.with_name(out.name + ".tmp")
    write_tiny_checkpoint(tmp, extra_corpus=corpus, **MODEL)
    os.replace(tmp, out)
    return out


def overrides(args: argparse.Namespace, heldout: Path) -> list[str]:
    w, h = args.pixels
    return [
        "data.task_type=low",
        f"data.point_radius_px={args.radius}",
        f"data.eval={heldout}",
        f"agent.max_pixels={w * h}",
        f"agent.max_new_tokens={args.max_new_tokens}",
        "logging.level=WARNING",
        "env.max_envs=32",  # every sample of an update in flight at once: the broker batches them
        "inference.max_batch=32",
        "env.vms_per_worker=16",
        *args.set,
    ]


def _pct(x: float | None) -> str:
    return "not measured (--quick)" if x is None else f"{x:.1%}"


def evaluate(base: list[str], model: Path, rows: Path, run_dir: Path) -> float:
    from guirl.eval import run_eval

    cfg = load_config(
        CONFIG,
        env={},
        overrides=[*base, f"model.hf_ckpt={model}", f"data.eval={rows}", "agent.temperature=0"],
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = uvloop.run(run_eval(cfg, run_dir, out=io.StringIO()))
    return float(summary["grounding"]["all"]["step_success"])


def grpo(base: list[str], model: Path, args: argparse.Namespace, run_dir: Path, control: bool) -> dict:
    """GRPO from `model`; returns the curve [(version, wall_s, accuracy)], the final model, reward means."""
    from guirl.train import run_train

    cfg = load_config(
        CONFIG,
        env={},
        overrides=[
            *base,
            f"model.hf_ckpt={model}",
            f"data.train={args.train_rows}",
            f"train.updates={args.updates}",
            f"train.eval_every={args.eval_every}",
            f"train.lr={args.lr}",
            f"rollout.batch_size={args.batch}",
            f"rollout.n_samples_per_prompt={args.group}",
            "agent.temperature=1.0",
            f"train.shuffle_rewards={'true' if control else 'false'}",
        ],
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    uvloop.run(run_train(cfg, run_dir, out=io.StringIO()))
    wall = time.time() - started
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    curve = [[e["version"], round(e["time"] - started, 1), e["accuracy"]] for e in evals]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    final = sorted((run_dir / "checkpoints").glob("v*/model"), key=lambda p: int(p.parent.name[1:]))[-1]
    rewards = [round(m.get("reward_mean", 0.0), 3) for m in metrics]
    return {"curve": curve, "model": final, "wall_s": round(wall, 1), "rewards": rewards}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: few rows and updates, no test split")
    p.add_argument("--train-n", type=int, default=512)
    p.add_argument("--heldout-n", type=int, default=64)
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=5e-4)
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch", type=int, default=4, help="rows per update")
    p.add_argument("--group", type=int, default=8, help="samples per row")
    p.add_argument("--radius", type=float, default=40.0)
    p.add_argument("--pixels", type=int, nargs=2, default=(256, 160))
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--no-control", action="store_true")
    p.add_argument("--keep", default="", help="run directory to keep (default: .cache/learning/run-<time>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    if args.quick:
        # (and no test-split evaluations: every evaluation is a whole `guirl eval` run)
        args.train_n, args.heldout_n, args.sft_epochs, args.updates, args.eval_every = 64, 16, 1, 1, 1
        args.batch, args.group = 2, 4
    setup_logging("bench", level="WARNING")
    started = time.time()
    CACHE.mkdir(parents=True, exist_ok=True)
    args.train_rows = click_rows("train", args.train_n, 0)
    heldout = click_rows("train", args.heldout_n, 99)  # unseen rows of the train distribution
    test = click_rows("test", args.heldout_n, 1)
    model = build_model(args.train_rows)
    from guirl.model.tiny import count_parameters
    from guirl.sft import run_sft

    params = count_parameters(model)
    run = Path(args.keep or CACHE / f"run-{time.strftime('%Y%m%d-%H%M%S')}")
    base = overrides(args, heldout)
    print(f"model {model} · {params / 1e6:.2f} M parameters · run directory {run}", flush=True)

    cfg = load_config(
        CONFIG,
        env={},
        overrides=[
            *base,
            f"model.hf_ckpt={model}",
            f"sft.data={args.train_rows}",
            f"sft.epochs={args.sft_epochs}",
            f"sft.lr={args.sft_lr}",
        ],
    )
    (run / "sft").mkdir(parents=True, exist_ok=True)
    sft = run_sft(cfg, run / "sft", out=io.StringIO())
    sft_model = Path(sft["model"])
    print(f"SFT: {sft['steps']} steps, nll {sft['nll_first']} -> {sft['nll_last']}, {sft['seconds']:.0f} s")
    a0 = evaluate(base, sft_model, heldout, run / "eval-a0")
    a0_test = None if args.quick else evaluate(base, sft_model, test, run / "eval-a0-test")
    print(f"A0 = {a0:.1%} (held-out train-distribution rows) · test split {_pct(a0_test)}", flush=True)
    setup_s = time.time() - started

    main_run = grpo(base, sft_model, args, run / "grpo", control=False)
    a1 = evaluate(base, main_run["model"], heldout, run / "eval-a1")
    a1_test = None if args.quick else evaluate(base, main_run["model"], test, run / "eval-a1-test")
    main_wall = time.time() - started
    print(f"GRPO curve (version, s, accuracy): {main_run['curve']}")
    print(f"A1 = {a1:.1%} · test split {_pct(a1_test)} · main run {main_wall:.0f} s", flush=True)
    control = None
    if not args.no_control:
        control = grpo(base, sft_model, args, run / "control", control=True)
        control["a1"] = evaluate(base, control["model"], heldout, run / "eval-control")
        print(f"control curve: {control['curve']} · control A1 = {control['a1']:.1%}", flush=True)

    gain = 100 * (a1 - a0)
    print()
    print("| run | A0 | A1 | A1 - A0 (points) | GRPO wall s |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| GRPO | {a0:.1%} | {a1:.1%} | {gain:+.1f} | {main_run['wall_s']:.0f} |")
    if control:
        print(
            f"| control (shuffled rewards) | {a0:.1%} | {control['a1']:.1%} | "
            f"{100 * (control['a1'] - a0):+.1f} | {control['wall_s']:.0f} |"
        )
    if a0_test is not None and a1_test is not None:
        print(f"| GRPO, test split | {a0_test:.1%} | {a1_test:.1%} | {100 * (a1_test - a0_test):+.1f} | |")
    print(f"target A1 >= A0 + {TARGET_POINTS:g}: {'met' if gain >= TARGET_POINTS else 'NOT met'}")
    settings = {k: v for k, v in vars(args).items() if k not in ("train_rows", "keep")}
    settings |= {"model": MODEL, "overrides": base}
    result = {
        "A0": a0,
        "A1": a1,
        "A0_test": a0_test,
        "A1_test": a1_test,
        "control_A1": control["a1"] if control else None,
        "curve": main_run["curve"],
        "control_curve": control["curve"] if control else None,
        "rewards": main_run["rewards"],
        "control_rewards": control["rewards"] if control else None,
        "sft_s": sft["seconds"],
        "setup_s": round(setup_s, 1),
        "main_wall_s": round(main_wall, 1),
        "wall_s": round(time.time() - started, 1),
        "params": params,
        "target_met": gain >= TARGET_POINTS,
        "settings": settings,
    }
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
