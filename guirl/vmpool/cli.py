"""`guirl vm`: a local VM for a person debugging a task.

guirl vm shot OUT.png                      start a desktop, save a screenshot, stop
guirl vm run TASK.json [--solution S.jsonl] [--shots DIR] [--action JSON]...
                                           set the task up, perform the actions, evaluate, print the score
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
    for p in (shot, runp):
        p.add_argument("--width", type=int, default=1920)
        p.add_argument("--height", type=int, default=1080)


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
    from guirl.vmpool.client import VMClient
    from guirl.vmpool.local import LocalProvider
    from guirl.vmpool.runner import load_solution, play
    from guirl.vmpool.tasks.model import load_task
    from guirl.vmpool.tasks.setup import TaskContext

    task = load_task(args.task)
    actions = load_solution(args.solution) if args.solution else []
    for text in args.action:
        try:
            actions.append(msgspec.json.decode(text, type=AnyAction))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            print(f"guirl vm: --action {text!r}: {exc}", file=sys.stderr)
            return 2
    provider = LocalProvider(root, width=args.width, height=args.height)
    vm = await provider.create("cli")
    try:
        async with VMClient(provider.address(vm), timeout_s=120) as client:
            ctx = TaskContext(
                task_id=task.id,
                cache_dir=Path(root) / "cache",
                download_cache=Path(root) / "dl",
                width=args.width,
                height=args.height,
            )
            ctx.cache_dir.mkdir(parents=True, exist_ok=True)
            episode = await play(task, client, actions, ctx, keep_screenshots=bool(args.shots))
    finally:
        await provider.delete(vm)
    if args.shots:
        out = Path(args.shots)
        out.mkdir(parents=True, exist_ok=True)
        for i, png in enumerate(episode.screenshots):
            (out / f"step{i:03d}.png").write_bytes(png)
    print(
        json.dumps(
            {"task": task.id, "score": episode.score, "steps": episode.steps, "refused": episode.refused}
        )
    )
    return 0


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="guirl-vm-") as root:
        return asyncio.run(_shot(args, root) if args.vm_cmd == "shot" else _run(args, root))
