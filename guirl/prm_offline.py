"""`guirl prm score RUN_DIR`: judge the episodes of a finished run (eval or train), to study a judge
without training.

Each step of each episode folder (`traj.jsonl` and its screenshots) becomes a `Transition` as the env
worker would have sent it: the screen before (`step_NNN.png`), the screen after (`step_{N+1}.png`, or
`final.png` for the last step; the same screen for a step whose response did not parse: nothing was
executed), the earlier action lines and screenshots. The judge comes from the given config (`[prm]`,
`model.prm_model_path`), never from the run's own. It runs as in training: an `InferenceBroker` serving
only the judge's engines and a `PRMActor` (no learner) whose `Judge` asks it, both in this process, so
batching, engine health and retries are the live ones. Verdicts go to `<episode>/<out>` (one line per
step, written atomically per episode) and a summary beside the episodes.

A damaged episode (a traj line that is not JSON, a missing screenshot) is skipped with a warning; a
screenshot that does not decode makes its step a bad-input line. Neither stops the other episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl.actors.broker import BrokerOptions, InferenceBroker, make_judge_engines
from guirl.actors.prm import PRMActor, PRMOptions
from guirl.config import GuirlConfig, load_config
from guirl.errors import InputError
from guirl.fileio import write_json_atomic
from guirl.messages import Blob
from guirl.messages.types import Image, Transition
from guirl.prm.judge import Judge

DEFAULT_OUT = "prm_offline.jsonl"
SUMMARY = "prm_score_summary.json"
RESERVED = frozenset({"traj.jsonl", "prm.jsonl", "result.json"})
"""An episode's own files: `--out` never names one (the live PRM appends to `prm.jsonl`)."""
_INSTRUCTION = re.compile(r"Instruction: (.*?)\n\nPrevious actions:", re.DOTALL)
"""The task as the policy's prompt states it (guirl/agent/prompt.py `instruction_text`)."""


class SkipEpisode(Exception):
    """An episode folder that cannot be judged (the message names the file)."""


@dataclass
class EpisodeSteps:
    """An episode as its folder holds it: what the judge needs of each step, and how the episode ended."""

    folder: Path
    task_id: str
    episode_id: str
    instruction: str
    steps: list[dict[str, Any]]
    outcome: str | None = None
    score: float | None = None

    @property
    def success(self) -> bool | None:
        """Whether the evaluator scored it a success (None: no evaluator score, e.g. an env error)."""
        return None if self.score is None else self.score >= 1.0


# -- reading a run -----------------------------------------------------------------------------------


def summary_name(out: str) -> str:
    """The summary file of a scoring written to `out` (another `--out` keeps its own summary)."""
    return SUMMARY if out == DEFAULT_OUT else f"prm_score_summary.{Path(out).stem}.json"


def check_out_name(out: str) -> str:
    """`--out` must be a new kind of file in an episode folder: a plain `*.jsonl` name that is none of the
    episode's own files, whatever the case (a case-insensitive file system would take `TRAJ.JSONL` for
    `traj.jsonl`), so no scoring can overwrite a screenshot, a trajectory or the live verdicts."""
    if (
        not out
        or "/" in out
        or "\\" in out
        or out.startswith(".")
        or not out.lower().endswith(".jsonl")
        or out.lower() in RESERVED
    ):
        raise InputError(
            f"--out {out!r}: give a plain *.jsonl file name (not starting with '.', not one of "
            f"{sorted(RESERVED)})"
        )
    return out


def episode_folders(run_dir: Path) -> list[Path]:
    """The episode folders of a run, sorted (InputError for a directory that is not a run)."""
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such directory (give the directory of an eval or train run)")
    root = run_dir / "episodes"
    if not root.is_dir():
        raise InputError(f"{run_dir} is not a run directory: it has no episodes/ folder")
    folders = sorted(p for p in root.glob("*/*") if p.is_dir() and (p / "traj.jsonl").is_file())
    if not folders:
        raise InputError(f"{root} holds no episode (no */*/traj.jsonl)")
    return folders


