"""The process behind the `replay` provider: many replayed desktops, each a VM server on its own socket.

    python -m guirl.vmpool.replay_host --recording RUN_DIR --dir DIR --width W --height H [--step-latency S]

Each desktop listens on `DIR/d/<id>.sock` and answers guirl's VM protocol from the recorded screens it is
given (the provider reads the recording, chooses an episode and names its screens, paths in RUN_DIR; see
`replay.py`): `/screenshot` is the current recorded screen; `/action` takes a typed action
(refused as the real server refuses: bad JSON 400, a point off the screen 422); the first screen asked
for after actions (in `/action`'s reply or by `/screenshot`) is the next recorded one, given after
`--step-latency` seconds (give or take `--step-jitter` of it). `/execute` and the routes that would run
programs or read files answer 501: a replayed desktop has neither. `DIR/admin.sock` is the provider's:
create, bind, reset, kill and delete desktops, and `GET /stats`. The host writes `{"ready": true, ...}` on
stdout when it listens, and ends on SIGTERM or when its stdin closes (the provider's process is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from guirl.agent.actions import AnyAction
from guirl.vmpool.replay import POINT_FIELDS
from guirl.vmpool.server.http import action_reply, bad_request, error_reply

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_BODY = 1 << 20
CACHE_BYTES = 512 << 20
"""Recorded screens kept in memory at most (the most recently shown)."""


class Screens:
    """Recorded screens shared by every desktop that shows them (a file's links read once), the most recently
    shown kept in memory up to `max_bytes` (a recording may be far larger than what is shown at once)."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: collections.OrderedDict[tuple[int, int], bytes] = collections.OrderedDict()
        self.cached_bytes = 0
        self.reads = 0

    def get(self, path: Path) -> bytes:
        st = path.stat()
        key = (st.st_dev, st.st_ino)
        data = self._files.get(key)
        if data is not None:
            self._files.move_to_end(key)
            return data
        data = self._files[key] = path.read_bytes()
        self.cached_bytes += len(data)
        self.reads += 1
        while self.cached_bytes > self.max_bytes and len(self._files) > 1:
            _, old = self._files.popitem(last=False)
            self.cached_bytes -= len(old)
        return data


class Desktop:
    """One replayed desktop: the recording it plays and where it is in it."""

    def __init__(self, host: ReplayHost, vm_id: str, tag: str, screens: list[Path]) -> None:
        self.host, self.vm_id, self.tag = host, vm_id, tag
        self.screens = screens  # the recorded episode's, in order (its final screen last)
        self.position = 0  # index into screens
        self.pending = False  # actions were taken since the screen was last shown
        self.generation = 0  # bumped at every restart: a step still sleeping then does not move the new one
        self.runner: web.AppRunner | None = None

    def restart(self, screens: list[Path] | None = None) -> None:
        self.screens = screens or self.screens
        self.position, self.pending = 0, False
        self.generation += 1

    async def screen(self) -> bytes:
        """The screen now; the next recorded one (after the step latency) once actions were taken."""
        if self.pending:
            self.pending = False
            generation = self.generation
            if self.host.step_latency_s > 0:
                jitter = self.host.step_jitter * self.host.rng.uniform(-1, 1)
                await asyncio.sleep(self.host.step_latency_s * (1 + jitter))
            if generation == self.generation:  # not restarted (reset, bound anew) meanwhile
                self.position = min(self.position + 1, len(self.screens) - 1)
                self.host.steps += 1
        return self.host.screens.get(self.screens[self.position])

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        r = app.router
        r.add_get("/screenshot", self.screenshot)
        r.add_get("/platform", self.platform)
        r.add_post("/screen_size", self.screen_size)
        r.add_get("/cursor_position", self.cursor_position)
        r.add_get("/health", self.health)
        r.add_post("/action", self.action)
        r.add_route("*", "/{tail:.*}", self.unavailable)
        return app

    async def screenshot(self, _request: web.Request) -> web.Response:
        return web.Response(body=await self.screen(), content_type="image/png")

    async def platform(self, _request: web.Request) -> web.Response:
        return web.Response(text="Linux")

    async def screen_size(self, _request: web.Request) -> web.Response:
        w, h = self.host.size
        return web.json_response({"width": w, "height": h})

    async def cursor_position(self, _request: web.Request) -> web.Response:
        return web.json_response([0, 0])

    async def health(self, _request: web.Request) -> web.Response:
        w, h = self.host.size
        return web.json_response({"status": "ok", "width": w, "height": h})

    async def action(self, request: web.Request) -> web.Response:
        try:
            act = msgspec.json.decode(await request.read(), type=AnyAction)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return action_reply(False, f"bad action: {exc}", None, status=400)
        # an action taken, even one refused: the recorded run took the next screen after it too
        self.pending = True
        self.host.actions += 1
        w, h = self.host.size
        fields = msgspec.to_builtins(act)
        for name in POINT_FIELDS:  # the real server refuses a point off its screen, and so does this one
            value = fields.get(name)
            if isinstance(value, int) and value >= (w if name in ("x", "to_x") else h):
                return action_reply(False, f"({name}={value}) is off the {w}x{h} screen", None, status=422)
        want_shot = request.query.get("screenshot", "1") != "0"
        return action_reply(True, "", await self.screen() if want_shot else None)

    async def unavailable(self, request: web.Request) -> web.Response:
        return error_reply(
            501, f"{request.method} {request.path}: a replayed desktop runs no programs and has no files"
        )


class ReplayHost:
    """The desktops of one provider, and the admin routes that manage them."""

    def __init__(
        self,
        recording_dir: str,
        sock_dir: Path,
        step_latency_s: float,
        size: tuple[int, int],
        step_jitter: float = 0.0,
    ) -> None:
        self.root = Path(recording_dir).resolve()  # the provider names screens under it, nothing else
        self.size = size
        self.sock_dir = sock_dir
        self.step_latency_s = step_latency_s
        self.step_jitter = step_jitter
        self.rng = random.Random(str(sock_dir))
        self.screens = Screens()
        self.desktops: dict[str, Desktop] = {}
        self.steps = 0
        self.actions = 0

    def admin_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        r = app.router
        r.add_post("/desktops", self.create)
        r.add_get("/desktops", self.list)
        r.add_post("/desktops/{id}/bind", self.bind)
        r.add_post("/desktops/{id}/reset", self.reset)
        r.add_post("/desktops/{id}/kill", self.kill)
        r.add_delete("/desktops/{id}", self.delete)
        r.add_get("/stats", self.stats)
        return app

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            data = await request.json() if request.can_read_body else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(f"bad JSON: {exc}") from None
        if not isinstance(data, dict):
            raise bad_request("expected a JSON object")
        return data

    def _screens(self, data: dict[str, Any]) -> list[Path]:
        """The recorded screens a desktop is to show: paths under the recording, relative to it (the
        provider read the recording and checked them; this host only serves them)."""
        names = data.get("screens")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise bad_request("screens must be a non-empty list of paths in the recording")
        paths = [(self.root / n).resolve() for n in names]
        outside = next(
            (n for n, p in zip(names, paths, strict=True) if not p.is_relative_to(self.root)), None
        )
        if outside is not None:
            raise bad_request(f"screen {outside!r} is not in the recording")
        return paths

    def _desktop(self, request: web.Request) -> Desktop:
        vm_id = request.match_info["id"]
        if not _ID.fullmatch(vm_id):
            raise bad_request("a desktop id is 1-64 letters, digits, - or _")
        desktop = self.desktops.get(vm_id)
        if desktop is None:
            raise web.HTTPNotFound(
                text=json.dumps({"status": "error", "message": f"no desktop {vm_id!r}"}),
                content_type="application/json",
            )
        return desktop

    async def create(self, request: web.Request) -> web.Response:
        data = await self._body(request)
        vm_id, tag = data.get("id"), data.get("tag", "")
        if not isinstance(vm_id, str) or not _ID.fullmatch(vm_id) or not isinstance(tag, str):
            return error_reply(400, "id must be 1-64 letters, digits, '-' or '_', and tag a string")
        if vm_id in self.desktops:
            return error_reply(409, f"desktop {vm_id} exists")
        desktop = Desktop(self, vm_id, tag, self._screens(data))
        runner = web.AppRunner(desktop.app(), handle_signals=False, access_log=None)
        await runner.setup()
        try:
            await web.UnixSite(runner, str(self.sock_dir / "d" / f"{vm_id}.sock")).start()
        except OSError as exc:
            await runner.cleanup()
            return error_reply(500, f"cannot listen for desktop {vm_id}: {exc}")
        desktop.runner = runner
        self.desktops[vm_id] = desktop
        return web.json_response({"id": vm_id})

    async def list(self, request: web.Request) -> web.Response:
        tag = request.query.get("tag")
        return web.json_response({"ids": [d.vm_id for d in self.desktops.values() if tag in (None, d.tag)]})

    async def bind(self, request: web.Request) -> web.Response:
        desktop = self._desktop(request)
        desktop.restart(self._screens(await self._body(request)))
        return web.json_response({})

    async def reset(self, request: web.Request) -> web.Response:
        self._desktop(request).restart()
        return web.json_response({})

    async def kill(self, request: web.Request) -> web.Response:
        desktop = self._desktop(request)
        if desktop.runner is not None:
            await desktop.runner.cleanup()  # its socket closes: it stops answering, as a dead VM
            desktop.runner = None
        return web.json_response({})

    async def delete(self, request: web.Request) -> web.Response:
        desktop = self._desktop(request)
        del self.desktops[desktop.vm_id]
        if desktop.runner is not None:
            await desktop.runner.cleanup()
        with contextlib.suppress(OSError):
            (self.sock_dir / "d" / f"{desktop.vm_id}.sock").unlink()
        return web.json_response({})

    async def stats(self, _request: web.Request) -> web.Response:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return web.json_response(
            {
                "desktops": len(self.desktops),
                "steps": self.steps,
                "actions": self.actions,
                "screen_bytes": self.screens.cached_bytes,
                "screen_reads": self.screens.reads,
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                "max_rss_kb": usage.ru_maxrss,
            }
        )

    async def close(self) -> None:
        for desktop in list(self.desktops.values()):
            if desktop.runner is not None:
                await desktop.runner.cleanup()
        self.desktops.clear()


async def _serve(args: argparse.Namespace) -> int:
    sock_dir = Path(args.dir)
    (sock_dir / "d").mkdir(mode=0o700, exist_ok=True)  # the desktops' sockets, apart from the admin's
    host = ReplayHost(
        args.recording, sock_dir, args.step_latency, (args.width, args.height), args.step_jitter
    )
    admin = web.AppRunner(host.admin_app(), handle_signals=False, access_log=None)
    await admin.setup()
    await web.UnixSite(admin, str(sock_dir / "admin.sock")).start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    # the provider's process holds our stdin: its end (the process died) is ours
    loop.add_reader(sys.stdin.fileno(), lambda: os.read(sys.stdin.fileno(), 4096) or stop.set())
    ready = {"ready": True, "pid": os.getpid(), "started": time.time()}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    await stop.wait()
    await host.close()
    await admin.cleanup()
    # what this host made, and the directory if that leaves it empty (the provider's process may be gone:
    # nobody else will); never anything else a hand-given --dir holds
    for sock in (sock_dir / "d").glob("*.sock"):
        sock.unlink(missing_ok=True)
    for made in (sock_dir / "d", sock_dir):
        with contextlib.suppress(OSError):
            made.rmdir()
    (sock_dir / "admin.sock").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        sock_dir.rmdir()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recording", required=True, help="the recorded run directory")
    ap.add_argument("--dir", required=True, help="where the sockets go")
    ap.add_argument("--step-latency", type=float, default=0.0, help="seconds each step takes")
    ap.add_argument("--step-jitter", type=float, default=0.0, help="give or take this fraction of it")
    ap.add_argument("--width", type=int, required=True, help="the recorded screens' width")
    ap.add_argument("--height", type=int, required=True, help="the recorded screens' height")
    args = ap.parse_args(argv)
    import uvloop

    return uvloop.run(_serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
