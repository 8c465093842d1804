"""Running a task's `config` (and `postconfig`) steps on a VM.

Failures are `SetupError`s: an environment fault, never a policy failure. Where OSWorld only logs a
failed step (execute, launch, window steps), guirl raises too when the VM refused the request outright
(a missing program, a malformed step), since a task set up half-way is not the task; a command that runs
and exits non-zero is accepted, as in OSWorld (tasks rely on that).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guirl.vmpool.client import VMClient, VMError
from guirl.vmpool.tasks.files import FetchError, fetch
from guirl.vmpool.tasks.model import SetupStep, substitute

log = logging.getLogger(__name__)

MAX_SLEEP_S = 60.0
MAX_UNTIL_TRIES = 200


class SetupError(RuntimeError):
    """A setup step failed; the message names the step."""


@dataclass
class TaskContext:
    """What setup, getters and metrics need besides the VM."""

    task_id: str
    cache_dir: Path
    """Files fetched for this task, and files getters bring back from the VM."""
    download_cache: Path
    """Files downloaded from URLs, shared by all tasks (keyed by URL)."""
    width: int = 1920
    height: int = 1080
    password: str = "password"
    actions: list[Any] = field(default_factory=list)
    """The agent's actions, in order (the last decides infeasible tasks)."""
    evaluation_errors: list[str] = field(default_factory=list)
    """What went wrong while scoring (a metric that raised, a getter the VM answered with an error, a
    postconfig step the VM refused): each scored what OSWorld scores it, 0, and is recorded here."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """How the score was reached, for the run's viewer (`result.json`'s `evaluation`): each metric with what
    its getters returned (previewed: a file as its name and size, a value cut to a few hundred characters),
    its options and score, how they were joined, and the final score."""
    devtools_url: str | None = None
    """The DevTools endpoint of the VM's Chrome (`http://HOST:PORT`, Chrome's --remote-debugging-port), for
    the browser's setup steps and getters; None where the VM's browser cannot be reached."""
    chrome_profile_dir: str = "~/.config/google-chrome"
    """Chrome's user-data directory on the VM (OSWorld's Ubuntu image: Google Chrome's default)."""
    google_drive_settings: str | None = None
    """PyDrive's settings.yml for the Google Drive steps and getter (OSWorld's
    evaluation_examples/settings/googledrive/settings.yml); None: those tasks cannot run."""
    google_account: str | None = None
    """A JSON file `{"email", "password"}` for the `login` setup step (OSWorld's settings_file); None: those
    tasks cannot run."""


SETUP_TYPES = frozenset(
    {"execute", "command", "launch", "open", "sleep", "activate_window", "close_window", "download"}
)
"""The setup step types guirl implements."""


async def run_setup(
    client: VMClient, steps: list[SetupStep], ctx: TaskContext, where: str = "config"
) -> None:
    for i, step in enumerate(steps):
        name = f"{where}[{i}] ({step.type})"
        handler = _HANDLERS.get(step.type)
        if handler is None:
            raise SetupError(f"{name}: setup type {step.type!r} is not implemented")
        try:
            await handler(client, ctx, **step.parameters)
        except (VMError, FetchError, OSError) as exc:
            raise SetupError(f"{name}: {exc}") from exc
        except TypeError as exc:  # wrong or missing parameters
            raise SetupError(f"{name}: bad parameters: {exc}") from exc


async def _execute(
    client: VMClient,
    ctx: TaskContext,
    command: Any,
    shell: bool = False,
    stdout: str = "",
    stderr: str = "",
    until: dict | None = None,
) -> None:
    command = substitute(command, password=ctx.password, width=ctx.width, height=ctx.height)
    for _ in range(MAX_UNTIL_TRIES if until else 1):
        result = await client.execute(command, shell=shell)
        if stdout:
            (ctx.cache_dir / stdout).write_text(result.get("output") or "")
        if stderr:
            (ctx.cache_dir / stderr).write_text(result.get("error") or "")
        if not until or _until_met(until, result):
            return
        await asyncio.sleep(0.3)
    raise SetupError(f"{command!r} never met {until} in {MAX_UNTIL_TRIES} tries")


def _until_met(until: dict, result: dict) -> bool:
    return (
        ("returncode" in until and result.get("returncode") == until["returncode"])
        or ("stdout" in until and str(until["stdout"]) in (result.get("output") or ""))
        or ("stderr" in until and str(until["stderr"]) in (result.get("error") or ""))
    )


async def _launch(client: VMClient, ctx: TaskContext, command: Any, shell: bool = False) -> None:
    if isinstance(command, str) and not shell:
        command = command.split()
    await client.launch(command, shell=shell)


async def _open(client: VMClient, ctx: TaskContext, path: str) -> None:
    await client._call("POST", "/setup/open_file", idempotent=False, json={"path": path}, timeout_s=200.0)


async def _sleep(client: VMClient, ctx: TaskContext, seconds: float) -> None:
    await asyncio.sleep(min(float(seconds), MAX_SLEEP_S))  # a step of the task itself, not a sync


async def _window(
    client: VMClient,
    ctx: TaskContext,
    route: str,
    window_name: str,
    strict: bool = False,
    by_class: bool = False,
) -> None:
    body = {"window_name": window_name, "strict": strict, "by_class": by_class}
    await client._call("POST", route, idempotent=False, json=body)


async def _activate(client: VMClient, ctx: TaskContext, **kw: Any) -> None:
    await _window(client, ctx, "/setup/activate_window", **kw)


async def _close(client: VMClient, ctx: TaskContext, **kw: Any) -> None:
    await _window(client, ctx, "/setup/close_window", **kw)


async def _download(client: VMClient, ctx: TaskContext, files: list[dict[str, str]]) -> None:
    for f in files:
        local = await fetch(f["url"], ctx.download_cache)
        await client.upload(f["path"], local.read_bytes())


_HANDLERS = {
    "execute": _execute,
    "command": _execute,
    "launch": _launch,
    "open": _open,
    "sleep": _sleep,
    "activate_window": _activate,
    "close_window": _close,
    "download": _download,
}


def _chrome_steps() -> None:
    # Chrome's steps (DevTools, Google Drive, login) live apart; that module imports this one's TaskContext
    from guirl.vmpool.tasks.setup_chrome import HANDLERS

    _HANDLERS.update(HANDLERS)


_chrome_steps()
SETUP_TYPES = frozenset(_HANDLERS)
"""The setup step types guirl implements."""
