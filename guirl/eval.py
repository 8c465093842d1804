"""`guirl eval`: evaluation-only mode, end to end, on a local cluster of processes.

The coordinator runs in this process (it owns the task list and the results); the inference broker
(with its engines) and W env workers (K VMs each) run as supervised actor processes. A progress line
shows tasks done, successes, environment errors and steps/s; at the end a table of accuracy per domain
is printed and `summary.json` written in the run directory, beside the per-episode folders.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl.actors.coordinator import Coordinator, TaskResult
from guirl.config import GuirlConfig, make_run_dir, save_resolved
from guirl.errors import InputError
from guirl.fileio import write_json_atomic
from guirl.placement import vm_split
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor
from guirl.vmpool.tasks.suite import SkippedTask, check_supported, load_suite

log = logging.getLogger(__name__)

TINY = "tiny"
"""`model.hf_ckpt = "tiny"`: the tiny random Qwen3-VL, built offline on first use (see `tiny_cache`)."""
TINY_CACHE = Path(".cache") / "tiny-qwen3vl"


class EvalError(RuntimeError):
    """The run could not finish (an actor kept crashing, a deadline passed)."""


def resolve_checkpoint(cfg: GuirlConfig) -> str:
    """The policy checkpoint path the broker loads ("" for backends that need none)."""
    ckpt = cfg.model.hf_ckpt
    if cfg.inference.backend != "hf":
        return ckpt
    return _hf_checkpoint(
        ckpt,
        "model.hf_ckpt",
        "no policy checkpoint: set HF_CKPT (or model.hf_ckpt) to a Hugging Face checkpoint directory, "
        'or to "tiny" for the tiny random Qwen3-VL (`guirl model tiny DIR` builds one)',
    )


def _hf_checkpoint(path: str, key: str, missing: str) -> str:
    """A checkpoint directory the transformers backend loads: `path`, or the tiny model for "tiny";
    InputError (`missing` when unset) otherwise."""
    if path == TINY:
        from guirl.model.tiny import ensure_tiny_checkpoint

        return str(ensure_tiny_checkpoint(TINY_CACHE))
    if not path:
        raise InputError(missing)
    if not Path(path, "config.json").is_file():
        raise InputError(f"{key}={path!r} is not a checkpoint directory (no config.json in it)")
    return path


# -- reporting ---------------------------------------------------------------------------------------


def progress_line(snap: dict[str, Any]) -> str:
    scored = snap["scored"]
    rate = f"{100.0 * snap['score_sum'] / scored:.1f}%" if scored else "-"
    sps = snap["steps"] / snap["elapsed_s"] if snap["elapsed_s"] > 0 else 0.0
    return (
        f"[eval] {snap['done']}/{snap['total']} tasks · running {snap['running']} · "
        f"success {snap['success']}/{scored} ({rate}) · env errors {snap['env_errors']} · "
        f"aborted {snap['aborted']} · {sps:.2f} steps/s · {snap['elapsed_s']:.0f} s"
    )


def run_settings(cfg: GuirlConfig) -> set[str]:
    """What the run's configuration provides to tasks that need a setting (Chrome's DevTools, Google)."""
    from guirl.vmpool.tasks.check import available_settings

    env = cfg.env
    return available_settings(
        devtools=env.provider != "local" and env.chromium_port > 0,
        drive=bool(env.google_drive_settings),
        account=bool(env.google_account),
        atspi=env.provider != "local",
    )


def domain_table(
    results: list[TaskResult], skipped: list[SkippedTask] | tuple = ()
) -> tuple[dict[str, dict], str]:
    """Accuracy per domain (mean evaluator score over scored tasks; aborted tasks — environment errors
    to the last attempt — and skipped tasks — unsupported, never run — are listed apart, never counted
    as failures) and the table as text."""
    blank = {"tasks": 0, "scored": 0, "success": 0, "score_sum": 0.0, "skipped": 0}
    rows: dict[str, dict] = defaultdict(lambda: dict(blank))
    for r in results:
        for key in (r.domain, "all"):
            row = rows[key]
            row["tasks"] += 1
            if r.status == "completed":
                row["scored"] += 1
                row["score_sum"] += r.score or 0.0
                row["success"] += int((r.score or 0.0) >= 1.0)
    for t in skipped:
        for key in (t.domain, "all"):
            rows[key]["tasks"] += 1
            rows[key]["skipped"] += 1
    out: dict[str, dict] = {}
    for key, row in rows.items():
        scored = row["scored"]
        out[key] = {
            **row,
            "score_sum": round(row["score_sum"], 4),
            "aborted": row["tasks"] - scored - row["skipped"],
            "accuracy": round(row["score_sum"] / scored, 4) if scored else None,
        }
    order = sorted(k for k in out if k != "all") + ["all"]
    names = ("tasks", 5), ("scored", 6), ("success", 7), ("aborted", 7), ("skipped", 7), ("accuracy", 9)
    head = f"{'domain':<20} " + " ".join(f"{n:>{w}}" for n, w in names)
    lines = [head]
    for key in order:
        r = out[key]
        acc = f"{100 * r['accuracy']:.1f}%" if r["accuracy"] is not None else "-"
        if key == "all":
            lines.append("-" * len(head))
        lines.append(
            f"{key:<20} {r['tasks']:>5} {r['scored']:>6} {r['success']:>7} {r['aborted']:>7} "
            f"{r['skipped']:>7} {acc:>9}"
        )
    return {k: out[k] for k in order}, "\n".join(lines)


# -- the run -----------------------------------------------------------------------------------------


async def _progress(
    coord: Coordinator, sup: Supervisor, interval: float, out: TextIO, status: Any = None
) -> None:
    """Print progress until every task has its final result; fail if an actor cannot be kept up."""
    tty = out.isatty()
    last = ""
    while not coord.all_done.is_set():
        coord.progress.clear()
        with_timeout = asyncio.wait_for(coord.progress.wait(), interval)
        try:
            await with_timeout
        except TimeoutError:
            pass
        if status is not None:
            status.maybe(sup, coord)
        gave_up = [e for e in sup.history if e.kind == "gave_up"]
        if gave_up:
            raise EvalError(f"actor {gave_up[0].name} kept crashing ({gave_up[0].detail}); see its log")
        gone = {e.name for e in sup.history if e.kind in ("completed", "shut_down", "stopped")}
        workers = {name for name in sup.actors if name.startswith("worker")}
        if workers and workers <= gone and not coord.all_done.is_set():
            snap = coord.snapshot()
            raise EvalError(f"every env worker ended with {snap['total'] - snap['done']} task(s) unfinished")
        line = progress_line(coord.snapshot())
        if tty:
            out.write("\r" + line + " " * max(0, len(last) - len(line)))
            out.flush()
        elif line.split(" · ")[:4] != last.split(" · ")[:4]:  # a log file gets a line per change
            out.write(line + "\n")
            out.flush()
        last = line
    if tty:
        out.write("\n")


def cpu_set(cpus: list[int], setting: str) -> list[int]:
    """`cpus` checked against the cores this process may use (a clear error, not a failed actor start)."""
    usable = os.sched_getaffinity(0)
    bad = sorted(set(cpus) - usable)
    if bad:
        raise InputError(f"{setting}: core(s) {bad} not available here (usable: {sorted(usable)})")
    return sorted(set(cpus))


def resolve_prm_checkpoint(cfg: GuirlConfig) -> str:
    """The PRM judge's checkpoint (`model.prm_model_path`, `PRM_MODEL_PATH`; "" for the scripted judge)."""
    path, backend = cfg.model.prm_model_path, cfg.prm.backend
    if backend == "scripted" or (backend == "openai" and cfg.prm.openai.model and not path):
        return ""  # the scripted judge needs no model; an OpenAI-compatible one is named by prm.openai.model
    missing = (
        "prm.enabled needs a judge: set PRM_MODEL_PATH (or model.prm_model_path) to its checkpoint, "
        '"tiny" for the tiny random Qwen3-VL, or prm.backend = "scripted"'
    )
    if backend == "hf":
        return _hf_checkpoint(path, "model.prm_model_path", missing)
    if not path:
        raise InputError(missing)
    return path


