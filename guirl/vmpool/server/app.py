"""The VM server's HTTP application (aiohttp).

OSWorld's routes keep OSWorld's request and response shapes, so a client written for an OSWorld image
drives a guirl desktop unchanged. guirl adds `POST /action`: a typed action (JSON, see
`guirl.agent.actions`) executed in-process, answered with MessagePack `{ok, error, screenshot}` —
the next screenshot comes in the same reply, as raw bytes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from guirl.agent.actions import AnyAction
from guirl.vmpool.server.desktop import Desktop
from guirl.vmpool.server.extra import ExtraRoutes
from guirl.vmpool.server.http import action_reply, bad_request, error_reply, request_fields

log = logging.getLogger(__name__)

EXECUTE_TIMEOUT_S = 120.0
"""How long `/execute` lets a command run (OSWorld's value)."""
MAX_REQUEST_BYTES = 256 * 2**20
"""Largest request body (an upload) the server accepts."""
MAX_LISTED = 50_000
"""Entries `/list_directory` returns at most (it answers 400 beyond)."""


@web.middleware
async def _clear_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure gets a JSON answer: a value the request got wrong (a NUL in a path, a wrong type) is a
    400; anything else a 500 that says what broke. Never an unexplained error page."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        return error_reply(400, f"bad request: {type(exc).__name__}: {exc}")
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return error_reply(500, f"internal error: {type(exc).__name__}: {exc}")


def _command(data: dict[str, Any]) -> tuple[list[str] | str, bool]:
    """OSWorld's rules: a string is split unless `shell`; list items starting with `~/` are expanded."""
    command, shell = data.get("command"), bool(data.get("shell", False))
    if isinstance(command, str) and command:
        return (command if shell else shlex.split(command)), shell
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        command = [os.path.expanduser(c) if c.startswith("~/") else c for c in command]
        if shell and len(command) > 1:
            # OSWorld's server would run only command[0] (the rest become $0...): refused rather than
            # silently cut short or silently run differently (docs/osworld-compat.md §1.1)
            raise bad_request("'shell': true takes a string, or a list of one string")
        return (command[0] if shell else command), shell
    raise bad_request("'command' must be a string or a non-empty list of strings")


class VMServer:
    """Routes and their state: the desktop, the user's environment for commands, one action thread."""

    def __init__(self, desktop: Desktop, *, env: dict[str, str] | None = None, home: str = "") -> None:
        self.desktop = desktop
        self.env = dict(env or os.environ)
        self.home = home or self.env.get("HOME", "/")
        # actions and screenshots run on one thread, in order, off the event loop
        self.gui_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gui")
        self.launched: list[subprocess.Popen] = []

    async def in_gui(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.gui_thread, fn, *args)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[_clear_errors])
        r = app.router
        r.add_get("/screenshot", self.screenshot)
        r.add_get("/platform", self.platform)
        r.add_post("/screen_size", self.screen_size)
        r.add_get("/cursor_position", self.cursor_position)
        r.add_post("/execute", self.execute)
        r.add_post("/setup/execute", self.execute)
        r.add_post("/setup/launch", self.launch)
        r.add_post("/file", self.file)
        r.add_post("/setup/upload", self.upload)
        r.add_post("/list_directory", self.list_directory)
        r.add_post("/action", self.action)
        r.add_get("/health", self.health)
        ExtraRoutes(self).add(app)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, _app: web.Application) -> None:
        self.gui_thread.shutdown(wait=False, cancel_futures=True)

    # -- observation ---------------------------------------------------------------------------------

    async def screenshot(self, request: web.Request) -> web.Response:
        level = request.query.get("level")
        try:
            png = await self.in_gui(self.desktop.screenshot, int(level) if level is not None else None)
        except ValueError as exc:
            return error_reply(400, f"bad level: {exc}")
        return web.Response(body=png, content_type="image/png")

    async def platform(self, _request: web.Request) -> web.Response:
        return web.Response(text="Linux")

    async def screen_size(self, _request: web.Request) -> web.Response:
        w, h = await self.in_gui(self.desktop.screen_size)
        return web.json_response({"width": w, "height": h})

    async def cursor_position(self, _request: web.Request) -> web.Response:
        return web.json_response(list(await self.in_gui(self.desktop.cursor_position)))

    async def health(self, _request: web.Request) -> web.Response:
        """guirl's liveness check: the X server must answer, not just this process."""
        try:
            w, h = await asyncio.wait_for(self.in_gui(self.desktop.screen_size), 5.0)
        except Exception as exc:  # noqa: BLE001  (any failure to reach the display is ill health)
            return error_reply(503, f"display unreachable: {exc!r}")
        return web.json_response({"status": "ok", "width": w, "height": h})

    # -- commands ------------------------------------------------------------------------------------

    async def execute(self, request: web.Request) -> web.Response:
        data = await request_fields(request)
        command, shell = _command(data)
        try:
            proc = await asyncio.to_thread(
                subprocess.run,
                command,
                shell=shell,
                capture_output=True,
                text=True,
                env=self.env,
                cwd=self.home,
                timeout=EXECUTE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return error_reply(500, f"command timed out after {EXECUTE_TIMEOUT_S:.0f} s")
        except OSError as exc:
            return error_reply(500, f"cannot run the command: {exc}")
        except ValueError as exc:  # e.g. an embedded NUL
            return error_reply(400, f"bad command: {exc}")
        return web.json_response(
            {"status": "success", "output": proc.stdout, "error": proc.stderr, "returncode": proc.returncode}
        )

    async def launch(self, request: web.Request) -> web.Response:
        data = await request_fields(request)
        command, shell = _command(data)
        try:
            proc = subprocess.Popen(
                command,
                shell=shell,
                env=self.env,
                cwd=self.home,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            return error_reply(500, f"cannot launch: {exc}")
        except ValueError as exc:
            return error_reply(400, f"bad command: {exc}")
        self.launched.append(proc)
        return web.Response(text=f"{command} launched successfully")

    # -- files ---------------------------------------------------------------------------------------

    def _path(self, raw: Any) -> Path:
        if not isinstance(raw, str) or not raw:
            raise bad_request("a path is required")
        return Path(os.path.expanduser(raw.replace("~", self.home, 1) if raw.startswith("~") else raw))

    async def file(self, request: web.Request) -> web.StreamResponse:
        raw = (await request_fields(request)).get("file_path")
        if not raw:
            return web.json_response({"error": "file_path is required"}, status=400)
        path = self._path(raw)
        if not path.is_file():
            return web.json_response({"error": "File not found"}, status=404)
        return web.FileResponse(path, headers={"Content-Disposition": f'attachment; filename="{path.name}"'})

    async def upload(self, request: web.Request) -> web.Response:
        path, data = None, None
        if not request.content_type.startswith("multipart/"):
            return web.json_response(
                {"error": "file_path and file_data are required (multipart)"}, status=400
            )
        try:
            async for part in await request.multipart():
                if part.name == "file_path":
                    path = self._path(await part.text())
                elif part.name == "file_data":
                    data = await part.read()
        except (ValueError, AssertionError, UnicodeDecodeError) as exc:  # a malformed multipart body
            return web.json_response({"error": f"bad multipart body: {exc}"}, status=400)
        if path is None or data is None:
            return web.json_response({"error": "file_path and file_data are required"}, status=400)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as exc:
            return web.json_response({"error": f"Failed to upload file: {exc}"}, status=500)
        return web.Response(text=f"File Uploaded: {len(data)} bytes")

    async def list_directory(self, request: web.Request) -> web.Response:
        raw = (await request_fields(request)).get("path")
        if not raw:
            return web.json_response({"error": "Missing 'path' parameter"}, status=400)
        if not isinstance(raw, str):
            raise bad_request("a path is required")
        path = Path(raw)  # as OSWorld's server takes it: no `~` expansion (relative to the server's cwd)
        if not path.is_dir():
            return web.json_response({"error": "The provided path is not a directory"}, status=400)

        budget = [MAX_LISTED]

        def tree(p: Path, depth: int = 0) -> dict[str, Any]:
            budget[0] -= 1
            if budget[0] < 0:
                raise OverflowError
            # symlinks are listed, never followed: `ln -s . loop` must not make the tree infinite
            is_dir = p.is_dir() and not p.is_symlink()
            node: dict[str, Any] = {"name": p.name, "type": "directory" if is_dir else "file"}
            if is_dir and depth < 16:
                try:
                    node["children"] = [tree(c, depth + 1) for c in sorted(p.iterdir())]
                except OSError:
                    node["children"] = []
            return node

        try:
            return web.json_response({"directory_tree": await asyncio.to_thread(tree, path)})
        except OverflowError:
            return web.json_response({"error": f"more than {MAX_LISTED} entries under {path}"}, status=400)

    # -- typed actions -------------------------------------------------------------------------------

    async def action(self, request: web.Request) -> web.Response:
        """Execute one typed action and answer with the next screenshot: `{ok, error, screenshot}`."""
        try:
            act = msgspec.json.decode(await request.read(), type=AnyAction)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return action_reply(False, f"bad action: {exc}", None, status=400)
        want_shot = request.query.get("screenshot", "1") != "0"
        try:  # one trip to the GUI thread for both: the step's latency is what an agent waits for
            png = await self.in_gui(self.desktop.perform_and_capture, act, want_shot)
        except (ValueError, TypeError) as exc:  # not doable here (off-screen, unknown key): nothing changed
            return action_reply(False, str(exc), None, status=422)
        return action_reply(True, "", png)
