"""The OSWorld task file, as typed data, and loading with errors that name the file and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from guirl.errors import InputError


class TaskError(InputError):
    """A task file that cannot be used: the message names the file and the field."""


class SetupStep(msgspec.Struct, frozen=True):
    """One step of `config` or `postconfig`: `{"type": ..., "parameters": {...}}`."""

    type: str
    parameters: dict[str, Any] = {}


Getter = dict[str, Any]
"""A getter config: `{"type": ..., ...}` (its other fields depend on the type)."""


class Evaluator(msgspec.Struct, frozen=True):
    """How a task is scored."""

    func: str | list[str]
    conj: Literal["and", "or"] = "and"
    result: Getter | list[Getter | None] | None = None
    expected: Getter | list[Getter | None] | None = None
    options: dict[str, Any] | list[dict[str, Any] | None] | None = None
    postconfig: list[SetupStep] = []


class Task(msgspec.Struct, frozen=True):
    """An OSWorld task (fields this project does not use are accepted and ignored)."""

    id: str
    instruction: str
    evaluator: Evaluator
    config: list[SetupStep] = []
    snapshot: str = ""
    source: str | list[str] = ""
    related_apps: list[str] = []
    proxy: bool = False

    @property
    def funcs(self) -> list[str]:
        return self.evaluator.func if isinstance(self.evaluator.func, list) else [self.evaluator.func]

    @property
    def infeasible(self) -> bool:
        return self.evaluator.func == "infeasible"


PLACEHOLDERS = (
    "{CLIENT_PASSWORD}",
    "{SCREEN_WIDTH_HALF}",
    "{SCREEN_HEIGHT_HALF}",
    "{SCREEN_WIDTH}",
    "{SCREEN_HEIGHT}",
)
"""The placeholders OSWorld substitutes, in its order (only in `execute`/`command` steps)."""
_PLACEHOLDER = re.compile(r"\{[A-Z][A-Z0-9_]*\}")


def _field(path: str) -> str:
    """msgspec's `$.config[2].type` as `config[2].type`."""
    return path[2:] if path.startswith("$.") else path.lstrip("$")


def parse_task(data: bytes | str, source: str = "<task>") -> Task:
    """A task from JSON text; `TaskError` names `source` and the bad field."""
    try:
        task = msgspec.json.decode(data, type=Task)
    except msgspec.ValidationError as exc:
        text = str(exc)
        where = text.rsplit(" - at `", 1)
        field = f" (field {_field(where[1].rstrip('`'))})" if len(where) == 2 else ""
        raise TaskError(f"{source}: {where[0]}{field}") from None
    except msgspec.DecodeError as exc:
        raise TaskError(f"{source}: not valid JSON: {exc}") from None
    _check_shape(task, source)
    return task


def load_task(path: str | Path) -> Task:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TaskError(f"{path}: cannot read: {exc}") from None
    return parse_task(data, str(path))


def _check_shape(task: Task, source: str) -> None:
    ev = task.evaluator
    if isinstance(ev.func, list):
        n = len(ev.func)
        for name in ("result", "expected", "options"):
            value = getattr(ev, name)
            if isinstance(value, list) and len(value) != n:
                raise TaskError(f"{source}: evaluator.{name} has {len(value)} entries for {n} funcs")
            if name == "result" and not isinstance(value, list) and not task.infeasible:
                raise TaskError(f"{source}: evaluator.result must be a list when func is a list")
    elif ev.func != "infeasible" and not isinstance(ev.result, dict):
        raise TaskError(f"{source}: evaluator.result must be a getter object (field evaluator.result)")
    for name in ("result", "expected"):
        value = getattr(ev, name)
        for g in value if isinstance(value, list) else [value]:
            dest = g.get("dest") if isinstance(g, dict) else None
            if isinstance(g, dict) and g.get("type") == "cache_file":  # a path inside the cache, too
                dest = g.get("path")
            for d in dest if isinstance(dest, list) else [dest]:
                # getters write `dest` under the task's cache directory: nothing may name a place outside it
                if d is not None and (
                    not isinstance(d, str) or not d or d.startswith(("/", "~")) or ".." in Path(d).parts
                ):
                    raise TaskError(f"{source}: evaluator.{name}.dest {d!r} must be a relative file name")
    for where, steps in (("config", task.config), ("evaluator.postconfig", ev.postconfig)):
        for i, step in enumerate(steps):
            if step.type in ("execute", "command"):
                command = step.parameters.get("command")
                if not isinstance(command, (str, list)) or not command:
                    raise TaskError(f"{source}: {where}[{i}].parameters.command is missing or empty")
                for token in _PLACEHOLDER.findall(json.dumps(command)):
                    if token not in PLACEHOLDERS:
                        raise TaskError(
                            f"{source}: {where}[{i}].parameters.command: unknown placeholder "
                            f"{token} (known: {', '.join(PLACEHOLDERS)})"
                        )


def substitute(command: str | list[str], *, password: str, width: int, height: int) -> str | list[str]:
    """OSWorld's placeholder substitution (plain replacement, in its order)."""
    values = {
        "{CLIENT_PASSWORD}": password,
        "{SCREEN_WIDTH_HALF}": str(width // 2),
        "{SCREEN_HEIGHT_HALF}": str(height // 2),
        "{SCREEN_WIDTH}": str(width),
        "{SCREEN_HEIGHT}": str(height),
    }

    def one(text: str) -> str:
        for key in PLACEHOLDERS:
            text = text.replace(key, values[key])
        return text

    return one(command) if isinstance(command, str) else [one(c) for c in command]


def getters_of(task: Task) -> list[str]:
    """The getter types a task's evaluator uses."""
    out = []
    for name in ("result", "expected"):
        value = getattr(task.evaluator, name)
        for g in value if isinstance(value, list) else [value]:
            if isinstance(g, dict) and g.get("type"):
                out.append(str(g["type"]))
    return out
