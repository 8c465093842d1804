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
ATSPI_PARTS = (
    ("dbus-daemon", "dbus-daemon"),
    ("dbus-send", "dbus-bin"),
    ("/usr/libexec/at-spi-bus-launcher", "at-spi2-core"),
    ("/usr/lib/python3/dist-packages/pyatspi/__init__.py", "python3-pyatspi"),
)
"""What a local desktop's accessibility tree needs: (a command or file, its Debian package). The toolkits'
own bridges (libatk-adaptor, libgail-common, libreoffice-gtk3) come with `scripts/system-packages.txt`."""
INSTALL = f"apt-get install {' '.join(pkg for _, pkg in ATSPI_PARTS)}"
SYSTEM_PYTHON = "/usr/bin/python3"
"""The Python Debian's python3-pyatspi is built for."""


class AtspiUnavailable(RuntimeError):
    """This desktop has no accessibility tree (no D-Bus session, or no pyatspi): the answer is 501."""


class AtspiBusy(RuntimeError):
    """The tree could not be read now (the walk ran past its time, the helper died or did not start): the
    answer is 503, an environment fault; the next request starts a fresh helper."""


class AtspiError(RuntimeError):
    """The walk itself failed (an application answered AT-SPI with an error): the answer is 500, as
    OSWorld's server gives for an exception in its walk."""


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
        """Why this desktop has no tree, once known for good (no bus, no system Python, no pyatspi)."""

    async def _start(self) -> asyncio.subprocess.Process:
        if self.env.get("GUIRL_NO_ACCESSIBILITY"):
            raise AtspiUnavailable("accessibility is off on this desktop (env.accessibility = false)")
        if not self.env.get("DBUS_SESSION_BUS_ADDRESS"):
            raise AtspiUnavailable(f"this desktop runs no D-Bus session bus (install: {INSTALL})")
        python = system_python()
        if python is None:
            raise AtspiUnavailable(f"no system python3 to read AT-SPI with (install: {INSTALL})")
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                "-I",  # nothing from the user's environment or the current directory on its path
                str(WALKER),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
                limit=1 << 30,  # one line per tree: a tree with a big document open is megabytes
            )
        except OSError as exc:  # no fork now (EAGAIN, ENOMEM), or the python cannot be run: a fault, not a 0
            raise AtspiBusy(f"the AT-SPI helper did not start: {exc}") from exc
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
            hello = json.loads(line) if line else {}
        except (TimeoutError, ValueError):
            await _kill(proc)
            raise AtspiBusy(
                f"the accessibility helper did not start within {START_TIMEOUT_S:.0f} s"
            ) from None
        except BaseException:  # cancelled: the helper goes with the request
            await _kill(proc)
            raise
        if not isinstance(hello, dict) or not hello.get("ready"):
            await _kill(proc)
            if (
                isinstance(hello, dict) and "error" in hello
            ):  # it ran and said why (pyatspi does not import): for good
                raise AtspiUnavailable(f"{hello['error']} (install: {INSTALL})")
            raise AtspiBusy(
                "the accessibility helper exited at its start (its messages are in the session log)"
            )
        return proc

    async def call(self, op: str) -> dict[str, Any]:
        """The helper's answer to `op`; a helper that died since the last call is started again once."""
        if self.unavailable:
            raise AtspiUnavailable(self.unavailable)
        async with self.lock:
            for attempt in (1, 2):
                if self.proc is None or self.proc.returncode is not None:
                    try:
                        self.proc = await self._start()
                    except AtspiUnavailable as exc:
                        self.unavailable = str(exc)
                        raise
                try:
                    answer = await self._ask(self.proc, op)
                except ConnectionError:  # the helper had died: a fresh one, once
                    await self.close()
                    if attempt == 2:
                        raise AtspiBusy(
                            "the accessibility helper exited (its messages are in the session log)"
                        ) from None
                    continue
                if not answer.get("ok"):
                    if answer.get("busy"):  # AT-SPI itself (the registry, the bus) did not answer
                        raise AtspiBusy(str(answer.get("error")))
                    raise AtspiError(str(answer.get("error")))
                return answer
        raise AssertionError("unreachable")

    async def _ask(self, proc: asyncio.subprocess.Process, op: str) -> dict[str, Any]:
        try:
            try:
                proc.stdin.write(json.dumps({"op": op}).encode() + b"\n")
            except RuntimeError as exc:  # the helper exited, its pipe closed: a fresh one, as for a reset
                raise ConnectionResetError(f"the helper's input is closed: {exc}") from None
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), CALL_TIMEOUT_S)
        except TimeoutError:
            await self.close()  # a hung walk: the next call starts a fresh helper
            raise AtspiBusy(f"the accessibility tree was not read within {CALL_TIMEOUT_S:.0f} s") from None
        except BaseException:  # cancelled mid-walk: its answer would be read as the next call's
            await self.close()
            raise
        if not line:
            raise ConnectionResetError("the helper closed its output")
        try:
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError("not an object")
            return answer
        except ValueError:
            await self.close()
            raise AtspiBusy(f"the accessibility helper answered garbage: {line[:200]!r}") from None

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            await _kill(proc)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