def check_env_provider(cfg: GuirlConfig) -> None:
    """The desktops' provider can be used as configured (a cloud's required settings, a private
    `cloud.cluster_cidr`); InputError otherwise."""
    from guirl.vmpool.clouds import check_cloud

    try:
        check_cloud(cfg.env.provider, cfg.cloud)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def check_prompt_style(cfg: GuirlConfig) -> None:
    """`agent.prompt_style = "gui-rl"` can be honoured: it is a computer-use prompt whose tools block the
    checkpoint's own template renders, which an OpenAI-compatible server does not; InputError otherwise."""
    if cfg.agent.prompt_style != "gui-rl":
        return
    if cfg.agent.response_format != "computer_use":
        raise InputError('agent.prompt_style = "gui-rl" needs agent.response_format = "computer_use"')
    if cfg.inference.backend == "openai":
        raise InputError(
            'agent.prompt_style = "gui-rl" needs inference.backend "hf" or "sglang": an OpenAI-compatible '
            "server rewrites the tools block that GUI-RL's prompt has the chat template render"
        )


def broker_spec(
    cfg: GuirlConfig, ckpt: str, run_dir: Path, *, judge_ckpt: str | None = None, placement: Any = None
) -> ActorSpec:
    """The inference broker of a run (eval and train modes alike); with `judge_ckpt`, it also serves the
    PRM's judge under `prm.model_name`; with `placement` (`guirl.placement.Placement`), its engines go on
    the planned GPUs."""
    judge = {"prm": msgspec.to_builtins(cfg.prm), "ckpt": judge_ckpt} if judge_ckpt is not None else None
    placed: dict[str, Any] = {}
    if placement is not None and placement.uses_gpus:
        placed = {
            "rollout_gpus": [list(e.gpus) for e in placement.rollout],
            "rollout_devices": [f"cuda:{e.ordinals[0]}" if e.ordinals else "" for e in placement.rollout],
            "judge_gpus": [list(e.gpus) for e in placement.judge],
            "judge_devices": [f"cuda:{e.ordinals[0]}" if e.ordinals else "" for e in placement.judge],
        }
    return ActorSpec(
        name="broker",
        target="guirl.actors.broker:InferenceBroker",
        bind=[cfg.endpoints.broker],
        run_dir=str(run_dir),
        cpus=cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus"),
        options={
            "inference": msgspec.to_builtins(cfg.inference),
            "ckpt": ckpt,
            "screen": [cfg.env.screen_width, cfg.env.screen_height],
            "coordinates": cfg.agent.coordinates,
            "judge": judge,
            "placement": placed,
            "log_dir": str(run_dir / "logs"),
        },
    )


