"""`guirl vm`: a local VM for a person debugging a task, and the cloud reaper.

guirl vm shot OUT.png                      start a desktop, save a screenshot, stop
guirl vm run TASK.json [--solution S.jsonl] [--shots DIR] [--action JSON]... [--action-space S]
        [--osworld-server MAIN.py]         set the task up, perform the actions, evaluate, print the score
guirl vm reap --provider P [--run RUN] [--older-than D] [--dry-run] [--config FILE] [--set K=V]...
                                           terminate guirl's instances of runs that are gone (or past TTL)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import msgspec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="vm_cmd", required=True)
    shot = sub.add_parser("shot", help="start a local desktop, save a screenshot")
    shot.add_argument("out", help="PNG file to write")
    runp = sub.add_parser("run", help="set up a task, perform actions, evaluate")
    runp.add_argument("task", help="an OSWorld-format task file")
    runp.add_argument("--solution", help="typed actions, one JSON object per line")
    runp.add_argument(
        "--action",
        action="append",
        default=[],
        help='one typed action as JSON (repeatable), e.g. \'{"type": "click", "x": 10, "y": 20}\'',
    )
    runp.add_argument("--shots", help="directory for a screenshot after each step")
    runp.add_argument(
        "--action-space",
        choices=["computer_use", "pyautogui"],
        default="computer_use",
        help="typed actions through /action, or composed pyautogui programs through OSWorld's /execute",
    )
    runp.add_argument(
        "--osworld-server",
        metavar="MAIN_PY",
        help="run OSWorld's own VM server (its main.py) on the desktop instead of guirl's",
    )
    for p in (shot, runp):
        p.add_argument("--width", type=int, default=1920)
        p.add_argument("--height", type=int, default=1080)
    reap = sub.add_parser(
        "reap",
        help="terminate guirl's cloud instances whose run is no longer alive (or past their TTL)",
        description="Lists the instances carrying guirl's tags; an instance is reaped when its TTL has run "
        "out, when its run's heartbeat (RUNS_DIR/RUN/heartbeat.json) has stopped, or, for a run with no "
        "heartbeat here, when it is older than --older-than.",
    )
    reap.add_argument("--provider", required=True, choices=["aws", "volcengine", "aliyun"])
    reap.add_argument("--run", default="", help="only this run's instances")
    reap.add_argument("--older-than", default="", metavar="D", help="e.g. 90m, 6h, 2d (runs not known here)")
    reap.add_argument("--runs-dir", default="", help="where runs' heartbeats are (default: run.root_dir)")
    reap.add_argument("--dry-run", action="store_true", help="list what would be reaped; terminate nothing")
    reap.add_argument("--config", help="TOML config (cloud settings); env vars and --set apply on top")
    reap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")


def parse_duration(text: str) -> float:
    """'90m', '6h', '2d', '45s' or plain seconds -> seconds; ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            value = float(t[:-1]) * units[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise ValueError(f"--older-than {text!r}: give a duration like 90m, 6h or 2d") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"--older-than {text!r}: must be a positive duration")
    return value


def reap_main(args: argparse.Namespace) -> int:
    from guirl.config import load_config
    from guirl.errors import InputError
    from guirl.vmpool.cloud import reap, run_alive
    from guirl.vmpool.clouds import make_cloud
    from guirl.vmpool.provider import ProviderError

    try:
        older = parse_duration(args.older_than) if args.older_than else None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    cfg = load_config(args.config, overrides=args.set)
    runs_root = Path(args.runs_dir or cfg.run.root_dir)
    try:
        api = make_cloud(args.provider, cfg.cloud, cfg.env.region)
    except (ValueError, ProviderError) as exc:  # a setting the adapter needs, or its SDK
        raise InputError(str(exc)) from None
    try:
        doomed = asyncio.run(
            reap(
                api,
                run=args.run,
                older_than_s=older,
                alive=lambda r: run_alive(runs_root, r),
                dry_run=args.dry_run,
            )
        )
    except ProviderError as exc:
        print(f"guirl vm reap: {exc}", file=sys.stderr)
        return 1
    verb = "would reap" if args.dry_run else "reaped"
    for inst in doomed:
        run, pool = inst.tags.get("guirl:run", "?"), inst.tags.get("guirl:pool", "?")
        print(f"{verb} {inst.id} (run {run}, pool {pool}, {inst.state})")
    print(json.dumps({"provider": args.provider, "dry_run": args.dry_run, "reaped": [i.id for i in doomed]}))
    return 0


async def _shot(args: argparse.Namespace, root: str) -> int:
    from guirl.vmpool.client import VMClient
    from guirl.vmpool.local import LocalProvider

    provider = LocalProvider(root, width=args.width, height=args.height)
    vm = await provider.create("cli")
    try:
        async with VMClient(provider.address(vm)) as client:
            Path(args.out).write_bytes(await client.screenshot())
    finally:
        await provider.delete(vm)
    print(f"wrote {args.out}")
    return 0


async def _run(args: argparse.Namespace, root: str) -> int:
    from guirl.agent.actions import AnyAction
    from guirl.config.schema import EnvConfig
    from guirl.vmpool.client import VMClient
    from guirl.vmpool.local import LocalProvider
    from guirl.vmpool.runner import load_solution, play
    from guirl.vmpool.tasks.model import load_task
    from guirl.vmpool.tasks.setup import TaskContext
    from guirl.vmpool.tunnel import devtools_endpoint

    task = load_task(args.task)
    actions = load_solution(args.solution) if args.solution else []
    for text in args.action:
        try:
            actions.append(msgspec.json.decode(text, type=AnyAction))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            print(f"guirl vm: --action {text!r}: {exc}", file=sys.stderr)
            return 2
    provider = LocalProvider(root, width=args.width, height=args.height, osworld_server=args.osworld_server)
    vm = await provider.create("cli")
    try:
        async with (
            VMClient(provider.address(vm), timeout_s=120) as client,
            devtools_endpoint(client, EnvConfig().chromium_port) as devtools,
        ):
            ctx = TaskContext(
                task_id=task.id,
                cache_dir=Path(root) / "cache",
                download_cache=Path(root) / "dl",
                width=args.width,
                height=args.height,
                devtools_url=devtools,
            )
            ctx.cache_dir.mkdir(parents=True, exist_ok=True)
            episode = await play(
                task, client, actions, ctx, keep_screenshots=bool(args.shots), action_space=args.action_space
            )
    finally:
        await provider.delete(vm)
    if args.shots:
        out = Path(args.shots)
        out.mkdir(parents=True, exist_ok=True)
        for i, png in enumerate(episode.screenshots):
            (out / f"step{i:03d}.png").write_bytes(png)
    print(
        json.dumps(
            {
                "task": task.id,
                "score": episode.score,
                "steps": episode.steps,
                "refused": episode.refused,
                "evaluation_errors": ctx.evaluation_errors,
                "evaluation": ctx.evaluation,
            }
        )
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.vm_cmd == "reap":
        return reap_main(args)
    with tempfile.TemporaryDirectory(prefix="guirl-vm-") as root:
        return asyncio.run(_shot(args, root) if args.vm_cmd == "shot" else _run(args, root))
