"""`guirl train`: RL mode (GRPO), decoupled IMPALA-style, end to end on the run's cluster of processes.

The coordinator runs in this process and admits GRPO groups under the staleness bound; the inference
broker, the learner, the PRM and W env workers run as supervised actor processes (`guirl.roles`). Env
workers keep acting on the latest weights they have while the learner trains; the learner publishes each
new version to the broker (whose engines load it between batches) and to the coordinator (which then
admits more episodes). `--sync` runs the same loop without overlap (max_staleness 0: a batch is played,
then trained on, while the VMs wait), for comparison. Metrics per update go to `metrics.jsonl`; a
progress line follows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl import roles
from guirl.config import GuirlConfig, make_run_dir, save_resolved
from guirl.config.validate import check_replay_source
from guirl.errors import InputError, RunError
from guirl.fileio import last_json_line, write_json_atomic
from guirl.model.checkpoints import resolve_checkpoint, resolve_prm_checkpoint
from guirl.placement import apply
from guirl.report import Tracking, train_end_lines, train_progress_line, train_summary
from guirl.tracking import Tracker


async def run_train(
    cfg: GuirlConfig,
    run_dir: Path | None = None,
    *,
    resume: bool = False,
    out: TextIO = sys.stdout,
    cluster: Any = None,
    on_eval: Callable[[dict], None] | None = None,
) -> dict:
    """Train until `train.updates` updates are made; returns (and writes) the summary. With `resume`,
    `run_dir` is a run to continue from its latest checkpoint. `cluster` (`guirl.cluster.run.ClusterRun`)
    places the actors on hosts; none: this machine's one-host cluster. `on_eval` is called with each
    periodic evaluation's line of `eval.jsonl` as soon as it is complete (an error it raises ends the run)."""
    from guirl.cluster.run import ClusterRun

    cluster = cluster or ClusterRun.local(cfg)
    cfg = cluster.prepare(cfg, "train")  # checked (`guirl.config.validate`) for this cluster
    roles.cpu_set(cfg.cluster.learner_cpus, "cluster.learner_cpus")
    roles.cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus")
    if cfg.train.sync:  # in turns: no sample ahead of its version, no broadcast overlapping the next update
        train = msgspec.structs.replace(cfg.train, max_staleness=0, overlap_publish=False)
        cfg = msgspec.structs.replace(cfg, train=train)
    tasks, skipped = roles.suite(cfg, "train")  # both suites are checked before any VM starts
    eval_tasks, eval_skipped = (
        roles.suite(cfg, "eval", in_training=True) if cfg.train.eval_every else ([], [])
    )
    placement = cluster.plan(cfg, "train")  # the GPU layout (per host when the cluster file names GPUs)
    cfg = apply(cfg, placement)
    ckpt = resolve_checkpoint(cfg)
    judge_ckpt = resolve_prm_checkpoint(cfg) if cfg.prm.enabled else None
    resume_from = resume_point(run_dir) if resume else None
    run_dir = run_dir or make_run_dir(cfg)
    check_replay_source(cfg, run_dir)
    save_resolved(cfg, run_dir)
    tracker = Tracker.open(cfg.wandb, run_dir=run_dir, config=msgspec.to_builtins(cfg), job="train")
    try:
        summary = await _train(
            cfg,
            run_dir,
            tracker,
            tasks,
            eval_tasks,
            ckpt,
            judge_ckpt,
            resume_from,
            out,
            placement,
            cluster,
            on_eval,
        )
    except BaseException:
        tracker.close(exit_code=1)
        raise
    if skipped or eval_skipped:  # never run, so never in the tables: listed here
        summary["skipped"] = [dataclasses.asdict(x) for x in skipped]
        summary["eval_skipped"] = [dataclasses.asdict(x) for x in eval_skipped]
        write_json_atomic(run_dir / "summary.json", summary)
        out.write(f"[train] unsupported, skipped: {len(skipped)} training, {len(eval_skipped)} eval tasks\n")
    tracker.summary(summary)
    tracker.close()
    return summary