def worker_spec(
    cfg: GuirlConfig, index: int, run_dir: Path, *, dataset: bool = False, **options: Any
) -> ActorSpec:
    """Env worker `index` of a run (eval and train modes alike): the agent, environment and timeouts of
    `cfg`, pinned to `cluster.rollout_cpus`, plus the mode's own `options` (endpoints, VMs...). With
    `dataset`, a dataset worker (GUI-R1 mode: episodes are grounding rows of `[data]`, not desktops)."""
    if dataset:
        options["data"] = msgspec.to_builtins(cfg.data)
    return ActorSpec(
        name=f"worker{index}",
        target="guirl.actors.dataset_worker:DatasetWorker"
        if dataset
        else "guirl.actors.env_worker:EnvWorker",
        run_dir=str(run_dir),
        cpus=cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus"),
        options={
            "run_dir": str(run_dir),
            "agent": msgspec.to_builtins(cfg.agent),
            "env": msgspec.to_builtins(cfg.env),
            **({"cloud": msgspec.to_builtins(cfg.cloud)} if cfg.env.provider != "local" else {}),
            "setup_timeout_s": cfg.eval.setup_timeout_s,
            "policy_timeout_s": cfg.inference.request_timeout_s,
            **options,
        },
    )


async def _start_or_explain(sup: Supervisor, spec: ActorSpec) -> Any:
    try:
        return await sup.start(spec)
    except Exception as exc:
        raise EvalError(f"the {spec.name} did not start: {exc}; see its log above") from exc