def task_instructions(run_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Task id -> instruction from the task lists of the run's resolved config (`train.tasks` and
    `eval.tasks`), and why a list could not be read."""
    found: dict[str, str] = {}
    problems: list[str] = []
    try:  # the run's config as it was saved: this environment's variables do not apply to it
        cfg = load_config(run_dir / "config.toml", env={})
    except Exception as exc:  # a missing or old config: the prompts still state the instruction
        return found, [f"the run's config.toml: {exc}"]
    from guirl.vmpool.tasks.suite import load_suite

    for meta, examples in ((cfg.train.tasks, ""), (cfg.eval.tasks, cfg.eval.examples_dir)):
        try:
            for t in load_suite(meta, examples_dir=examples):
                found.setdefault(t.task_id, str(t.task.get("instruction", "")))
        except InputError as exc:
            problems.append(str(exc))
    return found, problems


def _instruction_from_prompt(line: dict[str, Any]) -> str:
    for message in reversed(line.get("prompt") or []):
        for part in message.get("parts", []) if isinstance(message, dict) else []:
            match = _INSTRUCTION.search(part.get("text", "")) if isinstance(part, dict) else None
            if match:
                return match.group(1)
    return ""


def read_episode(folder: Path, instructions: dict[str, str], warn: Callable[[str], None]) -> EpisodeSteps:
    """The steps of one episode folder; SkipEpisode (naming file and line) when it cannot be judged."""
    traj = folder / "traj.jsonl"
    steps: list[dict[str, Any]] = []
    with open(traj, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            try:
                line = json.loads(text)
            except ValueError:
                raise SkipEpisode(f"{traj}:{number}: not a JSON line") from None
            if not (
                isinstance(line, dict)
                and line.get("step") == len(steps)
                and isinstance(line.get("response"), str)
            ):
                raise SkipEpisode(f"{traj}:{number}: not step {len(steps)} with a response")
            steps.append(line)
    if not steps:
        raise SkipEpisode(f"{traj}: no step")
    for i in range(len(steps)):  # a missing screenshot is found before anything is asked of the judge
        for name in (_png(i), after_name(folder, steps, i)):
            if not (folder / name).is_file():
                raise SkipEpisode(f"{folder / name}: missing")
    task_id, episode_id = folder.parent.name, folder.name
    instruction = instructions.get(task_id, "")
    if not instruction:
        instruction = _instruction_from_prompt(steps[0])
        if not instruction:
            raise SkipEpisode(f"{traj}: task {task_id!r} is not in the run's task lists, nor in the prompt")
        warn(f"task {task_id!r} is not in the run's task lists: its instruction is read from the prompt")
    ep = EpisodeSteps(folder, task_id, episode_id, instruction, steps)
    try:
        result = json.loads((folder / "result.json").read_text())
        ep.outcome = result.get("outcome")
        ep.score = result.get("score") if isinstance(result.get("score"), int | float) else None
    except (OSError, ValueError, AttributeError):  # a run killed mid-episode: steps, but no outcome
        pass
    return ep


def _png(step: int) -> str:
    return f"step_{step:03d}.png"


def after_name(folder: Path, steps: list[dict[str, Any]], i: int) -> str:
    """The screen after step i: the same screen for a response that did not parse (nothing ran), the
    next step's screenshot (present also after the last step of an episode that broke off), else the
    final screen."""
    if "parse_error" in steps[i] and "action_line" not in steps[i]:
        return _png(i)
    if i + 1 < len(steps) or (folder / _png(i + 1)).is_file():
        return _png(i + 1)
    return "final.png"


def _image(path: Path) -> Image:
    data = path.read_bytes()
    # the size from the PNG header, when it is one (the judge decodes and resizes it anyway)
    ok = data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24
    w, h = (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) if ok else (0, 0)
    return Image(data=Blob(data), width=w, height=h)


def transition(ep: EpisodeSteps, i: int, *, history_images: int, seed: int) -> Transition:
    """Step i of `ep` as the env worker sends it to the PRM (reads the screenshots: run it off the loop)."""
    earlier = range(max(0, i - history_images), i) if history_images else range(0)
    return Transition(
        episode_id=ep.episode_id,
        step=i,
        instruction=ep.instruction,
        previous_actions=[str(s.get("action_line", "")) for s in ep.steps[:i]],
        response=ep.steps[i]["response"],
        before=_image(ep.folder / _png(i)),
        after=_image(ep.folder / after_name(ep.folder, ep.steps, i)),
        history=[_image(ep.folder / _png(j)) for j in earlier],
        task_id=ep.task_id,
        seed=seed,
    )


def write_jsonl_atomic(path: Path, lines: list[dict[str, Any]]) -> None:
    """All lines to a temporary sibling, then renamed into place (a kill leaves the old file or none)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    os.replace(tmp, path)


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


