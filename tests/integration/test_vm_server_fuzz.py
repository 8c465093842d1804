"""Hostile requests to every route of a running VM server: each gets a clear answer (never an unhandled
exception's page), and the server keeps serving."""

from __future__ import annotations

import json
import random

from guirl.vmpool.client import VMClient
from tests.helpers import run
from tests.integration.test_local_vm import local_vm

ROUTES = [
    ("POST", "/execute"),
    ("POST", "/setup/execute"),
    ("POST", "/setup/launch"),
    ("POST", "/setup/open_file"),
    ("POST", "/setup/upload"),
    ("POST", "/setup/activate_window"),
    ("POST", "/setup/close_window"),
    ("POST", "/file"),
    ("POST", "/list_directory"),
    ("POST", "/screen_size"),
    ("POST", "/window_size"),
    ("POST", "/run_python"),
    ("POST", "/run_bash_script"),
    ("POST", "/desktop_path"),
    ("POST", "/action"),
    ("POST", "/setup/change_wallpaper"),
    ("GET", "/screenshot"),
    ("GET", "/tunnel/9222"),
    ("GET", "/tunnel/x"),
    ("GET", "/cursor_position"),
    ("GET", "/terminal"),
    ("GET", "/accessibility"),
    ("GET", "/platform"),
    ("GET", "/health"),
]
# values of the wrong type for whatever field a route reads
ODD = [
    None,
    0,
    -1,
    2**70,
    1.5,
    True,
    "",
    "x" * 5000,
    "\x00\xff",
    [],
    [None],
    {},
    {"a": {"b": []}},
    "../../etc",
]
FIELDS = [
    "command",
    "shell",
    "path",
    "file_path",
    "window_name",
    "strict",
    "by_class",
    "app_class_name",
    "code",
    "script",
    "timeout",
    "working_dir",
    "type",
    "x",
    "y",
    "text",
    "keys",
    "amount",
    "seconds",
]
SAFE_COMMANDS = ["true", ["true"], ["echo", "x"], "echo $HOME"]  # no fuzz case may start real programs


def _case(rng: random.Random) -> tuple[str, str, dict]:
    method, path = rng.choice(ROUTES)
    kind = rng.randrange(4)
    if kind == 0:
        kw = {"data": rng.randbytes(rng.randrange(0, 300)), "headers": {"Content-Type": "application/json"}}
    elif kind == 1:
        kw = {"json": rng.choice([[], 1, "s", None, [1, 2], {"k": "v"}])}
    elif kind == 2:
        body = {f: rng.choice(ODD) for f in rng.sample(FIELDS, rng.randrange(1, 5))}
        if path in (
            "/setup/launch",
            "/execute",
            "/setup/execute",
            "/run_python",
            "/run_bash_script",
            "/setup/open_file",
        ):
            (
                body.pop("command", None),
                body.pop("code", None),
                body.pop("script", None),
                body.pop("path", None),
            )
            if rng.random() < 0.3:
                body["command"] = rng.choice(SAFE_COMMANDS)
        kw = {"json": body}
    else:
        form = {f: str(rng.choice(ODD)) for f in rng.sample(FIELDS, 2)}
        if path == "/setup/open_file":  # an existing path would open it and wait for its window
            form.pop("path", None)
        kw = {"data": form}
    return method, path, kw


def test_hostile_requests_get_clear_answers(tmp_path):
    async def main():
        rng = random.Random(1234)
        async with local_vm(tmp_path) as (_p, _v, client):
            statuses: dict[int, int] = {}
            for _ in range(1500):
                method, path, kw = _case(rng)
                async with client._http().request(method, client._base + path, **kw) as resp:
                    body = await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    assert resp.status < 500 or resp.status == 501 or _is_json_error(body), (
                        method,
                        path,
                        kw,
                        resp.status,
                        body[:300],
                    )
            assert await client.health(), statuses  # still serving
            assert (await client.execute(["echo", "alive"]))["output"] == "alive\n"

    run(main(), timeout=300)


def _is_json_error(body: bytes) -> bool:
    """A deliberate 5xx answers in JSON (OSWorld's routes do); an unhandled exception does not."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and ("message" in data or "error" in data)


def test_client_rejects_a_bad_address():
    import pytest

    for bad in ("ftp://x", "vm:1", ""):
        with pytest.raises(ValueError):
            VMClient(bad)
