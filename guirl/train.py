"""`guirl train`: RL mode (GRPO), decoupled IMPALA-style, end to end on a local cluster of processes.

The coordinator runs in this process and admits GRPO groups under the staleness bound; the inference
broker, the learner and W env workers run as supervised actor processes. Env workers keep acting on the
latest weights they have while the learner trains; the learner publishes each new version to the broker
(whose engines load it between batches) and to the coordinator (which then admits more episodes).
`--sync` runs the same loop without overlap (max_staleness 0: a batch is played, then trained on, while
the VMs wait), for comparison. Metrics per update go to `metrics.jsonl`; a progress line follows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl.actors.coordinator import Coordinator
from guirl.chaos import check_chaos_config, start_monkey
from guirl.config import GuirlConfig, make_run_dir, save_resolved
from guirl.errors import InputError
from guirl.eval import (
    EvalError,
    _start_or_explain,
    broker_spec,
    check_env_provider,
    check_prompt_style,
    cpu_set,
    resolve_checkpoint,
    resolve_prm_checkpoint,
    run_settings,
    worker_spec,
)
from guirl.fileio import JsonlTail, last_json_line, write_json_atomic
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor
from guirl.tracking import Tracker
from guirl.vmpool.tasks.suite import SkippedTask, check_supported, load_suite

log = logging.getLogger(__name__)


def _env_utilisation(snap: dict[str, Any]) -> float | None:
    """The share of VM time spent in episodes so far (None before any VM time has passed)."""
    vm_time = snap["slots"] * snap["vm_elapsed_s"]
    return min(1.0, snap["episode_s"] / vm_time) if vm_time > 0 else None


class _Tracking:
    """Each update's metrics line (and each evaluation) to W&B, with the coordinator's view beside it."""

    def __init__(self, tracker: Tracker, run_dir: Path) -> None:
        self.tracker = tracker
        self.tail = JsonlTail(run_dir / "metrics.jsonl")
        self.step = 0
        self.evals = 0

    def poll(self, coord: Coordinator, started: float) -> None:
        if not self.tracker.enabled:
            return
        new = self.tail.read()
        if new or len(coord.eval_lines) > self.evals:
            snap = coord.snapshot()
            elapsed = time.monotonic() - started
            env = {
                "env/utilisation": _env_utilisation(snap) or 0.0,
                "env/episodes": len(coord.ended),
                "env/errors": snap["env_errors"],
                "env/steps_per_s": snap["steps"] / elapsed if elapsed > 0 else 0.0,
            }
        for m in new:
            if m.get("version", 0) <= self.step:  # a restarted learner repeats its checkpoint's version
                continue
            self.step = int(m["version"])
            self.tracker.log({**m, **env}, step=self.step)
        for line in coord.eval_lines[self.evals :]:
            self.tracker.log(
                {
                    "eval/accuracy": line["accuracy"],
                    "eval/version": line["version"],
                    "eval/scored": line["scored"],
                    **{f"eval/{d}": v for d, v in (line.get("domains") or {}).items()},
                },
                step=max(self.step, 1),
            )
        self.evals = len(coord.eval_lines)


_TABLE = (  # column, metrics key, format
    ("version", "version", "{:d}"),
    ("reward", "reward_mean", "{:+.2f}"),
    ("success", "success_rate", "{:.0%}"),
    ("samples", "samples", "{:.0f}"),
    ("degenerate", "degenerate_groups", "{:d}"),
    ("lag", "version_lag_mean", "{:.2f}"),
    ("clipfrac", "clipfrac", "{:.3f}"),
    ("approx_kl", "approx_kl", "{:.2e}"),
    ("entropy", "entropy", "{:.3f}"),
    ("grad_norm", "grad_norm", "{:.3e}"),
    ("prm", "prm.score_mean", "{:+.2f}"),
    ("agree", "prm.agreement", "{:.0%}"),
    ("invalid", "prm.invalid_vote_rate", "{:.0%}"),
    ("judge_s", "prm.judge_latency_mean_s", "{:.2f}"),
    ("update_s", "update_s", "{:.1f}"),
    ("idle", "learner_idle_frac", "{:.0%}"),
)


def update_table(metrics: list[dict[str, Any]]) -> str:
    """One row per update of the metrics that tell how training goes (all of them: metrics.jsonl); a column
    no update has (the PRM's, in a run without one) is left out."""
    table = [c for c in _TABLE if any(c[1] in m for m in metrics)] or list(_TABLE)
    rows = [[c for c, _, _ in table]]
    for m in metrics:
        row = []
        for _, key, fmt in table:
            v = m.get(key)
            try:
                row.append(fmt.format(int(v) if fmt == "{:d}" else v) if v is not None else "-")
            except (TypeError, ValueError):
                row.append(str(v))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(table))]
    return "".join(" ".join(c.rjust(w) for c, w in zip(r, widths)) + "\n" for r in rows)


