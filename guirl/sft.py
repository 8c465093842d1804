"""`guirl sft`: supervised fine-tuning on grounding rows, with the learner's own code.

Each row becomes one training sample: the GUI-R1 prompt the dataset worker would send (the row's image
resized as the policy sees it, the instruction, history and action space; `guirl/data/prompt.py`) rendered
to token ids by the model's own chat template, and the answer GUI-R1 expects for the row's ground truth
(`<think>…</think> <answer>[{'action': …, 'point': [x, y], 'input_text': …}]</answer>`, the point the box
centre in pixels of the image shown) plus the end-of-turn token. The update is the learner's `train_step`
with advantage 1 on every token, one optimizer step per batch and no importance correction: at the weights
the step starts from the policy ratio is 1, so the policy-gradient loss's gradient is exactly that of the
token-mean negative log-likelihood (reported as `nll`). Same `Trainer` (FSDP2 over `sft.ranks` processes),
same checkpoint format: `<run dir>/final/model/` is a Hugging Face checkpoint that `model.hf_ckpt` (or
`--ckpt`) takes for RL.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl.config import GuirlConfig, make_run_dir, save_resolved
from guirl.config.schema import TrainConfig
from guirl.errors import InputError
from guirl.fileio import write_json_atomic


def _target(renderer: Any, prompt: Any, images: list[bytes], answer: str, **name: Any) -> Any:
    """A sample that teaches `answer` (then the end of the turn) after the chat prompt `prompt` with its
    `images`: advantage 1, and behaviour log-probs that nothing reads (SFT has no importance correction)."""
    from guirl.learner.samples import TrainSample

    rendered = renderer.render(prompt, images)
    end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    response = renderer.tokenizer(answer, add_special_tokens=False)["input_ids"] + [end]
    return TrainSample(
        prompt_ids=rendered.input_ids,
        response_ids=response,
        behaviour_logprobs=[0.0] * len(response),
        images=images,
        advantage=1.0,
        policy_version=0,
        **name,
    )


def sft_samples(rows: list[Any], renderer: Any, prompt_cfg: Any, *, task_type: str = "row", think: str = ""):
    """One `TrainSample` per row (see the module docstring); ValueError naming the row when it cannot be
    made (an image the processor refuses, a prompt holding image tokens)."""
    from guirl.data.prompt import row_prompt, target_answer

    samples = []
    for row in rows:
        try:
            prompt = row_prompt(row, prompt_cfg, task_type)
            answer = target_answer(row, prompt.size, think)
            samples.append(
                _target(
                    renderer,
                    prompt.messages,
                    prompt.images,
                    answer,
                    episode_id=row.id,
                    step=0,
                    group_id=row.id,
                )
            )
        except ValueError as exc:
            raise ValueError(f"row {row.id!r}: {exc}") from exc
    return samples


def episode_samples(
    run_dir: Path, renderer: Any, *, min_score: float = 1.0, problems: list[str] | None = None
):
    """Behaviour cloning: a `TrainSample` per step of each episode of `run_dir` that scored at least
    `min_score`. A step's prompt is rebuilt from its `traj.jsonl` line (the chat messages, with image
    references and tool schemas, and the size of each image) and the episode's screenshots — a prompt's
    images are the screens of its last steps, oldest first, each resized as the policy saw it — then rendered
    by the model's own template; the target is the response the policy gave. An episode that cannot be
    rebuilt (a missing screenshot, a line that is not JSON) is skipped and named in `problems`."""
    from guirl.agent.imaging import image_size, resize_image
    from guirl.messages.types import ChatMessage, ImagePart, TextPart

    samples = []
    for result_path in sorted(Path(run_dir, "episodes").glob("*/*/result.json")):
        folder = result_path.parent
        try:
            result = json.loads(result_path.read_text())
            if result.get("status") != "completed" or (result.get("score") or 0.0) < min_score:
                continue
            made = []
            for raw in (folder / "traj.jsonl").read_text().splitlines():
                line = json.loads(raw)
                messages = [
                    ChatMessage(
                        role=m["role"],
                        parts=[
                            TextPart(p["text"]) if "text" in p else ImagePart(int(p["image"]))
                            for p in m["parts"]
                        ],
                        tools=[str(t) for t in m.get("tools", [])],
                    )
                    for m in line["prompt"]
                ]
                sizes = [tuple(s) for s in line["prompt_images"]]
                first = int(line["step"]) - (len(sizes) - 1)
                images = []
                for i, size in enumerate(sizes):
                    png = (folder / f"step_{first + i:03d}.png").read_bytes()
                    images.append(png if image_size(png) == size else resize_image(png, *size))
                made.append(
                    _target(
                        renderer,
                        messages,
                        images,
                        line["response"],
                        episode_id=folder.name,
                        step=int(line["step"]),
                        group_id=folder.parent.name,
                    )
                )
            samples.extend(made)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            if problems is not None:
                problems.append(f"{folder}: not cloned: {type(exc).__name__}: {exc}"[:300])
    return samples


def sft_train_config(cfg: GuirlConfig) -> TrainConfig:
    """The learner settings of an SFT run: `sft.lr`, no KL, no importance correction, the learner's own
    micro-batching, gradient clip and threads."""
    return msgspec.structs.replace(cfg.train, lr=cfg.sft.lr, tis_cap=0.0, kl_coef=0.0, ranks=cfg.sft.ranks)


def run_sft(cfg: GuirlConfig, run_dir: Path | None = None, *, out: TextIO = sys.stdout) -> dict:
    """Fine-tune `model.hf_ckpt` on `sft.data`; returns (and writes) the summary."""
    from guirl.agent.prompt import PromptConfig
    from guirl.data.rows import load_rows
    from guirl.learner.trainer import Trainer, spawn_followers
    from guirl.model.checkpoints import resolve_checkpoint

    s = cfg.sft
    if not s.data and not s.run_dirs:
        raise InputError(
            "nothing to train on: set sft.data (grounding rows) and/or sft.run_dirs (runs to clone)"
        )
    for d in s.run_dirs:
        if not Path(d, "episodes").is_dir():
            raise InputError(f"sft.run_dirs: {d} is not a run directory (no episodes/)")
    from guirl.data.source import resolve_rows

    rows = load_rows(resolve_rows(s.data), limit=s.limit) if s.data else []
    ckpt = resolve_checkpoint(cfg)
    run_dir = run_dir or make_run_dir(cfg)
    save_resolved(cfg, run_dir)
    started = time.monotonic()
    train = sft_train_config(cfg)
    trainer = Trainer(ckpt=ckpt, train=train, seed=cfg.run.seed)
    followers: list[Any] = []
    rendezvous = store = None
    if s.ranks > 1:
        options = {"ckpt": ckpt, "train": msgspec.to_builtins(train), "seed": cfg.run.seed}
        followers, rendezvous, store = spawn_followers(options, world=s.ranks, log_dir=run_dir / "logs")
    print(
        f"[sft] {len(rows)} rows from {s.data} · {s.epochs} epoch(s) · batch {s.batch_size} · lr {s.lr:g} · "
        f"{s.ranks} rank(s) · run directory {run_dir}",
        file=out,
    )
    metrics: list[dict[str, Any]] = []
    try:
        trainer.load(None, rendezvous=rendezvous, store=store)
        samples = sft_samples(
            rows,
            trainer.renderer,
            PromptConfig.from_config(cfg.agent),
            task_type=cfg.data.task_type,
            think=s.think,
        )
        problems: list[str] = []
        for d in s.run_dirs:
            cloned = episode_samples(Path(d), trainer.renderer, min_score=s.min_score, problems=problems)
            print(f"[sft] {len(cloned)} steps of successful episodes from {d}", file=out)
            samples.extend(cloned)
        for problem in problems:
            print(f"[sft] warning: {problem}", file=out)
        if not samples:
            raise InputError("no sample to train on (no rows, and no successful episode in sft.run_dirs)")
        rng = random.Random(cfg.run.seed)
        step = 0
        with open(run_dir / "sft.jsonl", "a") as log:
            for epoch in range(s.epochs):
                order = samples[:]
                rng.shuffle(order)
                for i in range(0, len(order), s.batch_size):
                    m = trainer.step(order[i : i + s.batch_size])
                    step += 1
                    line = {
                        "time": round(time.time(), 3),
                        "step": step,
                        "epoch": epoch,
                        "nll": round(m["nll"], 5),
                        "grad_norm": round(m["grad_norm"], 5),
                        "tokens": int(m["tokens"]),
                        "samples": int(m["samples"]),
                    }
                    metrics.append(line)
                    log.write(json.dumps(line) + "\n")
                    log.flush()
                print(
                    f"[sft] epoch {epoch + 1}/{s.epochs} · step {step} · nll {metrics[-1]['nll']:.4f}",
                    file=out,
                )
        final = run_dir / "final"
        final.mkdir(parents=True, exist_ok=True)
        trainer.save(final)
    finally:
        if trainer.info is not None:
            trainer.stop()
        for proc in followers:
            try:
                proc.wait(timeout=60)
            except Exception:
                proc.kill()
    summary = {
        "run_dir": str(run_dir),
        "mode": "sft",
        "checkpoint": ckpt,
        "rows": len(rows),
        "samples": len(samples),
        "steps": len(metrics),
        "nll_first": metrics[0]["nll"] if metrics else None,
        "nll_last": metrics[-1]["nll"] if metrics else None,
        "seconds": round(time.monotonic() - started, 2),
        "model": str(run_dir / "final" / "model"),
    }
    write_json_atomic(run_dir / "summary.json", summary)
    print(
        f"[sft] {summary['steps']} steps in {summary['seconds']:.1f} s · nll {summary['nll_first']} -> "
        f"{summary['nll_last']} · model: {summary['model']}",
        file=out,
    )
    return summary
