"""The applications of a local desktop as OSWorld's tasks use them: Chrome started by OSWorld's own launch
steps (`google-chrome --remote-debugging-port=1337`, `socat` exposing it on 9222) and driven from the host
over DevTools through the VM server's tunnel; GNOME Terminal's text through AT-SPI (`/terminal`); a
desktop without a D-Bus session bus says why it has no tree."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from guirl.vmpool.server.atspi import Atspi, AtspiBusy, AtspiUnavailable
from guirl.vmpool.tasks.getters import get
from guirl.vmpool.tasks.model import parse_task
from guirl.vmpool.tasks.setup import TaskContext, run_setup
from guirl.vmpool.tunnel import devtools_endpoint, forward_port
from tests.helpers import run
from tests.integration.test_local_vm import local_vm

PAGE = "<html><head><title>Local page</title></head><body><h1>hello</h1></body></html>"
OSWORLD_CHROME_STEPS = [  # as OSWorld's chrome tasks start the browser (examples/chrome/*.json)
    {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
    {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
]


def _task(config: list[dict]) -> object:
    return parse_task(
        json.dumps({"id": "t", "instruction": "i", "config": config, "evaluator": {"func": "infeasible"}}),
        "t",
    )


def test_chrome_on_a_local_desktop_is_driven_over_devtools_through_the_tunnel(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (provider, vm, client):
            home = provider.vms[vm].dir / "home"
            (home / "page.html").write_text(PAGE)
            async with devtools_endpoint(client, 9222) as devtools:
                assert devtools and devtools.startswith("http://127.0.0.1:")
                ctx = TaskContext(
                    task_id="t",
                    cache_dir=tmp_path / "cache",
                    download_cache=tmp_path / "dl",
                    devtools_url=devtools,
                )
                ctx.cache_dir.mkdir()
                steps = [
                    *OSWORLD_CHROME_STEPS,
                    {
                        "type": "chrome_open_tabs",
                        "parameters": {"urls_to_open": ["file:///home/user/page.html"]},
                    },
                ]
                await run_setup(client, _task(steps).config, ctx)
                tabs = await get({"type": "open_tabs_info"}, client, ctx)
                assert {"title": "Local page", "url": "file:///home/user/page.html"} in tabs
                # the active tab: its URL read from the address bar in the accessibility tree (Chromium shows
                # a file URL as its path: the task's goto_prefix is "file://"), its page loaded over DevTools
                tree = await client.accessibility_tree()
                assert '<application name="Chromium"' in tree
                active = await get({"type": "active_tab_info", "goto_prefix": "file://"}, client, ctx)
                assert active["title"] == "Local page" and active["url"] == "file:///home/user/page.html"
                assert "<h1>hello</h1>" in active["content"]
            # a port nothing listens on in the VM: the connection is closed at once, nothing hangs
            async with forward_port(client, 7) as url, aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.ClientError):
                    await http.get(url + "/", timeout=aiohttp.ClientTimeout(total=30))
            for bad, status in (("x", 400), ("70000", 400), ("9222", 400)):  # the last: no WebSocket upgrade
                async with client._http().get(f"{client._base}/tunnel/{bad}") as resp:
                    assert resp.status == status and "message" in json.loads(await resp.read())

    run(main(), timeout=240)


def test_gnome_terminals_text_is_read_through_atspi(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (_provider, _vm, client):
            ctx = TaskContext(task_id="t", cache_dir=tmp_path / "c", download_cache=tmp_path / "d")
            assert await get({"type": "vm_terminal_output"}, client, ctx) is None  # no terminal open
            # the helper that reads AT-SPI dies between two requests: the next one starts another
            killed = await client.execute(["pkill", "-f", "atspi_walk.py"])
            assert killed["returncode"] == 0, killed
            assert (await client.accessibility_tree()).startswith("<desktop-frame ")
            await client.launch(["gnome-terminal"])
            await client.execute(
                ["xdotool", "search", "--sync", "--onlyvisible", "--class", "gnome-terminal"], timeout_s=60
            )
            await client.execute(["xdotool", "type", "--delay", "20", "echo $((6 * 7))-done\n"])
            for _ in range(200):  # the shell answers in its own time; each read is a full AT-SPI walk
                output = await get({"type": "vm_terminal_output"}, client, ctx)
                if (
                    output and "42-done" in output and output.endswith("$")
                ):  # the answer, then the next prompt
                    break
            assert output and output.splitlines()[-2:] == ["42-done", output.splitlines()[-1]]
            assert "echo $((6 * 7))-done" in output

    run(main(), timeout=180)


def test_a_desktop_without_a_session_bus_says_why_it_has_no_tree():
    async def main():
        atspi = Atspi(env={"PATH": "/usr/bin:/bin"})
        with pytest.raises(AtspiUnavailable, match="no D-Bus session bus.*at-spi2-core python3-pyatspi"):
            await atspi.call("tree")
        assert atspi.proc is None and "no D-Bus session bus" in (atspi.unavailable or "")

    asyncio.run(main())


def test_a_helper_that_cannot_start_is_an_environment_fault(tmp_path, monkeypatch):
    """No fork now, or a python that cannot be run: 503 (AtspiBusy, a fault retried elsewhere), never a
    tree of nothing a task would be scored 0 on; the next call tries again."""
    from guirl.vmpool.server import atspi as atspi_module

    not_runnable = tmp_path / "python3"
    not_runnable.write_text("not a program")  # no exec bit: PermissionError from the fork's exec
    monkeypatch.setattr(atspi_module, "system_python", lambda: str(not_runnable))

    async def main():
        atspi = Atspi(env={"PATH": "/usr/bin:/bin", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent"})
        for _ in range(2):
            with pytest.raises(AtspiBusy, match="did not start"):
                await atspi.call("tree")
        assert atspi.unavailable is None

    asyncio.run(main())