def train_progress_line(coord: Coordinator, metrics: dict[str, Any], updates: int, started: float) -> str:
    snap = coord.snapshot()
    elapsed = time.monotonic() - started
    target = f"/{updates}" if updates else ""
    util = _env_utilisation(snap) or 0.0
    parts = [
        f"[train] version {coord.learner_version}{target}",
        f"env utilisation {util:.0%}",
        f"episodes {len(coord.ended)} (running {snap['running']}, env errors {snap['env_errors']})",
        f"{snap['steps'] / elapsed if elapsed > 0 else 0.0:.2f} steps/s",
    ]
    if metrics:
        m = metrics
        parts.append(
            f"last update: reward {m.get('reward_mean', 0):+.2f}, success {m.get('success_rate', 0):.0%}, "
            f"clipfrac {m.get('clipfrac', 0):.3f}, lag {m.get('version_lag_mean', 0):.1f}, "
            f"learner idle {m.get('learner_idle_frac', 0):.0%}"
        )
    parts.append(f"{elapsed:.0f} s")
    return " · ".join(parts)


def prm_spec(cfg: GuirlConfig, run_dir: Path, broker: str, learner: Any) -> ActorSpec:
    """The PRM actor: judges through `broker`; its scores go to the learner when it trains on them
    (`step_wise`), else they are only recorded beside the episodes."""
    return ActorSpec(
        name="prm",
        target="guirl.actors.prm:PRMActor",
        bind=[cfg.endpoints.prm],
        run_dir=str(run_dir),
        cpus=cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus"),
        options={
            "broker": broker,
            "learner": learner.endpoints[0] if cfg.train.advantage == "step_wise" else "",
            "run_dir": str(run_dir),
            "prm": msgspec.to_builtins(cfg.prm),
        },
    )


async def _follow(
    coord: Coordinator,
    sup: Supervisor,
    cfg: GuirlConfig,
    run_dir: Path,
    out: TextIO,
    tracking: _Tracking,
    status: Any = None,
) -> None:
    """Print progress (and log it to W&B) until the learner has made its updates; fail if an actor cannot
    be kept up."""
    started, last = time.monotonic(), ""
    kill_prm_at = cfg.train.fault_kill_prm_at_version
    kill_learner_at = cfg.train.fault_kill_learner_at_version
    while True:
        coord.progress.clear()
        try:
            await asyncio.wait_for(coord.progress.wait(), cfg.eval.progress_interval_s)
        except TimeoutError:
            pass
        tracking.poll(coord, started)
        if status is not None:
            status.maybe(sup, coord)
        for e in sup.history:
            if e.kind == "gave_up":
                raise EvalError(f"actor {e.name} kept crashing ({e.detail}); see its log")
            if e.kind == "completed" and e.name == "learner":
                out.write(
                    train_progress_line(coord, last_json_line(run_dir / "metrics.jsonl"), 0, started) + "\n"
                )
                return
        if kill_prm_at and coord.learner_version >= kill_prm_at and "prm" in sup.actors:
            kill_prm_at = 0  # once: the supervisor restarts it; workers keep their transitions meanwhile
            pid = sup.kill("prm")
            out.write(
                f"[train] fault injection: SIGKILLed the PRM (pid {pid}) at version {coord.learner_version}\n"
            )
        if kill_learner_at and coord.learner_version >= kill_learner_at and "learner" in sup.actors:
            kill_learner_at = 0  # once: the supervisor restarts it from its latest checkpoint
            pid = sup.kill("learner")
            out.write(
                f"[train] fault injection: SIGKILLed the learner (pid {pid}) at version "
                f"{coord.learner_version}\n"
            )
        line = train_progress_line(
            coord, last_json_line(run_dir / "metrics.jsonl"), cfg.train.updates, started
        )
        if line.split(" · ")[:2] != last.split(" · ")[:2]:
            out.write(line + "\n")
            out.flush()
        last = line


