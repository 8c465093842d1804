"""The rest of OSWorld's VM routes: windows (wmctrl, as OSWorld's Linux server does), opening files,
running Python and bash scripts, the desktop path, the accessibility tree and GNOME Terminal's text
(AT-SPI, read by a helper under the system's Python), and clear "unsupported" answers where this desktop
has no equivalent (GNOME's wallpaper, screen recording). Request and response shapes are OSWorld's,
including its field names.

guirl adds `GET /tunnel/{port}`: a WebSocket carrying the bytes of one TCP connection to that port on the
VM's loopback, so the host reaches a port inside a desktop that has no network (Chrome's DevTools)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from guirl.vmpool.server.atspi import Atspi, AtspiBusy, AtspiError, AtspiUnavailable
from guirl.vmpool.server.http import bad_request, error_reply, request_fields, splice

OPEN_FILE_TIMEOUT_S = 120.0
"""How long `/setup/open_file` waits for the file's window (OSWorld waits up to 1800 s)."""


def _unsupported(what: str) -> web.Response:
    return error_reply(501, f"unsupported on this desktop: {what}")


def _busy(what: str) -> web.Response:
    """503: the desktop cannot give this now (an environment fault, see `guirl.vmpool.client.UNAVAILABLE`)."""
    return error_reply(503, f"unavailable now: {what}")


def _wmctrl_flags(data: dict[str, Any], action: str) -> list[str]:
    flag = "-" + ("x" if data.get("by_class") else "") + ("F" if data.get("strict") else "") + action
    return ["wmctrl", flag, str(data["window_name"])]