# -- the tally ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the summary reports, counted line by line as episodes are written."""

    counts: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, line: dict[str, Any], success: bool | None) -> None:
        c = self.counts
        c["steps"] += 1
        if "bad_input" in line:
            c["steps_bad_input"] += 1
            return
        c["steps_judged"] += 1
        c["votes"] += line["votes"]
        c["invalid_votes"] += line["invalid"]
        c["vote_errors"] += len(line["errors"])
        self.latencies.append(line["latency_s"])
        score = line["score"]
        if score is None:
            c["no_valid_vote" if line["votes"] else "judge_error"] += 1
            return
        c["+1" if score == 1.0 else "-1" if score == -1.0 else "other"] += 1
        if success is not None and score != 0:  # a step score of 0 (split votes) has no sign to compare
            c["agreement_steps"] += 1
            c["agreement_agree"] += int((score > 0) == success)

    def summary(self) -> dict[str, Any]:
        c, lat = self.counts, self.latencies
        return {
            "episodes": c["episodes"],
            "episodes_skipped": len(self.skipped),
            "skipped": self.skipped,
            "steps": c["steps"],
            "steps_judged": c["steps_judged"],
            "steps_bad_input": c["steps_bad_input"],
            "scores": {k: c[k] for k in ("+1", "-1", "other", "no_valid_vote", "judge_error")},
            "votes": c["votes"],
            "invalid_votes": c["invalid_votes"],
            "invalid_vote_rate": _ratio(c["invalid_votes"], c["votes"]),
            "judge_errors": c["judge_error"],
            "vote_errors": c["vote_errors"],
            "agreement": {
                "steps": c["agreement_steps"],
                "agree": c["agreement_agree"],
                "rate": _ratio(c["agreement_agree"], c["agreement_steps"]),
            },
            "latency_s": {"mean": _ratio(sum(lat), len(lat)), "max": round(max(lat), 4) if lat else None},
        }


# -- the run -----------------------------------------------------------------------------------------


class _Scorer:
    """Judges episodes with bounded concurrency and writes each episode's lines when its steps are in."""

    def __init__(self, cfg: GuirlConfig, judge: Judge, out_name: str, tally: Tally) -> None:
        self.cfg, self.judge, self.out_name, self.tally = cfg, judge, out_name, tally
        self.steps = asyncio.Semaphore(cfg.prm.max_concurrency)

    async def episode(self, ep: EpisodeSteps) -> None:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._step(ep, i)) for i in range(len(ep.steps))]
        lines = [t.result() for t in tasks]
        try:
            await asyncio.to_thread(write_jsonl_atomic, ep.folder / self.out_name, lines)
        except OSError as exc:  # an unwritable folder costs its episode, not the whole scoring
            self.tally.skipped.append(f"{ep.folder / self.out_name}: not written: {exc}")
            return
        self.tally.counts["episodes"] += 1
        for line in lines:
            self.tally.add(line, ep.success)

    async def _step(self, ep: EpisodeSteps, i: int) -> dict[str, Any]:
        asked = time.monotonic()
        head = {"task_id": ep.task_id, "episode_id": ep.episode_id}
        # the episode's own outcome and score, under names that do not clash with the step's `score`
        tail = {"episode_outcome": ep.outcome, "episode_score": ep.score}
        async with self.steps:
            try:
                t = await asyncio.to_thread(
                    transition, ep, i, history_images=self.cfg.prm.history_images, seed=self.cfg.run.seed
                )
                verdict = await self.judge.judge(t, queue_s=time.monotonic() - asked)
            except (OSError, ValueError) as exc:  # a screenshot that does not decode (or went away)
                return dict(head, step=i, score=None, votes=0, invalid=0, bad_input=str(exc)[:300], **tail)
        return {**head, **verdict.record, **tail}


@contextlib.asynccontextmanager
async def judge_service(cfg: GuirlConfig, ckpt: str, run_dir: Path) -> AsyncIterator[Judge]:
    """The live judging path, in this process: a broker serving only the judge's engines, and a PRM actor
    (no learner) whose `Judge` asks it with the live retries."""
    prm = cfg.prm
    inference = msgspec.structs.replace(
        cfg.inference,
        max_batch=prm.max_batch,
        max_queue=max(cfg.inference.max_queue, prm.max_concurrency * prm.votes),
        request_timeout_s=prm.request_timeout_s,
    )
    broker = InferenceBroker(
        "judge-broker",
        BrokerOptions(inference=inference, model=prm.model_name),
        engines=make_judge_engines(prm, ckpt=ckpt),
        runtime=cfg.runtime,
        codec=cfg.codec,
        bind=["tcp://127.0.0.1:0"],
    )
    broker_task = await broker.start()
    try:
        actor = PRMActor(
            "prm-score",
            PRMOptions(broker=broker.endpoints[0], run_dir=str(run_dir), prm=prm),
            runtime=cfg.runtime,
            codec=cfg.codec,
        )
        actor_task = await actor.start()
        try:
            yield actor.judge
        finally:
            actor.request_shutdown("scoring done")
            await actor_task
    finally:
        broker.request_shutdown("scoring done")
        await broker_task