def _learner_restarts(run_dir: Path) -> int:
    from guirl.learner.lineage import Lineage

    try:
        lineage = Lineage.load(run_dir)
    except ValueError:  # damaged: the learner refused to start on it, and said so
        return 0
    return lineage.epoch if lineage is not None else 0


def check_train_config(cfg: GuirlConfig) -> None:
    """The settings a train run needs, checked before anything starts (also by `guirl train --dry-run`)."""
    t = cfg.train
    if cfg.inference.backend not in ("hf", "sglang"):
        raise InputError(
            f"inference.backend={cfg.inference.backend!r}: training needs the engine's token ids and "
            'log-probs; use "hf" or "sglang"'
        )
    if not t.updates:
        raise InputError("train.updates must be set (> 0): the number of policy updates to make")
    if t.advantage == "step_wise" and not cfg.prm.enabled:
        raise InputError('train.advantage = "step_wise" needs PRM scores: set prm.enabled = true')
    check_chaos_config(cfg)


def weight_options(cfg: GuirlConfig, placement: Any) -> dict[str, Any]:
    """The learner's side of the weight sync: where it trains, how many ranks the engines take in the
    weight group, its layout (the sglang backend's, or guirl's own for hf engines), backend and dtype."""
    t, inference = cfg.train, cfg.inference
    on_gpu = bool(placement is not None and placement.learner_gpus) or t.device == "cuda"
    sglang = inference.backend == "sglang"
    engines = len(inference.sglang.urls) if sglang and inference.sglang.urls else inference.engines
    backend = {"auto": "nccl" if on_gpu else "gloo"}.get(t.weight_backend, t.weight_backend)
    dtype = t.weight_dtype
    if dtype == "auto":
        dtype = "bfloat16" if sglang else inference.hf.dtype
    return {
        "device": "cuda" if on_gpu else (t.device or "cpu"),
        "engines": engines * (inference.sglang.tp_size if sglang else 1),
        "weight_layout": "sglang" if sglang else "guirl",
        "weight_flattened": inference.sglang.weight_load_format == "flattened_bucket",
        "weight_backend": backend,
        "weight_dtype": dtype,
    }


