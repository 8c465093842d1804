"""`guirl eval`: evaluation-only mode, end to end, on the run's cluster of processes.

The coordinator runs in this process (it owns the task list and the results); the inference broker
(with its engines) and W env workers (K VMs each) run as supervised actor processes (`guirl.roles`). A
progress line shows tasks done, successes, environment errors and steps/s; at the end a table of accuracy
per domain is printed and `summary.json` written in the run directory, beside the per-episode folders.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, TextIO

from guirl import roles
from guirl.actors.coordinator import TaskResult
from guirl.config import GuirlConfig, make_run_dir, save_resolved
from guirl.config.validate import check_replay_source
from guirl.errors import InputError, RunError
from guirl.fileio import read_jsonl, write_json_atomic
from guirl.model.checkpoints import resolve_checkpoint
from guirl.placement import apply, vm_split
from guirl.report import Earlier, eval_end_lines, eval_summary, progress_line


async def run_eval(
    cfg: GuirlConfig,
    run_dir: Path | None = None,
    *,
    resume: bool = False,
    out: TextIO = sys.stdout,
    cluster: Any = None,
) -> dict:
    """Run every task of `cfg.eval.tasks` once; returns (and writes) the summary. With `resume`, `run_dir`
    is an earlier eval: the tasks it scored are kept, the others run, into one summary. `cluster`
    (`guirl.cluster.run.ClusterRun`) places the actors on hosts; none: this machine's one-host cluster."""
    from guirl.cluster.run import ClusterRun

    cluster = cluster or ClusterRun.local(cfg)
    cfg = cluster.prepare(cfg, "eval")  # checked (`guirl.config.validate`) for this cluster
    tasks, skipped = roles.suite(cfg, "eval")  # before any VM starts
    placement = cluster.plan(cfg, "eval")  # the GPU layout (per host when the cluster file names GPUs)
    cfg = apply(cfg, placement)
    ckpt = resolve_checkpoint(cfg)
    if resume and run_dir is None:
        raise RunError("resuming needs the run directory of the eval to resume")
    suite = {t.task_id for t in tasks}
    earlier = earlier_sessions(cfg, run_dir, suite) if resume else Earlier()  # type: ignore[arg-type]
    run_dir = run_dir or make_run_dir(cfg)
    check_replay_source(cfg, run_dir)
    save_resolved(cfg, run_dir)
    started = time.monotonic()
    source = cfg.data.eval or cfg.eval.tasks
    if resume:
        scored = {r.task_id for r in earlier.results}
        tasks = [t for t in tasks if t.task_id not in scored]
        print(
            f"[eval] resuming: {len(earlier.results)} task(s) scored earlier are kept, {len(tasks)} to run",
            file=out,
        )
    print(f"[eval] {len(tasks)} tasks from {source} · run directory {run_dir}", file=out)
    if skipped:
        print(f"[eval] {len(skipped)} unsupported tasks skipped (listed in the summary)", file=out)
    coord = roles.coordinator(cfg, run_dir, "eval", tasks, first_seq=earlier.last_seq)
    run = await _play(cfg, run_dir, cluster, coord, placement, ckpt, out) if tasks else None
    seconds = time.monotonic() - started
    summary, table = eval_summary(
        coord,
        skipped,
        run_dir=run_dir,
        source=source,
        backend=cfg.inference.backend,
        ckpt=ckpt,
        seconds=seconds,
        earlier=earlier,
    )
    if run is not None and run.monkey is not None:
        summary["chaos"] = run.monkey.summary()
    if cfg.data.eval:
        from guirl.data.metrics import grounding_metrics, grounding_table

        final = {r["episode_id"] for r in summary["results"]}  # each row's final episode, of this suite
        summary["grounding"] = grounding_metrics(run_dir, episodes=final)
        table = grounding_table(summary["grounding"])
    write_json_atomic(run_dir / "summary.json", summary)
    print(table, file=out)
    eval_end_lines(summary, run_dir, seconds, out)
    return summary