async def _train(
    cfg: GuirlConfig,
    run_dir: Path,
    tracker: Tracker,
    tasks: list,
    eval_tasks: list,
    ckpt: str,
    judge_ckpt: str | None,
    resume_from: Path | None,
    out: TextIO,
    placement: Any,
    cluster: Any,
    on_eval: Callable[[dict], None] | None = None,
) -> dict:
    started = time.monotonic()
    _print_plan(cfg, run_dir, len(tasks), out)
    coord = roles.coordinator(cfg, run_dir, "train", tasks, eval_tasks)
    if resume_from is not None:
        _restore(coord, run_dir, resume_from, out)
    async with roles.RunActors(cfg, run_dir, cluster, coord, "train") as run:
        broker = await run.start(
            roles.broker_spec(cfg, ckpt, run_dir, judge_ckpt=judge_ckpt, placement=placement)
        )
        spec = roles.learner_spec(cfg, run_dir, ckpt, broker, coord.endpoints[0], placement, resume_from)
        learner = await run.start(spec)
        prm = await run.start(roles.prm_spec(cfg, run_dir, broker, learner)) if cfg.prm.enabled else ""
        print(f"[train] broker{', PRM' if prm else ''} and learner up", file=out)
        peers = roles.Peers(coordinator=coord.endpoints[0], broker=broker, learner=learner, prm=prm)
        await run.start_workers(roles.worker_specs(cfg, run_dir, peers, mode="train"), together=False)
        print(f"[train] {cfg.env.workers} env worker(s), {sum(n for _, n in cluster.slots)} VMs up", file=out)
        tracking = Tracking(tracker, run_dir)
        watch = {"broker": broker, **({"prm": prm} if prm else {})}
        await run.follow(
            functools.partial(_follow, coord, run.sup, cfg, run_dir, out, tracking, on_eval=on_eval),
            out,
            watch=watch,
        )
        await _last_evaluations(coord, out, on_eval)
        tracking.poll(coord, started)
        snap = coord.snapshot()  # before shutting down: stopping takes time that is not the run's
        coord.finish()
        await run.stop()
    summary, metrics = train_summary(
        coord, snap, run_dir=run_dir, sync=cfg.train.sync, ckpt=ckpt, seconds=time.monotonic() - started
    )
    if run.monkey is not None:
        summary["chaos"] = run.monkey.summary()
    write_json_atomic(run_dir / "summary.json", summary)
    train_end_lines(summary, metrics, run_dir, out)
    return summary


def resume_point(run_dir: Path | None) -> Path:
    """The latest complete checkpoint of the train run `run_dir`; InputError if there is none."""
    from guirl.learner.checkpoint import latest_checkpoint

    if run_dir is None or not (run_dir / "coordinator.json").is_file():
        raise InputError(f"{run_dir}: not a train run directory (no coordinator.json)")
    found = latest_checkpoint(run_dir)
    if found is None:
        raise InputError(f"{run_dir}: no complete checkpoint to resume from")
    return found


def _restore(coord: Any, run_dir: Path, resume_from: Path, out: TextIO) -> None:
    """The coordinator of a resumed run: its saved state, less the groups the checkpoint trained on."""
    learned = json.loads((resume_from / "learner.json").read_text())
    state = json.loads((run_dir / "coordinator.json").read_text())
    again = coord.restore(state, set(learned["trained_groups"]), int(learned["version"]))
    print(
        f"[train] resuming at version {learned['version']} from {resume_from}; {again} group(s) again",
        file=out,
    )