async def run_train(
    cfg: GuirlConfig,
    run_dir: Path | None = None,
    *,
    resume: bool = False,
    out: TextIO = sys.stdout,
    cluster: Any = None,
) -> dict:
    """Train until `train.updates` updates are made; returns (and writes) the summary. With `resume`,
    `run_dir` is a run to continue from its latest checkpoint. `cluster` (`guirl.cluster.run.ClusterRun`)
    places the actors on hosts; none: this machine's one-host cluster."""
    from guirl.cluster.run import ClusterRun

    cluster = cluster or ClusterRun.local(cfg)
    cfg = cluster.apply(cfg)
    t, e = cfg.train, cfg.eval
    if not cfg.data.train and not cfg.data.eval:
        check_env_provider(cfg)
        check_prompt_style(cfg)
    check_train_config(cfg)
    cpu_set(cfg.cluster.learner_cpus, "cluster.learner_cpus")
    cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus")
    if t.sync:
        # in turns: no sample ahead of its version, and no broadcast overlapping the next update
        cfg = msgspec.structs.replace(
            cfg, train=msgspec.structs.replace(t, max_staleness=0, overlap_publish=False)
        )
        t = cfg.train
    dataset = bool(cfg.data.train)  # GUI-R1 mode: grounding rows and a rule reward instead of desktops
    skipped: list[SkippedTask] = []
    eval_skipped: list[SkippedTask] = []
    if dataset:
        from guirl.actors.dataset_worker import dataset_tasks

        if t.advantage == "step_wise":
            raise InputError('train.advantage = "step_wise" is for desktop episodes; GUI-R1 mode is "grpo"')
        tasks = dataset_tasks(cfg.data.train, "train", cfg.data.limit)
        if t.eval_every and not cfg.data.eval:
            raise InputError("train.eval_every in GUI-R1 mode needs data.eval (held-out rows)")
        eval_tasks = dataset_tasks(cfg.data.eval, "eval", cfg.data.limit) if t.eval_every else []
    else:  # both suites are checked before any VM starts
        tasks, skipped = check_supported(
            load_suite(t.tasks),
            skip_unsupported=t.skip_unsupported,
            source=t.tasks,
            available=run_settings(cfg),
        )
        eval_tasks, eval_skipped = (
            check_supported(
                load_suite(e.tasks, examples_dir=e.examples_dir, domains=e.domains, limit=e.limit),
                skip_unsupported=e.skip_unsupported,
                source=e.tasks,
                available=run_settings(cfg),
            )
            if t.eval_every
            else ([], [])
        )
    from guirl.placement import apply

    placement = cluster.plan(cfg, "train")  # the GPU layout (per host when the cluster file names GPUs)
    cfg = apply(cfg, placement)
    ckpt = resolve_checkpoint(cfg)
    judge_ckpt = resolve_prm_checkpoint(cfg) if cfg.prm.enabled else None
    resume_from = None
    if resume:
        from guirl.actors.learner import latest_checkpoint

        if run_dir is None or not (run_dir / "coordinator.json").is_file():
            raise InputError(f"{run_dir}: not a train run directory (no coordinator.json)")
        resume_from = latest_checkpoint(run_dir)
        if resume_from is None:
            raise InputError(f"{run_dir}: no complete checkpoint to resume from")
    run_dir = run_dir or make_run_dir(cfg)
    save_resolved(cfg, run_dir)
    tracker = Tracker.open(cfg.wandb, run_dir=run_dir, config=msgspec.to_builtins(cfg), job="train")
    try:
        summary = await _train(
            cfg, run_dir, tracker, tasks, eval_tasks, ckpt, judge_ckpt, resume_from, out, placement, cluster
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
    placement: Any = None,
    cluster: Any = None,
) -> dict:
    from guirl.cluster.run import StatusPrinter
    from guirl.status import StatusWriter

    t, e = cfg.train, cfg.eval
    r = cfg.rollout
    started = time.monotonic()
    dataset = bool(cfg.data.train)
    mode = "sync" if t.sync else f"decoupled, max staleness {t.max_staleness}"
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
    print(
        f"[train] {len(tasks)} tasks from {cfg.data.train or t.tasks} · {r.batch_size} groups x "
        f"{r.n_samples_per_prompt} "
        f"samples per update · {t.updates} updates ({mode}) · run directory {run_dir}",
        file=out,
    )
    coord = Coordinator(
        "coordinator",
        heartbeat_dir=str(run_dir),
        heartbeat_s=cfg.cloud.heartbeat_s,
        tasks=tasks,
        mode="train",
        n_samples=r.n_samples_per_prompt,
        batch_size=r.batch_size,
        max_staleness=t.max_staleness,
        max_attempts=e.max_attempts,
        max_steps=cfg.agent.max_steps,
        seed=cfg.run.seed,
        state_path=str(run_dir / "coordinator.json"),
        eval_tasks=eval_tasks,
        eval_every=t.eval_every,
        eval_log=str(run_dir / "eval.jsonl"),
        runtime=cfg.runtime,
        codec=cfg.codec,
        bind=[cfg.endpoints.coordinator],
    )
    if resume_from is not None:
        learned = json.loads((resume_from / "learner.json").read_text())
        state = json.loads((run_dir / "coordinator.json").read_text())
        again = coord.restore(state, set(learned["trained_groups"]), int(learned["version"]))
        print(
            f"[train] resuming at version {learned['version']} from {resume_from}; {again} group(s) again",
            file=out,
        )
    monkey = None
    coord_task = await coord.start()
    try:
        async with Supervisor(cfg, run_dir=str(run_dir), launchers=cluster.launchers) as sup:
            broker_actor = broker_spec(cfg, ckpt, run_dir, judge_ckpt=judge_ckpt, placement=placement)
            broker = await _start_or_explain(sup, cluster.place(broker_actor, "broker"))
            learner_actor = ActorSpec(
                name="learner",
                target="guirl.actors.learner:Learner",
                bind=[cfg.endpoints.learner],
                run_dir=str(run_dir),
                cpus=cpu_set(cfg.cluster.learner_cpus, "cluster.learner_cpus"),
                env=placement.learner_env() if placement is not None else {},
                options={
                    "train": msgspec.to_builtins(t),
                    "ckpt": ckpt,
                    "run_dir": str(run_dir),
                    "n_samples": r.n_samples_per_prompt,
                    "batch_size": r.batch_size,
                    "temperature": cfg.agent.temperature,
                    "broker": broker.endpoints[0],
                    "coordinator": coord.endpoints[0],
                    "seed": cfg.run.seed,
                    **weight_options(cfg, placement),
                    "resume_from": str(resume_from or ""),
                    "ranks": t.ranks,
                    "prm_timeout_s": cfg.prm.score_timeout_s,
                },
            )
            learner = await _start_or_explain(sup, cluster.place(learner_actor, "learner"))
            prm = None
            if cfg.prm.enabled:
                prm_actor = prm_spec(cfg, run_dir, broker.endpoints[0], learner)
                prm = await _start_or_explain(sup, cluster.place(prm_actor, "prm"))
            print(f"[train] broker{', PRM' if prm else ''} and learner up", file=out)
            vms = [n for _, n in cluster.slots]

            def make_worker(i: int, vms_i: int) -> ActorSpec:
                return worker_spec(
                    cfg,
                    i,
                    run_dir,
                    coordinator=coord.endpoints[0],
                    broker=broker.endpoints[0],
                    learner=learner.endpoints[0],
                    vms=vms_i,
                    dataset=dataset,
                    **(
                        {
                            "prm": prm.endpoints[0],
                            "prm_history_images": cfg.prm.history_images,
                            "prm_queue": cfg.prm.worker_queue,
                        }
                        if prm
                        else {}
                    ),
                )

            for i, (host, vms_i) in enumerate(cluster.slots):
                await _start_or_explain(sup, cluster.on_host(make_worker(i, vms_i), host))
            print(f"[train] {e.workers} env worker(s), {sum(vms)} VMs up", file=out)
            tracking = _Tracking(tracker, run_dir)
            await cluster.serve(sup, make_worker, out, coord)
            try:
                writer = StatusWriter(run_dir, coord, mode="train")
                writer.watch_broker(broker.endpoints[0])
                status = StatusPrinter(cluster, cluster.status_interval_s, out, writer)
                if prm is not None:
                    writer.watch_prm(prm.endpoints[0])
                monkey = start_monkey(cfg, "train", run_dir, sup, coord, writer, out)
                try:
                    await _follow(coord, sup, cfg, run_dir, out, tracking, status)
                finally:
                    if monkey is not None:
                        monkey.release()  # nothing is left stopped
            finally:  # no add/remove may run while (or after) the actors are stopped
                await cluster.close()
            coord.no_more_groups = True  # the updates are made: let the last evaluation finish
            deadline = time.monotonic() + 600
            while coord.evals_pending() and time.monotonic() < deadline:
                coord.progress.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(coord.progress.wait(), 5)
            for line in coord.eval_lines:
                out.write(
                    f"[train] evaluation at version {line['version']}: accuracy {line['accuracy']} "
                    f"({line['scored']}/{line['tasks']} scored) {line['domains']}\n"
                )
            tracking.poll(coord, started)
            snap = coord.snapshot()  # before shutting down: stopping takes time that is not the run's
            coord.finish()
            await sup.stop_all()
            coord.settle_unreported(run_dir / "episodes")
            writer.maybe(sup, force=True)  # the last picture: every actor down, the run done
    finally:
        await cluster.close()
        coord.request_shutdown("train done")
        await coord_task
    elapsed = time.monotonic() - started
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = list({m["version"]: m for m in lines}.values())  # by version: a restarted learner repeats one
    steps_trained = sum(m.get("samples", 0) for m in metrics)
    util = _env_utilisation(snap)
    env_utilisation = round(util, 4) if util is not None else None
    # steady state: samples trained per second from the first update to the last (start-up left out)
    span = metrics[-1]["time"] - metrics[0]["time"] if len(metrics) > 1 else 0.0
    steady = round(sum(m.get("samples", 0) for m in metrics[1:]) / span, 3) if span > 0 else None
    summary = {
        "run_dir": str(run_dir),
        "mode": "train",
        "sync": t.sync,
        "checkpoint": ckpt,
        "seconds": round(elapsed, 2),
        "updates": len(metrics),
        "final_version": metrics[-1]["version"] if metrics else 0,
        "episodes": len(coord.ended),
        "env_errors": snap["env_errors"],
        "env_steps": snap["steps"],
        "samples_trained": steps_trained,
        "samples_per_s": round(steps_trained / elapsed, 3) if elapsed > 0 else 0.0,
        "reward_mean_by_update": [m.get("reward_mean") for m in metrics],
        "learner_idle_frac": metrics[-1].get("learner_idle_frac") if metrics else None,
        "env_utilisation": env_utilisation,
        "evaluations": coord.eval_lines,
        "steady_samples_per_s": steady,
        # faults the run survived: learner restarts (each one a new lineage epoch), the episodes the
        # learner would not train (played by weights a dead learner made after its checkpoint) and the
        # groups handed out again whole after a restart
        "learner_restarts": _learner_restarts(run_dir),
        "episodes_rejected": coord.counters["episodes.rejected_by_learner"],
        "episodes_reissued": coord.counters["episodes.reissued_version_mismatch"]
        + coord.counters["episodes.reissued_undelivered"],
        "episodes_undelivered": coord.counters["episodes.undelivered"],
        "groups_reissued": coord.counters["groups.reissued"],
    }
    if monkey is not None:
        summary["chaos"] = monkey.summary()
    write_json_atomic(run_dir / "summary.json", summary)
    out.write(update_table(metrics))
    print(
        f"[train] {summary['updates']} updates (version {summary['final_version']}) in {elapsed:.1f} s · "
        f"{summary['episodes']} episodes, {summary['env_steps']} env steps, {steps_trained} samples trained "
        f"({summary['samples_per_s']}/s) · rewards by update {summary['reward_mean_by_update']}",
        file=out,
    )
    print(f"[train] metrics: {run_dir / 'metrics.jsonl'} · summary: {run_dir / 'summary.json'}", file=out)
    return summary
