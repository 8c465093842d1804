"""Real local VMs: sandboxed Xvfb desktops with the VM server, driven through `VMClient`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from pathlib import Path

import pytest

from guirl.agent.actions import Click, Hotkey, TypeText
from guirl.vmpool.client import VMClient, VMFatalError
from guirl.vmpool.local import LocalProvider
from tests.helpers import run

W, H = 800, 600  # small screens keep the tests fast; the default is 1920x1080


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


@contextlib.asynccontextmanager
async def local_vm(tmp_path: Path):
    provider = LocalProvider(tmp_path / "vms", width=W, height=H)
    vm = await provider.create("test")
    client = VMClient(provider.address(vm), timeout_s=30)
    try:
        yield provider, vm, client
    except Exception as exc:  # say what the VM's session said: the cause is often there
        state = provider.vms[vm]
        log = (state.dir / "session.log").read_text(errors="replace")[-4000:]
        code = state.proc.returncode if state.proc else None
        raise AssertionError(f"{exc!r}\nsession exit code: {code}\n--- session log ---\n{log}") from exc
    finally:
        await client.close()
        await provider.delete(vm)


async def _terminal(client: VMClient) -> None:
    """Open an xterm and give it the keyboard focus, waiting until it has a window."""
    await client.launch(["xterm", "-geometry", "80x20+0+0"])
    result = await client.execute(
        ["xdotool", "search", "--sync", "--onlyvisible", "--class", "xterm"], timeout_s=30
    )
    assert result["returncode"] == 0, result
    assert (await client.act(Click(x=100, y=100), screenshot=False)).ok


async def _type_and_wait(client: VMClient, line: str, marker: str) -> None:
    """Type a shell line that ends by creating ~/<marker>, and wait until the file exists."""
    assert (await client.act(TypeText(text=f"{line}; touch ~/{marker}\n"), screenshot=False)).ok
    done = await client.execute(
        ["bash", "-c", f"for i in $(seq 100); do [ -e ~/{marker} ] && exit 0; sleep 0.1; done; exit 1"]
    )
    assert done["returncode"] == 0, f"the terminal did not run {line!r}"


def test_desktop_screenshot_execute_and_typed_actions(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (provider, vm, client):
            assert await client.platform() == "Linux"
            assert await client.screen_size() == (W, H)
            assert _png_size(await client.screenshot()) == (W, H)
            whoami = await client.execute(["bash", "-c", "id -un; echo $HOME; pwd"])
            assert whoami["output"].split() == ["user", "/home/user", "/home/user"]
            await _terminal(client)
            await _type_and_wait(client, "echo typed > ~/typed.txt", "m1")
            assert await client.get_file("/home/user/typed.txt") == b"typed\n"
            assert await client.get_file("/home/user/nope.txt") is None
            # a typed action comes back with the next screenshot
            result = await client.act(Hotkey(keys=["ctrl", "l"]))
            assert result.ok and _png_size(result.screenshot) == (W, H)
            # bad actions are refused with a reason, and the server keeps serving
            for bad in (Click(x=W + 5, y=1), Hotkey(keys=["nosuchkey"])):
                refused = await client.act(bad)
                assert not refused.ok and refused.error
            with pytest.raises(VMFatalError):
                await client.execute([])
            with pytest.raises(VMFatalError, match="400 bad action: JSON is malformed"):
                await client._call(
                    "POST",
                    "/action",
                    idempotent=False,
                    data=b"{not json",
                    headers={"Content-Type": "application/json"},
                )
            assert await client.health()  # still serving

    run(main())


def test_reset_restores_a_pristine_home(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (provider, vm, client):
            await client.upload("/home/user/Desktop/notes.txt", b"dirty")
            assert await client.get_file("/home/user/Desktop/notes.txt") == b"dirty"
            await provider.reset(vm)
            assert await client.get_file("/home/user/Desktop/notes.txt") is None
            assert await client.health()

    run(main())


def test_sandbox_keeps_the_host_safe(tmp_path):
    tag = os.urandom(4).hex()
    host_tmp_canary = Path("/tmp") / f"guirl-canary-{tag}"
    host_home_canary = Path.home() / f".guirl-canary-{tag}"
    for canary in (host_tmp_canary, host_home_canary):
        canary.write_text("still here")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]

    async def main():
        async with local_vm(tmp_path) as (_provider, _vm, client):
            await _terminal(client)
            # what a careless agent might type, aimed at the host's files
            await _type_and_wait(client, "rm -rf ~ /tmp/guirl-canary-* ~/.guirl-canary-*; mkdir -p ~", "m1")
            await _type_and_wait(client, "cat /etc/shadow > /tmp/x; echo pwned > /tmp/x", "m2")
            probe = await client.execute(
                [
                    "python3",
                    "-c",
                    f"import socket; s = socket.socket(); s.settimeout(2); "
                    f"print(s.connect_ex(('127.0.0.1', {port})))",
                ]
            )
            assert probe["returncode"] == 0 and probe["output"].strip() != "0", probe  # refused inside
            inside = await client.execute(["bash", "-c", "cat /tmp/x; ls /root /work 2>&1 | head -3"])
            assert inside["output"].startswith("pwned")  # the VM's own /tmp got it

    try:
        run(main())
        assert host_tmp_canary.read_text() == "still here"
        assert host_home_canary.read_text() == "still here"
        assert not Path("/tmp/x").exists() or Path("/tmp/x").read_text() != "pwned\n"
        with pytest.raises(BlockingIOError):  # nobody from the VM ever reached the host's port
            listener.accept()
    finally:
        listener.close()
        for canary in (host_tmp_canary, host_home_canary):
            canary.unlink(missing_ok=True)


def test_a_vm_whose_x_server_dies_is_seen_dead(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (provider, vm, client):
            assert await client.health() and provider.alive(vm)
            await client.execute(["pkill", "-x", "Xvfb"])
            # the session ends with its display; wait for that, then the health check says so
            await asyncio.wait_for(provider.vms[vm].proc.wait(), 30)
            assert not provider.alive(vm) and not await client.health(timeout_s=2)

    run(main())


def test_nothing_inside_can_redirect_the_host_or_loop_a_listing(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (provider, vm, client):
            # the server's socket is not inside the sandbox: nothing in the VM can replace it
            probe = await client.execute(
                [
                    "bash",
                    "-c",
                    "find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o -name api.sock -print "
                    "2>/dev/null; echo end",
                ]
            )
            assert probe["output"] == "end\n", probe
            assert provider.vms[vm].socket.is_socket()
            # a symlink loop in the home does not make /list_directory run away
            await client.execute(["bash", "-c", "cd ~ && ln -s . a && ln -s . b && ln -s . c"])
            tree = await client.list_directory("/home/user")
            links = [c for c in tree["children"] if c["name"] in "abc"]
            assert len(links) == 3 and all("children" not in c for c in links)

    run(main())


def test_a_vm_under_a_deep_directory_is_reachable(tmp_path):
    """An AF_UNIX path holds 108 bytes: a VM whose directory is deeper is bound and reached through a
    short link (which goes with the VM)."""
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)

    async def scenario():
        provider = LocalProvider(deep, width=W, height=H)
        vm = await provider.create("test")
        assert len(str(provider.vms[vm].socket)) > 108
        link = Path(provider.address(vm).removeprefix("unix://")).parent
        try:
            async with VMClient(provider.address(vm), timeout_s=30) as client:
                assert await client.health()
        finally:
            await provider.delete(vm)
        assert not link.is_symlink()

    run(scenario())


def test_a_reset_returns_only_when_nothing_of_the_old_desktop_runs(tmp_path):
    """Killing bwrap makes the kernel kill the sandbox's processes, but not at once: writers left running
    for a moment wrote into the home being restored ("Directory not empty"). Reset and delete wait until
    every process of the sandbox's PID namespace is gone."""
    import select

    from guirl.vmpool.sandbox import namespace_members, namespace_name

    writers = (
        "for i in 1 2 3 4; do (while :; do echo x > ~/spam.$i.$RANDOM; done) >/dev/null 2>&1 & done; echo ok"
    )

    def hold(vm_state) -> list[int]:
        """pidfds of every process of the VM's sandbox (a pid may be reused, a pidfd names one process)."""
        fds = []
        for pid in namespace_members(namespace_name(vm_state.pidns_fd)):
            with contextlib.suppress(ProcessLookupError):  # it exited between the scan and the open
                fds.append(os.pidfd_open(pid))
        return fds

    def still_running(pidfds: list[int]) -> int:
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        exited = {fd for fd, _ in poller.poll(0)}
        for fd in pidfds:
            os.close(fd)
        return len(set(pidfds) - exited)

    async def main():
        async with local_vm(tmp_path) as (provider, vm, client):
            for _ in range(3):
                started = await client.execute(["bash", "-c", writers])
                assert started["output"].strip() == "ok", started
                old = hold(provider.vms[vm])
                assert len(old) >= 7  # bwrap's init, the server, X, the writers (and a window manager)
                await provider.reset(vm)
                assert still_running(old) == 0
                assert not list((provider.vms[vm].dir / "home").glob("spam.*"))
                assert await client.health()
            old = hold(provider.vms[vm])
        assert still_running(old) == 0  # delete too

    run(main())