def _print_plan(cfg: GuirlConfig, run_dir: Path, n_tasks: int, out: TextIO) -> None:
    t, r = cfg.train, cfg.rollout
    if cfg.prm.enabled and t.advantage != "step_wise":
        print(
            '[train] note: the PRM judges every step, but train.advantage = "grpo" does not use its scores '
            "(they are only recorded in each episode's prm.jsonl)",
            file=out,
        )
    if cfg.prm.enabled and cfg.prm.score_timeout_s >= t.group_timeout_s:
        print(
            f"[train] note: prm.score_timeout_s ({cfg.prm.score_timeout_s:g} s) is not below "
            f"train.group_timeout_s ({t.group_timeout_s:g} s): a group waits for its members' scores first",
            file=out,
        )
    mode = "sync" if t.sync else f"decoupled, max staleness {t.max_staleness}"
    print(
        f"[train] {n_tasks} tasks from {cfg.data.train or t.tasks} · {r.batch_size} groups x "
        f"{r.n_samples_per_prompt} samples per update · {t.updates} updates ({mode}) · "
        f"run directory {run_dir}",
        file=out,
    )


async def _follow(
    coord: Any,
    sup: Any,
    cfg: GuirlConfig,
    run_dir: Path,
    out: TextIO,
    tracking: Tracking,
    status: Any,
    on_eval: Callable[[dict], None] | None = None,
) -> None:
    """Print progress (and log it to W&B) until the learner has made its updates; fail if an actor cannot
    be kept up. Injects the `[faults]` kills when their version comes."""
    started, last = time.monotonic(), ""
    kill_at = {"prm": cfg.faults.kill_prm_at_version, "learner": cfg.faults.kill_learner_at_version}
    while True:
        coord.progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(coord.progress.wait(), cfg.eval.progress_interval_s)
        tracking.poll(coord, started)
        status.maybe(sup, coord)
        for e in sup.history:
            if e.kind == "gave_up":
                raise RunError(f"actor {e.name} kept crashing ({e.detail}); see its log")
            if e.kind == "completed" and e.name == "learner":
                metrics = last_json_line(run_dir / "metrics.jsonl")
                out.write(train_progress_line(coord, metrics, 0, started) + "\n")
                return
        for role, version in kill_at.items():
            if version and coord.learner_version >= version and role in sup.actors:
                kill_at[role] = 0  # once: the supervisor restarts it (the learner from its latest checkpoint)
                pid = sup.kill(role)
                name = "PRM" if role == "prm" else role
                version = coord.learner_version
                out.write(f"[train] fault injection: SIGKILLed the {name} (pid {pid}) at version {version}\n")
        _print_evaluations(coord, out, on_eval)
        metrics = last_json_line(run_dir / "metrics.jsonl")
        line = train_progress_line(coord, metrics, cfg.train.updates, started)
        if line.split(" · ")[:2] != last.split(" · ")[:2]:
            out.write(line + "\n")
            out.flush()
        last = line


async def _last_evaluations(
    coord: Any, out: TextIO, on_eval: Callable[[dict], None] | None = None, timeout_s: float = 600.0
) -> None:
    """The updates are made: let the last evaluation finish (up to `timeout_s`, without the training samples
    still queued ahead of it), then print them all."""
    coord.end_training()
    deadline = time.monotonic() + timeout_s
    while coord.evals_pending() and time.monotonic() < deadline:
        coord.progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(coord.progress.wait(), 5)
    _print_evaluations(coord, out, on_eval)


def _print_evaluations(coord: Any, out: TextIO, on_eval: Callable[[dict], None] | None = None) -> None:
    """Each periodic evaluation once, as soon as its last episode is scored (and to `on_eval`)."""
    for line in coord.eval_lines[coord.evals_printed :]:
        out.write(
            f"[train] evaluation at version {line['version']}: accuracy {line['accuracy']} "
            f"({line['scored']}/{line['tasks']} scored) {line['domains']}\n"
        )
        out.flush()
        if on_eval is not None:  # a copy: the line also feeds W&B and the summary
            on_eval(dict(line))
    coord.evals_printed = len(coord.eval_lines)
