"""The VM server's way to the desktop's accessibility tree: one helper process (`atspi_walk.py`, under the
system's Python, which has Debian's pyatspi) started at the first request and kept for the next ones."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

WALKER = Path(__file__).with_name("atspi_walk.py")
CALL_TIMEOUT_S = 60.0
"""How long one walk may take (a desktop with a big document open takes seconds)."""
START_TIMEOUT_S = 30.0
INSTALL = "apt-get install python3-pyatspi at-spi2-core dbus-daemon"
SYSTEM_PYTHON = "/usr/bin/python3"
"""The Python Debian's python3-pyatspi is built for."""


class AtspiUnavailable(RuntimeError):
    """This desktop has no accessibility tree (no D-Bus session, or no pyatspi): the answer is 501."""


class AtspiError(RuntimeError):
    """The walk failed (an application misbehaved, or took too long): the answer is 500."""


def system_python() -> str | None:
    """The interpreter to run the walker with: Debian's python3, which python3-pyatspi is built for."""
    if os.path.exists(SYSTEM_PYTHON):
        return SYSTEM_PYTHON
    return shutil.which("python3", path="/usr/bin:/bin")


class Atspi:
    """The helper process, one request at a time (AT-SPI calls are synchronous D-Bus calls anyway)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()
        self.unavailable: str | None = None

    async def _start(self) -> asyncio.subprocess.Process:
        if not self.env.get("DBUS_SESSION_BUS_ADDRESS"):
            raise AtspiUnavailable(f"this desktop runs no D-Bus session bus (install it: {INSTALL})")
        python = system_python()
        if python is None:
            raise AtspiUnavailable(f"no system python3 to read AT-SPI with (install: {INSTALL})")
        proc = await asyncio.create_subprocess_exec(
            python,
            "-I",  # nothing from the user's environment or the current directory on its path
            str(WALKER),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self.env,
            limit=1 << 30,  # one line per tree: a tree with a big document open is megabytes
        )
        try:
            hello = json.loads(await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S) or b"{}")
        except (TimeoutError, ValueError):
            hello = {"error": "the accessibility helper did not start"}
        if not hello.get("ready"):
            proc.kill()
            await proc.wait()
            raise AtspiUnavailable(f"{hello.get('error', 'no answer')} (install: {INSTALL})")
        return proc

    async def call(self, op: str) -> dict[str, Any]:
        if self.unavailable:
            raise AtspiUnavailable(self.unavailable)
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                try:
                    self.proc = await self._start()
                except AtspiUnavailable as exc:
                    self.unavailable = str(exc)
                    raise
            proc = self.proc
            try:
                proc.stdin.write(json.dumps({"op": op}).encode() + b"\n")
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), CALL_TIMEOUT_S)
            except (TimeoutError, ConnectionError) as exc:
                await self.close()  # a hung walk: the next call starts a fresh helper
                raise AtspiError(
                    f"the accessibility tree was not read within {CALL_TIMEOUT_S:.0f} s"
                ) from exc
            if not line:
                await self.close()
                raise AtspiError("the accessibility helper exited (its messages are in the session log)")
            answer = json.loads(line)
            if not answer.get("ok"):
                raise AtspiError(str(answer.get("error")))
            return answer

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
