"""The basic getters: files from the VM or a URL, command output, rules, directory listings, sizes."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from guirl.vmpool.client import UNAVAILABLE, VMClient, VMError, VMFatalError
from guirl.vmpool.tasks.files import copy_into, fetch
from guirl.vmpool.tasks.setup import TaskContext

Getter = Callable[[dict[str, Any], VMClient, TaskContext], Awaitable[Any]]
"""`await getter(config, client, ctx)`: what the evaluator scores."""


def save(ctx: TaskContext, dest: str, data: bytes) -> Path:
    """Write what a getter brought back to `cache_dir/dest` (the task model keeps `dest` inside it)."""
    local = ctx.cache_dir / dest
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    return local


def _pairs(config: dict[str, Any]) -> tuple[list[str], list[str], list[int] | None]:
    paths, dests = config["path"], config["dest"]
    if not config.get("multi", False):
        return [paths], [dests], None
    return list(paths), list(dests), list(config.get("gives", [0]))


def _give(values: list[Any], gives: list[int] | None) -> Any:
    if gives is None:
        return values[0]
    picked = [values[i] for i in gives]
    return picked[0] if len(picked) == 1 else picked


async def vm_file(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    paths, dests, gives = _pairs(config)
    out = []
    for path, dest in zip(paths, dests, strict=True):
        data = await client.get_file(path)
        if data is None:
            out.append(None)
            continue
        out.append(str(save(ctx, dest, data)))
    return _give(out, gives)


async def cloud_file(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    paths, dests, gives = _pairs(config)
    out = []
    for url, dest in zip(paths, dests, strict=True):
        local = await fetch(url, ctx.download_cache)
        out.append(str(copy_into(local, ctx.cache_dir / dest)))
    return _give(out, gives)


async def rule(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return config.get("rules")


def answered(exc: VMError) -> bool:
    """The VM's server answered, with an error status: OSWorld's getters then return None (the task scores
    what None scores). No answer at all (status 0: down, unreachable, timed out), or an answer that the
    desktop cannot give it (`UNAVAILABLE`), is an environment fault."""
    return exc.status not in (0, *UNAVAILABLE)


async def _command(config: dict[str, Any], client: VMClient, key: str) -> Any:
    try:
        result = await client.execute(config["command"], shell=bool(config.get("shell", False)))
    except VMError as exc:
        # OSWorld's server answers 500 when the program cannot start (or ran past its 120 s), and
        # OSWorld's getter returns None for any answer but 200
        if answered(exc):
            return None
        raise
    return result.get(key)


async def vm_command_line(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return await _command(config, client, "output")


async def vm_command_error(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return await _command(config, client, "error")


async def vm_terminal_output(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    try:
        body = (await client._call("GET", "/terminal", idempotent=True))[1]
    except VMError as exc:  # OSWorld's getter: None for any non-200; a desktop without AT-SPI raises
        if answered(exc):
            return None
        raise
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get("output") if isinstance(data, dict) else None


async def list_directory(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    try:
        return await client.list_directory(config["path"])
    except VMFatalError:  # the VM refused the request; a VM that did not answer is an environment fault
        return None


async def vm_screen_size(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    w, h = await client.screen_size()
    return {"width": w, "height": h}


async def cache_file(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    path = ctx.cache_dir / config["path"]
    if not path.exists():
        raise FileNotFoundError(os.fspath(path))
    return str(path)


GETTERS: dict[str, Getter] = {
    "vm_file": vm_file,
    "cloud_file": cloud_file,
    "rule": rule,
    "vm_command_line": vm_command_line,
    "vm_command_error": vm_command_error,
    "vm_terminal_output": vm_terminal_output,
    "list_directory": list_directory,
    "vm_screen_size": vm_screen_size,
    "cache_file": cache_file,
}
