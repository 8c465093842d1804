"""`guirl learn`: learning on real desktops, end to end, on a laptop (`make demo`; the bench:
`bench/desktop_learning.py`).

The recipe, each stage a guirl run of its own in a subdirectory of one run directory:

1. `suite/` — `guirl tasks generate targets`: train tasks and held-out tasks (other seeds) for the
   desktops' screen size;
2. the policy — `model.hf_ckpt`, or with `tiny` (the default) a small random Qwen3-VL built for this recipe
   (`POLICY`: 4.8 M parameters, its tokenizer also trained on the family's prompts and answers; built once
   under `<run.root_dir>/.models/`);
3. `demonstrations/` — the train suite played by its reference solutions (`guirl eval`, scripted backend,
   on local desktops);
4. `sft/` — the warm start: behaviour cloning of those episodes (`guirl sft`, `sft.run_dirs`);
5. `eval-s0/` — greedy success on the held-out tasks: S0;
6. `grpo/` — `guirl train` from the warm start (broker, env worker on local desktops, learner, weight
   broadcast), the held-out tasks evaluated greedily every `train.eval_every` versions: the curve, S1 its
   last point;
7. `control/` (with `control`) — the same from the same warm start with `train.shuffle_rewards = true`.

Then `curve.json`, `curve.png` and the text plot; `learn.json` holds every figure.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import uvloop

from guirl.config import GuirlConfig, load_config, make_run_dir
from guirl.errors import InputError
from guirl.fileio import write_json_atomic
from guirl.plot import png_plot, text_plot

POLICY = {  # write_tiny_checkpoint's knobs (bench/learning.py's policy too)
    "hidden": 256,
    "layers": 4,
    "heads": 4,
    "kv_heads": 2,
    "vision_depth": 4,
    "vision_hidden": 128,
    "vision_heads": 4,
}


@dataclass
class LearnPlan:
    config: str
    """The recipe's config (`configs/desktop_learning.toml`)."""
    overrides: list[str]
    """`--set KEY=VALUE` on top of it."""
    train_tasks: int = 128
    test_tasks: int = 64
    kinds: tuple[str, ...] = ("click",)
    seed: int = 0
    """The suite's first seed (another seed: other layouts)."""
    goals: tuple[str, ...] | None = ("red",)
    """The colours the click and menu tasks ask for (None: any colour drawn; see docs/desktop-learning.md)."""
    control: bool = False
    """Also run the shuffled-reward control."""


def build_policy(root: Path) -> Path:
    """The recipe's small policy (POLICY), built once under `root`."""
    from guirl.agent.unified import UnifiedAction, gui_r1_prompt, render_answer
    from guirl.model.tiny import write_tiny_checkpoint
    from guirl.vmpool.targets import COLOURS, WORDS

    key = hashlib.sha256(json.dumps(POLICY, sort_keys=True).encode() + b"targets-2").hexdigest()[:8]
    out = root / f"targets-policy-{key}"
    if (out / "config.json").exists():
        return out
    rng = random.Random(0)
    corpus = [
        gui_r1_prompt(f"Click the target labelled {c}.", "", s) for c in COLOURS for s in ("high", "low")
    ]
    corpus += [gui_r1_prompt(f"Type {w} into the field.", "", "high") for w in WORDS]
    corpus += [
        gui_r1_prompt(f"Open the menu, then pick {c}.", "Step 1: click", s)
        for c in COLOURS
        for s in ("high", "low")
    ]
    corpus *= 8
    corpus += [
        render_answer([UnifiedAction(action="click", point=(rng.randrange(256), rng.randrange(160)))])
        for _ in range(400)
    ]
    corpus += [render_answer([UnifiedAction(action="type", input_text=w)]) for w in WORDS * 4]
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    write_tiny_checkpoint(tmp, extra_corpus=corpus, **POLICY)
    os.replace(tmp, out)
    return out


def noise_points(s0: float | None, s1: float | None, n: int) -> float:
    """Two standard errors, in points, of the difference of two success rates each measured on `n` tasks."""
    if s0 is None or s1 is None or n < 1:
        return 0.0
    return 200 * math.sqrt((s0 * (1 - s0) + s1 * (1 - s1)) / n)


def caveat(s0: float | None, s1: float | None, n: int) -> str:
    """What a newcomer should not read into the change from S0 to S1 on `n` held-out tasks ("" if nothing)."""
    if s0 is None or s1 is None:
        return ""
    gain, noise = round(100 * (s1 - s0), 1), noise_points(s0, s1, n)
    if s0 >= 1.0 and -gain <= noise:  # a fall beyond the noise is shown as the fall it is
        return (
            f"the warm start already succeeded on all {n} held-out tasks: GRPO had no room to show a rise "
            "(another --seed draws other tasks; docs/desktop-learning.md)"
        )
    if abs(gain) < noise:
        return (
            f"a change of {gain:+.1f} points is within two standard errors of the two evaluations "
            f"({noise:.1f} points for {n} tasks): at this budget the run shows the loop and the warm start, "
            "not learning (docs/desktop-learning.md)"
        )
    return ""