async def run_eval(
    cfg: GuirlConfig, run_dir: Path | None = None, *, out: TextIO = sys.stdout, cluster: Any = None
) -> dict:
    """Run every task of `cfg.eval.tasks` once; returns (and writes) the summary. `cluster`
    (`guirl.cluster.run.ClusterRun`) places the actors on hosts; none: this machine's one-host cluster."""
    from guirl.chaos import check_chaos_config, start_monkey
    from guirl.cluster.run import ClusterRun, StatusPrinter
    from guirl.status import StatusWriter

    cluster = cluster or ClusterRun.local(cfg)
    cfg = cluster.apply(cfg)
    e = cfg.eval
    check_chaos_config(cfg)
    dataset = bool(cfg.data.eval)  # GUI-R1 mode: held-out grounding rows instead of desktop tasks
    if not dataset:
        check_env_provider(cfg)
        check_prompt_style(cfg)
    if dataset:
        from guirl.actors.dataset_worker import dataset_tasks

        tasks = dataset_tasks(cfg.data.eval, "eval", cfg.data.limit or e.limit)
    else:
        tasks = load_suite(e.tasks, examples_dir=e.examples_dir, domains=e.domains, limit=e.limit)
    skipped: list[SkippedTask] = []
    if not dataset:  # before any VM starts
        tasks, skipped = check_supported(
            tasks, skip_unsupported=e.skip_unsupported, source=e.tasks, available=run_settings(cfg)
        )
    from guirl.placement import apply

    placement = cluster.plan(cfg, "eval")  # the GPU layout (per host when the cluster file names GPUs)
    cfg = apply(cfg, placement)
    ckpt = resolve_checkpoint(cfg)
    run_dir = run_dir or make_run_dir(cfg)
    save_resolved(cfg, run_dir)
    started = time.monotonic()
    source = cfg.data.eval if dataset else e.tasks
    print(f"[eval] {len(tasks)} tasks from {source} · run directory {run_dir}", file=out)
    if skipped:
        print(f"[eval] {len(skipped)} unsupported tasks skipped (listed in the summary)", file=out)
    coord = Coordinator(
        "coordinator",
        heartbeat_dir=str(run_dir),
        heartbeat_s=cfg.cloud.heartbeat_s,
        tasks=tasks,
        mode="eval",
        max_attempts=e.max_attempts,
        max_steps=cfg.agent.max_steps,
        seed=cfg.run.seed,
        runtime=cfg.runtime,
        codec=cfg.codec,
        bind=[cfg.endpoints.coordinator],
    )
    coord_task = await coord.start()
    monkey = None
    try:
        async with Supervisor(cfg, run_dir=str(run_dir), launchers=cluster.launchers) as sup:
            broker = await _start_or_explain(
                sup, cluster.place(broker_spec(cfg, ckpt, run_dir, placement=placement), "broker")
            )
            print(f"[eval] broker up ({cfg.inference.backend} x{cfg.inference.engines})", file=out)
            vms = [n for _, n in cluster.slots]
            prewarm = vm_split(cfg.env.prewarm_envs, e.workers) if cfg.env.prewarm_envs else [0] * e.workers

            def make_worker(i: int, vms_i: int, prewarm_i: int = 0) -> ActorSpec:
                return worker_spec(
                    cfg,
                    i,
                    run_dir,
                    coordinator=coord.endpoints[0],
                    broker=broker.endpoints[0],
                    vms=vms_i,
                    prewarm=min(vms_i, prewarm_i),
                    fault_kill_vm_at_step=e.fault_kill_vm_at_step if i == 0 else -1,
                    dataset=dataset,
                )

            try:
                async with asyncio.TaskGroup() as tg:
                    for i, (host, vms_i) in enumerate(cluster.slots):
                        spec = cluster.on_host(make_worker(i, vms_i, prewarm[i]), host)
                        tg.create_task(sup.start(spec))
            except* Exception as group:  # say which worker and why, not a traceback of the task group
                first = group.exceptions[0]
                raise EvalError(f"an env worker did not start: {first}; see its log above") from first
            print(
                f"[eval] {e.workers} env worker(s), {sum(vms)} VMs ({'/'.join(map(str, vms))}) up", file=out
            )
            await cluster.serve(sup, make_worker, out, coord)
            try:
                writer = StatusWriter(run_dir, coord, mode="eval")
                writer.watch_broker(broker.endpoints[0])
                status = StatusPrinter(cluster, cluster.status_interval_s, out, writer)
                monkey = start_monkey(cfg, "eval", run_dir, sup, coord, writer, out)
                try:
                    await _progress(coord, sup, e.progress_interval_s, out, status)
                finally:
                    if monkey is not None:
                        monkey.release()  # nothing is left stopped
            finally:  # no add/remove may run while (or after) the actors are stopped
                await cluster.close()
            await sup.stop_all()
            coord.settle_unreported(run_dir / "episodes")
            writer.maybe(sup, force=True)  # the last picture: every actor down, the run done
    finally:
        await cluster.close()
        coord.request_shutdown("eval done")
        await coord_task
    elapsed = time.monotonic() - started
    results = sorted(coord.results.values(), key=lambda r: (r.domain, r.task_id))
    per_domain, table = domain_table(results, skipped)
    snap = coord.snapshot()
    summary = {
        "run_dir": str(run_dir),
        "mode": "eval",
        "tasks_file": source,
        "backend": cfg.inference.backend,
        "checkpoint": ckpt,
        "seconds": round(elapsed, 2),
        "tasks": len(results),
        "accuracy": per_domain["all"]["accuracy"],
        "domains": per_domain,
        "episodes": len(coord.ended),
        "env_errors": snap["env_errors"],
        "aborted": snap["aborted"],
        "steps": snap["steps"],
        "outcomes": dict(Counter(r.outcome for r in results if r.status == "completed")),
        "results": [dataclasses.asdict(r) for r in results],
        "skipped": [dataclasses.asdict(t) for t in skipped],
    }
    if monkey is not None:
        summary["chaos"] = monkey.summary()
    if dataset:
        from guirl.data.metrics import grounding_metrics, grounding_table

        summary["grounding"] = grounding_metrics(run_dir)
        table = grounding_table(summary["grounding"])
    write_json_atomic(run_dir / "summary.json", summary)
    print(table, file=out)
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary["outcomes"].items())) or "none"
    print(
        f"[eval] {summary['episodes']} episodes, {summary['steps']} steps · outcomes: {outcomes} · "
        f"environment errors {summary['env_errors']} (retried, never scored)",
        file=out,
    )
    print(
        f"[eval] summary: {run_dir / 'summary.json'} · episodes: {run_dir / 'episodes'} ({elapsed:.1f} s)",
        file=out,
    )
    return summary