async def score_run(
    cfg: GuirlConfig,
    run_dir: Path,
    *,
    limit: int = 0,
    overwrite: bool = False,
    out_name: str = DEFAULT_OUT,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> dict[str, Any]:
    """Judge every step of the episodes of `run_dir` (the first `limit` episodes when set) with the judge
    of `cfg`; writes `<episode>/<out_name>` and the summary, and returns the summary."""
    from guirl.model.checkpoints import resolve_prm_checkpoint

    check_out_name(out_name)
    folders = episode_folders(run_dir)[: limit or None]
    existing = [f / out_name for f in folders if (f / out_name).exists()]
    if (run_dir / summary_name(out_name)).exists():
        existing.insert(0, run_dir / summary_name(out_name))
    if existing and not overwrite:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise InputError(
            f"{existing[0]} exists{more}: pass --overwrite to replace, or --out NAME to write elsewhere"
        )
    named = cfg.prm.backend == "openai" and cfg.prm.openai.model  # a served judge, named by its endpoint
    if cfg.prm.backend != "scripted" and not cfg.model.prm_model_path and not named:
        raise InputError(
            "no judge to score with: set PRM_MODEL_PATH (or --set model.prm_model_path=...) to its "
            'checkpoint, "tiny" for the tiny random Qwen3-VL, or --set prm.backend=scripted'
        )
    ckpt = resolve_prm_checkpoint(cfg)
    started = time.monotonic()
    warned: set[str] = set()

    def warn(message: str) -> None:
        if message not in warned:
            warned.add(message)
            print(f"[prm score] warning: {message}", file=err)

    instructions, problems = task_instructions(run_dir)
    for problem in problems:  # the prompts still state each task's instruction
        warn(f"{problem}; instructions are read from the prompts where needed")
    tally = Tally()
    prm = cfg.prm
    print(f"[prm score] {len(folders)} episodes of {run_dir} · judge {prm.backend} x{prm.engines}", file=out)
    async with judge_service(cfg, ckpt, run_dir) as judge:
        scorer = _Scorer(cfg, judge, out_name, tally)
        # episodes read ahead of the judge: enough to keep it busy, few enough to bound memory
        ahead = asyncio.Semaphore(max(2, prm.max_concurrency))
        async with asyncio.TaskGroup() as tg:
            for folder in folders:
                try:
                    ep = await asyncio.to_thread(read_episode, folder, instructions, warn)
                except (SkipEpisode, OSError) as exc:
                    tally.skipped.append(str(exc))
                    warn(f"episode skipped: {exc}")
                    continue
                await ahead.acquire()
                task = tg.create_task(scorer.episode(ep), name=f"episode:{ep.episode_id}")
                task.add_done_callback(lambda _t: ahead.release())
    summary = {
        "run_dir": str(run_dir),
        "out": out_name,
        "judge": {
            "backend": prm.backend,
            "checkpoint": ckpt,
            "votes": prm.votes,
            "temperature": prm.temperature,
            "history_images": prm.history_images,
        },
        "template": judge.template.version,
        **tally.summary(),
        "seconds": round(time.monotonic() - started, 2),
    }
    write_json_atomic(run_dir / summary_name(out_name), summary)
    _print_summary(summary, run_dir / summary_name(out_name), out)
    return summary


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100.0 * part / whole:.1f}%)" if whole else f"{part}/{whole}"


def _print_summary(s: dict[str, Any], path: Path, out: TextIO) -> None:
    sc, ag, lat = s["scores"], s["agreement"], s["latency_s"]
    latency = f"{lat['mean']:.3f} s mean, {lat['max']:.3f} s max" if lat["mean"] is not None else "-"
    print(
        f"[prm score] {s['episodes']} episodes ({s['episodes_skipped']} skipped) · {s['steps']} steps: "
        f"{s['steps_judged']} judged, {s['steps_bad_input']} bad input",
        file=out,
    )
    print(
        f"[prm score] scores: +1 {sc['+1']} · -1 {sc['-1']} · other {sc['other']} · "
        f"no valid vote {sc['no_valid_vote']} · judge errors {sc['judge_error']} · "
        f"invalid votes {_pct(s['invalid_votes'], s['votes'])}",
        file=out,
    )
    print(
        f"[prm score] sign agrees with the episode's outcome: {_pct(ag['agree'], ag['steps'])} · "
        f"latency {latency} · template {s['template']} · {s['seconds']:.1f} s",
        file=out,
    )
    print(f"[prm score] per-step scores: episodes/*/*/{s['out']} · summary: {path}", file=out)