# what a resumed eval must play as its earlier sessions did: a result scored with another model, agent,
# screen, action space or (GUI-R1 mode) rows and reward does not belong in the same summary. How it is
# served (engines, workers, batching) may change, and so may the task list: the results of this suite's
# tasks are kept.
RESUME_FIXED = (
    "model.hf_ckpt",
    "inference.backend",
    "inference.hf.dtype",
    "inference.openai.model",
    "inference.scripted.dir",
    "agent.",
    "env.action_space",
    "env.provider",  # a replay scores by its recording, a desktop by the task's evaluator
    "env.replay.run",
    "env.replay.tolerance_px",
    "env.observation_type",
    "env.screen_width",
    "env.screen_height",
    "env.screenshot_cursor",
    "env.accessibility",
    "data.eval",
    "data.task_type",
    "data.format_weight",
    "data.accuracy_weight",
    "data.point_radius_px",
    "data.text_f1",
)


def earlier_sessions(cfg: GuirlConfig, run_dir: Path, suite: Collection[str] | None = None) -> Earlier:
    """What a resumed eval keeps of `run_dir`: each task's last scored result (`results.jsonl`; an aborted
    one runs again, as OSWorld's runner runs an example without a result again), the episodes, steps and
    environment errors of its sessions (`episodes.jsonl`), and the last episode number they used; with
    `suite`, of those tasks only. A run that is no eval, or whose settings in `RESUME_FIXED` differ from
    `cfg`'s, is refused (InputError)."""
    from guirl.actors.coordinator import EPISODE_LEDGER, RESULT_LEDGER

    if not (run_dir / "config.toml").is_file():
        raise InputError(f"{run_dir}: not a run directory (no config.toml in it)")
    if (run_dir / "coordinator.json").is_file():
        raise InputError(f"{run_dir}: a train run; `guirl train --resume` continues it")
    changed = _changed_settings(cfg, run_dir / "config.toml")
    if changed:
        raise InputError(
            f"{run_dir}: its results were scored with other settings ({'; '.join(changed)}); a resumed eval "
            "plays as its earlier sessions did — set them back (--set KEY=VALUE; the environment's GUI_* "
            "variables count too), or start a new run"
        )
    kept: dict[str, TaskResult] = {}
    steps_of: dict[str, int] = {}  # an episode's steps, for ledgers written before they carried them
    for line in read_jsonl(run_dir / RESULT_LEDGER):
        try:
            result = TaskResult(**line)
        except TypeError:
            continue  # not a result this guirl writes
        steps_of[result.episode_id] = result.steps
        if result.status == "completed" and (suite is None or result.task_id in suite):
            kept[result.task_id] = result
    earlier = Earlier(results=list(kept.values()))
    task_of: dict[str, str] = {}
    for line in read_jsonl(run_dir / EPISODE_LEDGER):
        eid = str(line.get("episode_id"))
        m = _EP.fullmatch(eid)
        if m:
            earlier.last_seq = max(earlier.last_seq, int(m.group(1)))
        if line.get("kind") == "assigned":
            task_of[eid] = str(line.get("task_id"))
        elif line.get("kind") == "ended" and (suite is None or task_of.get(eid) in suite):
            earlier.episodes += 1
            earlier.env_errors += bool(line.get("env_error"))
            steps = line.get("steps", steps_of.get(eid, 0))
            earlier.steps += steps if isinstance(steps, int) and steps > 0 else 0
    return earlier


