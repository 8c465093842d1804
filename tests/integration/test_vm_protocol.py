"""OSWorld's VM protocol on a local VM: the request and response shapes an OSWorld client relies on."""

from __future__ import annotations

import json

import aiohttp

from guirl.vmpool.client import VMClient
from tests.helpers import run
from tests.integration.test_local_vm import local_vm


async def _raw(client: VMClient, method: str, path: str, **kw) -> tuple[int, str, bytes]:
    """The server's answer as is (status, content type, body), bypassing VMClient's error handling."""
    async with client._http().request(method, client._base + path, **kw) as resp:
        return resp.status, resp.content_type, await resp.read()


def test_osworld_route_shapes(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (_provider, _vm, client):
            status, ctype, body = await _raw(client, "GET", "/screenshot")
            assert status == 200 and ctype == "image/png" and body[:4] == b"\x89PNG"
            assert (await _raw(client, "GET", "/platform"))[2] == b"Linux"
            status, _, body = await _raw(client, "POST", "/screen_size")
            assert status == 200 and json.loads(body) == {"width": 800, "height": 600}
            x, y = json.loads((await _raw(client, "GET", "/cursor_position"))[2])
            assert isinstance(x, int) and isinstance(y, int)
            # /execute: a failing command is still a 200 "success" with its return code (OSWorld's way)
            out = await client.execute(["bash", "-c", "echo out; echo err >&2; exit 3"])
            assert out == {"status": "success", "output": "out\n", "error": "err\n", "returncode": 3}
            home = await client.execute(["ls", "-d", "~/Desktop"])  # list items starting ~/ are expanded
            assert home["output"].strip() == "/home/user/Desktop"
            status, _, body = await _raw(client, "POST", "/execute", json={"command": ["no-such-program"]})
            assert status == 500 and json.loads(body)["status"] == "error"
            # files: upload (multipart), read back (form field), list (JSON, directory_tree)
            form = aiohttp.FormData()
            form.add_field("file_path", "~/Desktop/a.txt")
            form.add_field("file_data", b"hello", filename="a.txt")
            status, _, body = await _raw(client, "POST", "/setup/upload", data=form)
            assert status == 200 and body == b"File Uploaded: 5 bytes"
            status, _, body = await _raw(client, "POST", "/file", data={"file_path": "~/Desktop/a.txt"})
            assert status == 200 and body == b"hello"
            status, _, body = await _raw(client, "POST", "/file", data={"file_path": "/nope"})
            assert status == 404 and json.loads(body) == {"error": "File not found"}
            tree = await client.list_directory("/home/user/Desktop")
            assert tree["type"] == "directory" and [c["name"] for c in tree["children"]] == ["a.txt"]
            status, _, body = await _raw(
                client, "POST", "/list_directory", json={"path": "/home/user/Desktop/a.txt"}
            )
            assert status == 400 and "not a directory" in json.loads(body)["error"]
            # windows: launch, size, activate, close
            status, _, body = await _raw(
                client, "POST", "/setup/launch", json={"command": ["xterm", "-T", "probe"]}
            )
            assert status == 200 and body.endswith(b"launched successfully")
            await client.execute(["xdotool", "search", "--sync", "--onlyvisible", "--name", "probe"])
            status, _, body = await _raw(client, "POST", "/window_size", data={"app_class_name": "xterm"})
            size = json.loads(body)
            assert status == 200 and size["width"] > 100 and size["height"] > 100
            status, _, body = await _raw(
                client, "POST", "/setup/activate_window", json={"window_name": "probe"}
            )
            assert (status, body) == (200, b"Window activated successfully")
            status, _, body = await _raw(client, "POST", "/setup/close_window", json={"window_name": "probe"})
            assert (status, body) == (200, b"Window closed successfully.")
            status, _, _ = await _raw(client, "POST", "/setup/activate_window", json={})
            assert status == 400
            # scripts
            status, _, body = await _raw(client, "POST", "/run_python", json={"code": "print(6 * 7)"})
            ran = json.loads(body)
            assert status == 200 and ran["output"] == "42\n" and ran["return_code"] == 0
            status, _, body = await _raw(client, "POST", "/run_bash_script", json={"script": "echo $((6*7))"})
            assert status == 200 and json.loads(body) == {
                "status": "success",
                "output": "42\n",
                "error": "",
                "returncode": 0,
            }
            desktop = json.loads((await _raw(client, "POST", "/desktop_path"))[2])
            assert desktop == {"desktop_path": "/home/user/Desktop"}
            # the accessibility tree (AT-SPI; no accessible application open yet) and GNOME Terminal's text
            # (none open: OSWorld's answer, 200 with no output)
            status, _, body = await _raw(client, "GET", "/accessibility")
            assert status == 200 and json.loads(body)["AT"].startswith("<desktop-frame ")
            status, _, body = await _raw(client, "GET", "/terminal")
            assert status == 200 and json.loads(body) == {"output": None, "status": "success"}
            # malformed requests are refused, and the server keeps serving
            status, _, _ = await _raw(
                client, "POST", "/execute", data=b"{oops", headers={"Content-Type": "application/json"}
            )
            assert status == 400
            status, _, _ = await _raw(client, "POST", "/execute", json=["not", "an", "object"])
            assert status == 400
            assert await client.health()

    run(main())


def test_a_pyautogui_program_that_fails_for_the_vms_reason_is_not_a_refusal(tmp_path):
    """Through /execute, only the program's own refusal (exit status PYAUTOGUI_REFUSED: off screen, unknown
    key) is the policy's; any other failure (here: the VM has no display) is the VM's fault, as /action
    answers 500 for it, so the step is not recorded as refused."""
    import os
    import sys

    import pytest
    from aiohttp import web

    from guirl.agent.actions import Click
    from guirl.vmpool.client import VMTransientError
    from guirl.vmpool.server.app import VMServer

    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": str(tmp_path)}  # no DISPLAY

    async def main():
        runner = web.AppRunner(VMServer(None, env=env, home=str(tmp_path)).app())  # type: ignore[arg-type]
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with VMClient(f"http://127.0.0.1:{runner.addresses[0][1]}") as client:
                with pytest.raises(VMTransientError, match="failed on the VM"):
                    await client.perform(Click(x=1, y=1), action_space="pyautogui", screenshot=False)
        finally:
            await runner.cleanup()

    run(main(), timeout=60)