class ExtraRoutes:
    """Handlers bound to a `VMServer` (they use its environment and home)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.wallpaper: str | None = None  # the file last set by /setup/change_wallpaper
        self.atspi = Atspi(server.env)

    def add(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/setup/activate_window", self.activate_window)
        r.add_post("/setup/close_window", self.close_window)
        r.add_post("/window_size", self.window_size)
        r.add_post("/setup/open_file", self.open_file)
        r.add_post("/run_python", self.run_python)
        r.add_post("/run_bash_script", self.run_bash_script)
        r.add_post("/desktop_path", self.desktop_path)
        r.add_get("/terminal", self.terminal)
        r.add_get("/accessibility", self.accessibility)
        r.add_post("/setup/change_wallpaper", self.change_wallpaper)
        r.add_post("/wallpaper", self.get_wallpaper)
        r.add_post("/start_recording", self.recording)
        r.add_post("/end_recording", self.recording)
        r.add_get("/tunnel/{port}", self.tunnel)
        app.on_cleanup.append(lambda _app: self.atspi.close())

    async def _run(self, argv: list[str], timeout: float = 30.0, **kw: Any) -> subprocess.CompletedProcess:
        if any("\0" in a for a in argv):  # a NUL cannot be in an argument: the request is malformed
            raise bad_request("arguments must not contain NUL characters")
        return await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, env=self.server.env, timeout=timeout, **kw
        )

    # -- windows -------------------------------------------------------------------------------------

    async def activate_window(self, request: web.Request) -> web.Response:
        data = await request_fields(request)
        if not data.get("window_name"):
            return web.Response(text="window_name required", status=400)
        await self._run(_wmctrl_flags(data, "a"))  # like OSWorld: the exit code is not checked
        return web.Response(text="Window activated successfully")

    async def close_window(self, request: web.Request) -> web.Response:
        data = await request_fields(request)
        if "window_name" not in data:
            return web.Response(text="window_name required", status=400)
        await self._run(_wmctrl_flags(data, "c"))
        return web.Response(text="Window closed successfully.")

    async def window_size(self, request: web.Request) -> web.Response:
        name = str((await request_fields(request)).get("app_class_name") or "")
        if not name:
            return web.json_response({"error": "app_class_name is required"}, status=400)
        listing = await self._run(["wmctrl", "-lxG"])
        for line in listing.stdout.splitlines():
            parts = line.split(None, 7)  # id desktop x y w h class host title
            if len(parts) >= 7 and name.lower() in parts[6].lower():
                return web.json_response({"width": int(parts[4]), "height": int(parts[5])})
        return web.json_response({"status": "error", "message": f"no window of class {name!r}"}, status=500)

    async def open_file(self, request: web.Request) -> web.Response:
        raw = (await request_fields(request)).get("path")
        if not raw:
            return web.Response(text="Path not supplied!", status=400)
        path = os.path.expanduser(os.path.expandvars(str(raw)))
        if not os.path.exists(path) and shutil.which(path) is None:
            return web.Response(text=f"Application/file not found: {path}", status=404)
        argv = ["xdg-open", path] if os.path.exists(path) else [path]
        try:
            subprocess.Popen(
                argv,
                env=self.server.env,
                cwd=self.server.home,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            return web.Response(text=f"cannot open {path}: {exc}", status=500)
        names = {Path(path).name, Path(path).stem}
        deadline = time.monotonic() + OPEN_FILE_TIMEOUT_S
        while time.monotonic() < deadline:  # OSWorld's contract: reply once the window is there
            listing = await self._run(["wmctrl", "-l"])
            for line in listing.stdout.splitlines():
                if any(n and n in line for n in names):
                    await self._run(["wmctrl", "-i", "-a", line.split()[0]])
                    return web.Response(text="File opened and window activated successfully")
            await asyncio.sleep(0.5)  # polling the window list, as OSWorld's server does
        return web.Response(
            text=f"Failed to find window for {path} within {OPEN_FILE_TIMEOUT_S:.0f} seconds.", status=500
        )

    # -- scripts -------------------------------------------------------------------------------------

    async def run_python(self, request: web.Request) -> web.Response:
        code = (await request_fields(request)).get("code")
        if not isinstance(code, str) or not code:
            return web.json_response({"status": "error", "message": "Code not supplied!"}, status=400)
        with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="python_exec_", delete=False) as f:
            f.write(code)
        try:
            proc = await self._run(["python3", f.name], timeout=30.0, cwd=self.server.home)
        except subprocess.TimeoutExpired as exc:
            return web.json_response(
                {
                    "status": "error",
                    "message": f"Execution timeout: {exc}",
                    "error": "TimeoutExpired",
                    "need_more": False,
                    "output": None,
                },
                status=500,
            )
        finally:
            os.unlink(f.name)
        message = proc.stdout + ("\n" + proc.stderr if proc.stderr else "")
        return web.json_response(
            {
                "status": "success" if proc.returncode == 0 else "error",
                "message": message,
                "need_more": False,
                "output": proc.stdout,
                "error": proc.stderr or f"Process exited with code {proc.returncode}",
                "return_code": proc.returncode,
            }
        )

    async def run_bash_script(self, request: web.Request) -> web.Response:
        """OSWorld's intended behaviour (its own server answers 500 after every run, a known bug)."""
        data = await request_fields(request)
        script, timeout = data.get("script"), data.get("timeout", 100)
        if not isinstance(script, str) or not script:
            return web.json_response(
                {"status": "error", "output": "Script not supplied!", "error": "", "returncode": -1},
                status=400,
            )
        cwd = os.path.expanduser(str(data.get("working_dir") or self.server.home))
        if not os.path.isdir(cwd):
            return web.json_response(
                {
                    "status": "error",
                    "output": f"Working directory not found: {cwd}",
                    "error": "",
                    "returncode": -1,
                },
                status=400,
            )
        if "#!/bin/bash" not in script:
            script = "#!/bin/bash\n\n" + script
        with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
            f.write(script)
        try:
            proc = await asyncio.to_thread(
                subprocess.run,
                ["/bin/bash", f.name],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.server.env,
                cwd=cwd,
                timeout=float(timeout),
            )
        except subprocess.TimeoutExpired:
            return web.json_response(
                {
                    "status": "error",
                    "output": f"Script execution timed out after {timeout} seconds",
                    "error": "",
                    "returncode": -1,
                },
                status=500,
            )
        except (TypeError, ValueError) as exc:
            return web.json_response(
                {"status": "error", "output": f"bad request: {exc}", "error": "", "returncode": -1},
                status=400,
            )
        finally:
            os.unlink(f.name)
        return web.json_response(
            {
                "status": "success" if proc.returncode == 0 else "error",
                "output": proc.stdout,
                "error": "",
                "returncode": proc.returncode,
            }
        )

    async def desktop_path(self, _request: web.Request) -> web.Response:
        return web.json_response({"desktop_path": str(Path(self.server.home) / "Desktop")})

    # -- accessibility ---------------------------------------------------------------------------------

    async def _from_atspi(self, op: str, what: str) -> dict[str, Any] | web.Response:
        """The AT-SPI helper's answer to `op`, or the error reply: 501 (no AT-SPI here), 503 (not now), 500
        (the walk failed, as OSWorld's server answers an exception)."""
        try:
            return await self.atspi.call(op)
        except AtspiUnavailable as exc:
            return _unsupported(f"{what} needs AT-SPI: {exc}")
        except AtspiBusy as exc:
            return _busy(str(exc))
        except AtspiError as exc:
            return error_reply(500, str(exc))

    async def terminal(self, _request: web.Request) -> web.Response:
        """GNOME Terminal's focused terminal in its active window (OSWorld: `{"output", "status"}`, the
        output null when there is none)."""
        answer = await self._from_atspi("terminal", "terminal output")
        if isinstance(answer, web.Response):
            return answer
        return web.json_response({"output": answer["output"], "status": "success"})

    async def accessibility(self, _request: web.Request) -> web.Response:
        """The whole desktop's accessibility tree, OSWorld's `{"AT": xml}`."""
        answer = await self._from_atspi("tree", "the accessibility tree")
        if isinstance(answer, web.Response):
            return answer
        return web.json_response({"AT": answer["xml"]})

    # -- a port inside the VM ----------------------------------------------------------------------------

    async def tunnel(self, request: web.Request) -> web.StreamResponse:
        """One TCP connection to `127.0.0.1:{port}` in the VM, its bytes carried as binary WebSocket
        messages both ways; it ends when either side closes."""
        try:
            port = int(request.match_info["port"])
        except ValueError:
            raise bad_request("the port must be a number") from None
        if not 0 < port < 65536:
            raise bad_request(f"no such port: {port}")
        ws = web.WebSocketResponse(max_msg_size=0)
        if not ws.can_prepare(request).ok:
            raise bad_request("a tunnel is a WebSocket: the request must ask to upgrade")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            return web.json_response(
                {"status": "error", "message": f"nothing answers on port {port} in the VM: {exc}"}, status=502
            )
        try:
            await ws.prepare(request)
        except BaseException:  # the client went away before the upgrade
            writer.close()
            raise
        await splice(ws, reader, writer)
        return ws

    # -- what this desktop does not have ---------------------------------------------------------------

    async def change_wallpaper(self, request: web.Request) -> web.Response:
        raw = (await request_fields(request)).get("path")
        if not raw:
            return web.Response(text="Path not supplied!", status=400)
        path = os.path.expanduser(os.path.expandvars(str(raw)))
        if not os.path.isfile(path):
            return web.Response(text=f"File not found: {path}", status=404)
        if shutil.which("icewmbg") is None:
            return _unsupported("no wallpaper setter")
        self.wallpaper = path
        subprocess.Popen(
            ["icewmbg", "-i", path],
            env=self.server.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return web.Response(text="Wallpaper changed successfully")

    async def get_wallpaper(self, _request: web.Request) -> web.StreamResponse:
        """The wallpaper's file, as OSWorld's server sends the one GNOME's settings name: here the one
        `/setup/change_wallpaper` last set (IceWM keeps no setting to read back); 404 when none was."""
        if self.wallpaper is None or not os.path.isfile(self.wallpaper):
            return web.json_response({"error": "Wallpaper file not found"}, status=404)
        return web.FileResponse(self.wallpaper, headers={"Content-Type": "image/png"})

    async def recording(self, _request: web.Request) -> web.Response:
        return _unsupported("screen recording (no ffmpeg in this desktop)")