def _changed_settings(cfg: GuirlConfig, saved: Path) -> list[str]:
    """`key: was X, now Y` for each setting of `RESUME_FIXED` the run's saved config gives otherwise: read
    as a resume reads it (paths resolved alike, an earlier guirl's relative ones included; a key it lacks
    at its default, or at what guirl did before the key existed, `_BEFORE_THEIR_KEY`)."""
    import tomllib

    import msgspec

    from guirl.config import load_config

    try:
        written = _flat(tomllib.loads(saved.read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{saved}: cannot read the run's saved config: {exc}") from None
    try:
        was = _flat(msgspec.to_builtins(load_config(saved, env={})))
    except ValueError:  # a config this guirl no longer loads: its values as written
        was = written
    was.update({k: v for k, v in _BEFORE_THEIR_KEY.items() if k not in written})
    now = _flat(msgspec.to_builtins(cfg))
    fixed = [k for k in now if any(k == f or (f.endswith(".") and k.startswith(f)) for f in RESUME_FIXED)]
    # a backend's own settings count where that backend plays (a change of backend is said by itself), the
    # local desktops' where the desktops are local (a cloud VM runs OSWorld's image whatever they say), and
    # the replay's where the desktops are replayed
    fixed = [
        k
        for k in fixed
        if (not k.startswith("inference.") or k.split(".")[1] in ("backend", cfg.inference.backend))
        and (k not in _LOCAL_ONLY or cfg.env.provider == "local")
        and (not k.startswith("env.replay.") or cfg.env.provider == "replay")
    ]
    return [f"{k}: was {was[k]!r}, now {now[k]!r}" for k in fixed if k in was and was[k] != now[k]]


_LOCAL_ONLY = ("env.screenshot_cursor", "env.accessibility")
"""Settings of local desktops only."""

# what a run saved before a setting existed played with (where that is not the setting's default)
_BEFORE_THEIR_KEY = {"env.screenshot_cursor": False}


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_EP = re.compile(r"ep(\d+)")


async def _play(
    cfg: GuirlConfig, run_dir: Path, cluster: Any, coord: Any, placement: Any, ckpt: str, out: TextIO
) -> Any:
    """Start the broker and the env workers, play every task to its final result, stop them."""
    async with roles.RunActors(cfg, run_dir, cluster, coord, "eval") as run:
        broker = await run.start(roles.broker_spec(cfg, ckpt, run_dir, placement=placement))
        print(f"[eval] broker up ({cfg.inference.backend} x{cfg.inference.engines})", file=out)
        peers = roles.Peers(coordinator=coord.endpoints[0], broker=broker)
        workers = cfg.env.workers
        prewarm = vm_split(cfg.env.prewarm_envs, workers) if cfg.env.prewarm_envs else None
        await run.start_workers(roles.worker_specs(cfg, run_dir, peers, mode="eval"), prewarm)
        vms = [n for _, n in cluster.slots]
        print(f"[eval] {workers} env worker(s), {sum(vms)} VMs ({'/'.join(map(str, vms))}) up", file=out)
        await run.follow(
            lambda status: _progress(coord, run.sup, cfg.eval.progress_interval_s, out, status),
            out,
            watch={"broker": broker},
        )
        await run.stop()
    return run


async def _progress(coord: Any, sup: Any, interval: float, out: TextIO, status: Any = None) -> None:
    """Print progress until every task has its final result; fail if an actor cannot be kept up."""
    tty = out.isatty()
    last = ""
    while not coord.all_done.is_set():
        coord.progress.clear()
        try:
            await asyncio.wait_for(coord.progress.wait(), interval)
        except TimeoutError:
            pass
        if status is not None:
            status.maybe(sup, coord)
        gave_up = [e for e in sup.history if e.kind == "gave_up"]
        if gave_up:
            raise RunError(f"actor {gave_up[0].name} kept crashing ({gave_up[0].detail}); see its log")
        gone = {e.name for e in sup.history if e.kind in ("completed", "shut_down", "stopped")}
        workers = {name for name in sup.actors if name.startswith("worker")}
        if workers and workers <= gone and not coord.all_done.is_set():
            snap = coord.snapshot()
            raise RunError(f"every env worker ended with {snap['total'] - snap['done']} task(s) unfinished")
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
