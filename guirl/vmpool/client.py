"""`VMClient`: the async client of a VM server (guirl's or an OSWorld image's), used above the provider.

Every call has a timeout. Errors are typed: `VMTransientError` (the VM did not answer, or answered 5xx:
a retry may work) and `VMFatalError` (the request itself was refused: retrying cannot help). Only
idempotent calls (screenshots, reads, sizes) are retried, with jittered backoff; commands and actions
are never repeated behind the caller's back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import msgpack
import msgspec

from guirl.agent.actions import PYAUTOGUI_REFUSED, AnyAction, to_pyautogui
from guirl.runtime.retry import backoff_delays

PYAUTOGUI_TIMEOUT_S = 130.0
"""How long one action's program may take through `/execute` (OSWorld's server gives it 120 s): the longest
`wait` the parser allows plus the interpreter's start-up, so a policy's long wait never times out as a VM
fault."""


UNAVAILABLE = (501, 503)
"""Statuses with which a VM server says it cannot give what was asked — the desktop lacks it (501: no AT-SPI)
or cannot give it now (503: the accessibility tree could not be read in time): an environment fault
wherever an evaluation meets it, never what the policy left behind."""


class VMError(RuntimeError):
    """A VM server call failed; `status` and `body` are the server's answer when there was one."""

    transient = False

    def __init__(self, message: str, status: int = 0, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class VMTransientError(VMError):
    """No answer, a dropped connection, or a server error: the VM may be down or busy."""

    transient = True


class VMFatalError(VMError):
    """The server refused the request (4xx): it is wrong and retrying cannot help."""


class ActionResult(msgspec.Struct, frozen=True):
    """What `/action` answered."""

    ok: bool
    error: str
    screenshot: bytes | None


class VMClient:
    """Talks to one VM server at `address` (`http://HOST:PORT` or `unix:///PATH`)."""

    def __init__(self, address: str, *, timeout_s: float = 30.0, retries: int = 3) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.retries = retries
        if address.startswith("unix://"):
            self._connector_args: dict[str, Any] = {"path": address[len("unix://") :]}
            self._base = "http://vm"
        elif address.startswith(("http://", "https://")):
            self._connector_args = {}
            self._base = address.rstrip("/")
        else:
            raise ValueError(f"VM address must be http(s)://HOST:PORT or unix:///PATH, got {address!r}")
        self._session: aiohttp.ClientSession | None = None
        self._has_health = True  # until the server answers 404 (OSWorld's has neither route)
        self._has_action = True

    async def __aenter__(self) -> VMClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if self._connector_args:
                connector: aiohttp.BaseConnector = aiohttp.UnixConnector(**self._connector_args)
            else:
                connector = aiohttp.TCPConnector(limit=16)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(
        self, method: str, path: str, *, idempotent: bool, timeout_s: float | None = None, **kwargs: Any
    ) -> tuple[int, bytes, str]:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        delays = backoff_delays(0.2, 2.0)
        attempts = self.retries if idempotent else 1
        for attempt in range(1, attempts + 1):
            try:
                async with self._http().request(method, self._base + path, timeout=timeout, **kwargs) as resp:
                    body = await resp.read()
                    if resp.status >= 500:
                        raise VMTransientError(
                            f"{method} {path}: {resp.status} {_message(body)}", resp.status, body
                        )
                    if resp.status >= 400:
                        raise VMFatalError(
                            f"{method} {path}: {resp.status} {_message(body)}", resp.status, body
                        )
                    return resp.status, body, resp.content_type
            except VMFatalError:
                raise
            except (aiohttp.ClientError, TimeoutError, VMTransientError, OSError) as exc:
                err = (
                    exc
                    if isinstance(exc, VMTransientError)
                    else VMTransientError(f"{method} {path} to {self.address}: {type(exc).__name__}: {exc}")
                )
                if attempt == attempts:
                    raise err from None
                await asyncio.sleep(next(delays))
        raise AssertionError("unreachable")

    # -- OSWorld's protocol -------------------------------------------------------------------------

    async def screenshot(self, level: int | None = None) -> bytes:
        query = {} if level is None else {"level": str(level)}
        _, body, _ = await self._call("GET", "/screenshot", idempotent=True, params=query)
        return body

    async def platform(self) -> str:
        return (await self._call("GET", "/platform", idempotent=True))[1].decode()

    async def screen_size(self) -> tuple[int, int]:
        data = json.loads((await self._call("POST", "/screen_size", idempotent=True))[1])
        return int(data["width"]), int(data["height"])

    async def cursor_position(self) -> tuple[int, int]:
        x, y = json.loads((await self._call("GET", "/cursor_position", idempotent=True))[1])
        return int(x), int(y)

    async def execute(
        self, command: list[str] | str, *, shell: bool = False, timeout_s: float = 130.0
    ) -> dict:
        """Run a command to completion: `{status, output, error, returncode}`. Never retried."""
        body = {"command": command, "shell": shell}
        return json.loads(
            (await self._call("POST", "/execute", idempotent=False, json=body, timeout_s=timeout_s))[1]
        )

    async def launch(self, command: list[str] | str, *, shell: bool = False) -> None:
        await self._call("POST", "/setup/launch", idempotent=False, json={"command": command, "shell": shell})

    async def get_file(self, path: str) -> bytes | None:
        """The file's bytes, or None if the VM has no such file."""
        try:
            return (await self._call("POST", "/file", idempotent=True, data={"file_path": path}))[1]
        except VMFatalError as exc:
            if exc.status == 404:
                return None
            raise

    async def upload(self, path: str, data: bytes) -> None:
        form = aiohttp.FormData()
        form.add_field("file_path", path)
        form.add_field("file_data", data, filename="upload", content_type="application/octet-stream")
        await self._call("POST", "/setup/upload", idempotent=False, data=form)

    async def list_directory(self, path: str) -> dict:
        """The tree under `path`: `{"name", "type", "children": [...]}`."""
        body = (await self._call("POST", "/list_directory", idempotent=True, json={"path": path}))[1]
        return json.loads(body)["directory_tree"]

    async def accessibility_tree(self, timeout_s: float | None = None) -> str:
        """The desktop's accessibility tree, OSWorld's XML (`GET /accessibility`). A desktop without
        AT-SPI answers 501, one whose tree cannot be read now 503 (see `UNAVAILABLE`): VMTransientErrors,
        as any status from 500 up."""
        body = (await self._call("GET", "/accessibility", idempotent=False, timeout_s=timeout_s))[1]
        return json.loads(body)["AT"]

    # -- guirl's additions -----------------------------------------------------------------------------

    async def health(self, timeout_s: float = 5.0) -> bool:
        """True when the server and its display answer within `timeout_s`.

        guirl's server answers `/health`; OSWorld's has no such route (404), so its `/screen_size`, which
        asks the display, stands in (remembered for this client's later probes)."""
        try:
            if self._has_health:
                try:
                    await self._call("GET", "/health", idempotent=False, timeout_s=timeout_s)
                    return True
                except VMFatalError as exc:
                    if exc.status != 404:
                        return False
                    self._has_health = False
            await self._call("POST", "/screen_size", idempotent=False, timeout_s=timeout_s)
            return True
        except VMError:
            return False

    async def perform(self, action: AnyAction, *, action_space: str, screenshot: bool = True) -> ActionResult:
        """Execute a typed action in `action_space`: "computer_use" sends it to guirl's `/action`;
        "pyautogui" runs the equivalent program (`to_pyautogui`) through OSWorld's `/execute`, as does
        "computer_use" on a server without `/action` (an OSWorld image). Refusals come back as `ok=False`
        with the reason either way. Never retried."""
        if action_space == "computer_use" and self._has_action:
            try:
                return await self.act(action, screenshot=screenshot)
            except VMFatalError as exc:
                if exc.status != 404:
                    raise
                self._has_action = False  # OSWorld's server: typed actions go through /execute from now on
        elif action_space not in ("computer_use", "pyautogui"):
            raise ValueError(f"unknown action space {action_space!r}")
        out = await self.execute(["python", "-c", to_pyautogui(action)], timeout_s=PYAUTOGUI_TIMEOUT_S)
        code = out.get("returncode", 0)
        reason = _last_line(str(out.get("error") or out.get("output") or "failed"))
        if code not in (0, PYAUTOGUI_REFUSED):
            # not a refusal of the action: the VM's (no display, no pyautogui), as /action answers 500
            raise VMTransientError(
                f"the action's program failed on the VM (exit status {code}): {reason}", 500
            )
        ok = code == 0
        shot = await self.screenshot() if screenshot else None
        return ActionResult(ok=ok, error="" if ok else reason, screenshot=shot)

    async def act(self, action: AnyAction, *, screenshot: bool = True) -> ActionResult:
        """Execute a typed action; the next screenshot comes in the same reply. Never retried. A refused
        action (off-screen, unknown key) comes back as `ok=False` with the reason."""
        params = {} if screenshot else {"screenshot": "0"}
        try:
            _, body, _ = await self._call(
                "POST",
                "/action",
                idempotent=False,
                params=params,
                data=msgspec.json.encode(action),
                headers={"Content-Type": "application/json"},
            )
        except VMFatalError as exc:  # refused: the server says why in the usual reply shape
            if exc.status == 404:  # no /action here at all (an OSWorld image): see perform()
                raise
            body = exc.body
        try:
            return msgspec.convert(msgpack.unpackb(body), ActionResult)
        except (ValueError, msgspec.ValidationError, msgpack.UnpackException) as exc:
            raise VMTransientError(f"/action answered something else than a result: {exc}") from None


def _last_line(text: str) -> str:
    """The reason a program gave last (its traceback's or sys.exit's line), not the warnings before it."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "failed"


def _message(body: bytes) -> str:
    """The reason in an error body: JSON `{message}` (OSWorld's routes) or MessagePack `{error}` (/action)."""
    for load in (json.loads, msgpack.unpackb):
        try:
            data = load(body)
        except Exception:  # noqa: BLE001  (not this encoding)
            continue
        if isinstance(data, dict):
            return str(data.get("message") or data.get("error") or data)
    return body[:200].decode(errors="replace")