class _Stage:
    """Loads the recipe's config with the stage's settings on top."""

    def __init__(self, plan: LearnPlan, suite: Path) -> None:
        self.plan = plan
        self.base = [
            *plan.overrides,
            f"train.tasks={suite / 'train.json'}",
            f"eval.tasks={suite / 'test.json'}",
        ]

    def config(self, *sets: str, mode: str | None = None) -> GuirlConfig:
        return load_config(self.plan.config, overrides=[*self.base, *sets], mode=mode)


def _evaluate(stage: _Stage, model: Path, tasks: Path, run_dir: Path, *sets: str) -> dict:
    from guirl.eval import run_eval

    cfg = stage.config(
        f"model.hf_ckpt={model}", f"eval.tasks={tasks}", "agent.temperature=0", *sets, mode="eval"
    )
    run_dir.mkdir(parents=True)
    return uvloop.run(run_eval(cfg, run_dir, out=io.StringIO()))


def _grpo(stage: _Stage, model: Path, run_dir: Path, out: TextIO, control: bool) -> dict:
    from guirl.train import run_train

    cfg = stage.config(
        f"model.hf_ckpt={model}", f"train.shuffle_rewards={'true' if control else 'false'}", mode="train"
    )
    run_dir.mkdir(parents=True)
    started = time.time()
    label = "control" if control else "GRPO"

    def said(line: dict) -> None:  # each held-out evaluation, as it completes
        shown = "n/a" if line["accuracy"] is None else f"{line['accuracy']:.1%}"
        print(f"[learn] {label}: held-out success at version {line['version']}: {shown}", file=out)
        out.flush()

    summary = uvloop.run(run_train(cfg, run_dir, out=io.StringIO(), on_eval=said))
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines() if x.strip()]
    return {
        "curve": [[e["version"], round(e["time"] - started, 1), e["accuracy"]] for e in evals],
        "wall_s": round(time.time() - started, 1),
        "rewards": summary.get("reward_mean_by_update", []),
        "episodes": summary.get("episodes", 0),
        "env_steps": summary.get("env_steps", 0),
        "env_errors": summary.get("env_errors", 0),
        "updates": summary.get("updates", 0),
    }


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a (no episode scored)" if x is None else f"{x:.{digits}%}"


def check_plan(plan: LearnPlan, cfg: GuirlConfig) -> None:
    """What the recipe's settings cannot run, refused before anything starts."""
    from guirl.vmpool.targets import COLOURS, KINDS

    if plan.goals is not None and (not plan.goals or any(g not in COLOURS for g in plan.goals)):
        raise InputError(f"guirl learn: --goals: one or more of {', '.join(COLOURS)}, or 'any'")
    if plan.train_tasks < 1 or plan.test_tasks < 1:
        raise InputError("guirl learn: --train-tasks and --test-tasks must be at least 1")
    if not plan.kinds or any(k not in KINDS for k in plan.kinds):
        raise InputError(
            f"guirl learn: --kinds: one or more of {', '.join(KINDS)} (got {','.join(plan.kinds)})"
        )
    if "menu" in plan.kinds and cfg.agent.max_steps < 2:
        raise InputError("guirl learn: menu tasks take two steps: --set agent.max_steps=2")
    if "type" in plan.kinds and cfg.agent.gui_r1_actions != "high":
        raise InputError(
            'guirl learn: type tasks need a prompt that offers typing: --set agent.gui_r1_actions="high"'
        )