def test_the_namespace_killer_never_kills_its_own():
    from guirl.vmpool.sandbox import kill_namespace, pid_namespace

    with pytest.raises(ValueError, match="own PID namespace"):
        kill_namespace(pid_namespace("self"))


def test_a_vm_starts_from_a_python_reached_through_a_symlink(tmp_path):
    """A virtual environment that is itself a link (or a prefix under a linked directory): the sandbox runs
    the interpreter by the name this Python has, so that name must exist inside it too."""
    import subprocess
    import sys

    link = tmp_path / "env-link"
    link.symlink_to(Path(sys.prefix))
    script = f"""
import asyncio
from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider

async def main():
    provider = LocalProvider({str(tmp_path / "vms")!r}, width=320, height=240)
    vm = await provider.create("link")
    try:
        async with VMClient(provider.address(vm), timeout_s=30) as client:
            print(len(await client.screenshot()), await client.screen_size())
    finally:
        await provider.delete(vm)

asyncio.run(main())
"""
    python = link / "bin" / Path(sys.executable).name
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    size, screen = out.stdout.split(maxsplit=1)
    assert int(size) > 100 and screen.strip() == "(320, 240)"


def test_screenshots_show_the_pointer_as_osworlds_do_unless_turned_off(tmp_path):
    """The pointer moved over an empty screen (no window manager: no taskbar clock ticking): drawn in, the
    screenshots differ where it was and where it went; turned off (`env.screenshot_cursor = false`), the
    screen is the same there."""
    from io import BytesIO

    from PIL import Image, ImageChops

    from guirl.agent.actions import MoveTo

    async def two_shots(cursor: bool) -> tuple[Image.Image, Image.Image]:
        provider = LocalProvider(
            tmp_path / f"vms-{cursor}", width=320, height=240, cursor=cursor, window_manager=""
        )
        vm = await provider.create("cursor")
        try:
            async with VMClient(provider.address(vm), timeout_s=30) as client:
                shots = []
                for x, y in ((60, 60), (220, 160)):
                    shot = (await client.act(MoveTo(x=x, y=y))).screenshot
                    assert shot is not None and await client.cursor_position() == (x, y)
                    shots.append(Image.open(BytesIO(shot)).convert("RGB"))
                return shots[0], shots[1]
        finally:
            await provider.delete(vm)

    async def main():
        return await asyncio.gather(two_shots(True), two_shots(False))

    (a, b), (c, d) = run(main(), timeout=120)
    for x, y in ((60, 60), (220, 160)):  # the pointer's image lies right of and below its hotspot
        around = (x - 4, y - 4, x + 20, y + 20)
        assert ImageChops.difference(a.crop(around), b.crop(around)).getbbox() is not None, (x, y)
        assert ImageChops.difference(c.crop(around), d.crop(around)).getbbox() is None, (x, y)