def run_learn(plan: LearnPlan, *, out: TextIO = sys.stdout) -> dict:
    """The recipe (see the module docstring); returns (and writes to learn.json) its figures."""
    from guirl.model.tiny import count_parameters
    from guirl.sft import run_sft
    from guirl.vmpool.tasks.generate import GenerateSpec, generate

    started = time.time()
    cfg = load_config(plan.config, overrides=plan.overrides)
    if cfg.agent.response_format != "gui_r1" or cfg.env.provider != "local":
        raise InputError("guirl learn: the recipe plays local desktops in GUI-R1's format (see its config)")
    if not cfg.train.eval_every:
        raise InputError("guirl learn: train.eval_every must be set (the held-out curve)")
    check_plan(plan, cfg)
    run = make_run_dir(cfg)
    suite = run / "suite"
    try:
        generate(
            GenerateSpec(
                str(suite),
                train=plan.train_tasks,
                test=plan.test_tasks,
                kinds=list(plan.kinds),
                width=cfg.env.screen_width,
                height=cfg.env.screen_height,
                seed=plan.seed,
                goals=None if plan.goals is None else list(plan.goals),
            )
        )
    except ValueError as exc:
        raise InputError(f"guirl learn: {exc}") from exc
    stage = _Stage(plan, suite)
    model = (
        Path(cfg.model.hf_ckpt)
        if cfg.model.hf_ckpt != "tiny"
        else build_policy(Path(cfg.run.root_dir) / ".models")
    )
    params = count_parameters(model)
    asking = "" if plan.kinds == ("type",) else f"; asking for {' or '.join(plan.goals or ('any colour',))}"
    print(
        f"[learn] run directory {run}\n[learn] {plan.train_tasks} train and {plan.test_tasks} held-out tasks "
        f"({', '.join(plan.kinds)}{asking})"
        f" on {cfg.env.screen_width}x{cfg.env.screen_height} local desktops · "
        "policy "
        f"{params / 1e6:.2f} M parameters",
        file=out,
        flush=True,
    )

    t0 = time.time()
    played = _evaluate(
        stage,
        model,
        suite / "train.json",
        run / "demonstrations",
        "inference.backend=scripted",
        f"inference.scripted.dir={suite / 'solutions'}",
    )
    print(
        f"[learn] demonstrations: {played['tasks']} train tasks played by their reference solutions, "
        f"success {_pct(played['accuracy'], 0)}, {time.time() - t0:.0f} s",
        file=out,
        flush=True,
    )
    failed = [r["task_id"] for r in played["results"] if r["status"] != "completed" or r["score"] != 1.0]
    if failed:  # not cloned (sft.min_score): said, with which
        print(
            f"[learn] warning: {len(failed)} demonstration(s) did not score 1, not cloned: {failed[:5]}",
            file=out,
        )
    sft_cfg = stage.config(
        f"model.hf_ckpt={model}", f"sft.run_dirs=[{json.dumps(str(run / 'demonstrations'))}]"
    )
    (run / "sft").mkdir()
    sft = run_sft(sft_cfg, run / "sft", out=io.StringIO())
    warm = Path(sft["model"])
    print(
        f"[learn] warm start: behaviour cloning, {sft['steps']} steps, nll {sft['nll_first']} -> "
        f"{sft['nll_last']}, {sft['seconds']:.0f} s",
        file=out,
        flush=True,
    )
    s0 = _evaluate(stage, warm, suite / "test.json", run / "eval-s0")["accuracy"]
    print(f"[learn] S0 = {_pct(s0)}: greedy success on the held-out tasks before GRPO", file=out, flush=True)
    print(
        f"[learn] GRPO: {cfg.train.updates} updates of {cfg.rollout.batch_size} tasks x "
        f"{cfg.rollout.n_samples_per_prompt} attempts, held-out evaluation every {cfg.train.eval_every}",
        file=out,
        flush=True,
    )
    main = _grpo(stage, warm, run / "grpo", out, control=False)
    main_wall = time.time() - started
    control = _grpo(stage, warm, run / "control", out, control=True) if plan.control else None

    curves = {"GRPO": [(0, s0), *((v, a) for v, _, a in main["curve"])]}
    if control:
        curves["control (shuffled rewards)"] = [(0, s0), *((v, a) for v, _, a in control["curve"])]
    s1 = main["curve"][-1][2] if main["curve"] else None
    plot = png_plot(curves, run / "curve.png", title="held-out success on local desktops (targets family)")
    print("\n" + text_plot(curves), file=out)
    gain = None if s1 is None or s0 is None else round(100 * (s1 - s0), 1)
    print(
        f"\n[learn] S0 {_pct(s0)} -> S1 {_pct(s1)} ({'n/a' if gain is None else f'{gain:+.1f}'} points, "
        f"{plan.test_tasks} held-out tasks) in {main_wall:.0f} s · plot {plot} · the episodes, to look at: "
        f"{run / 'grpo' / 'episodes'}",
        file=out,
        flush=True,
    )
    said = caveat(s0, s1, plan.test_tasks)
    if said:
        print(f"[learn] {said}", file=out)
    print(
        "[learn] one run on one suite seed: its change varies from seed to seed (measured spread: README, "
        "docs/desktop-learning.md); compare runs with other --seed values before reading it as learning",
        file=out,
    )
    result: dict[str, Any] = {
        "run_dir": str(run),
        "S0": s0,
        "S1": s1,
        "gain_points": gain,
        "curve": main["curve"],
        "rewards": main["rewards"],
        "control_S1": control["curve"][-1][2] if control and control["curve"] else None,
        "control_curve": control["curve"] if control else None,
        "control_rewards": control["rewards"] if control else None,
        "episodes": main["episodes"],
        "env_steps": main["env_steps"],
        "env_errors": main["env_errors"] + (control["env_errors"] if control else 0) + played["env_errors"],
        "warm_start": {
            "demonstrations": played["tasks"],
            "sft_steps": sft["steps"],
            "nll": [sft["nll_first"], sft["nll_last"]],
            "sft_s": sft["seconds"],
        },
        "grpo_wall_s": main["wall_s"],
        "main_wall_s": round(main_wall, 1),
        "wall_s": round(time.time() - started, 1),
        "params": params,
        "plot": str(plot),
    }
    write_json_atomic(run / "curve.json", curves)
    write_json_atomic(run / "learn.json", result)
    return result
