"""guirl against OSWorld's own VM server: the `main.py` an OSWorld desktop image runs, unchanged, as the VM
server of a local desktop (`LocalProvider(osworld_server=...)`: Xvfb, IceWM, a D-Bus session with AT-SPI,
scrot for its screenshots), driven by guirl's real client, task setup, getters and both action spaces.

The server file is read from `../shared/osworld/server/` beside the checkout (or beside the checkout a clone
was made from, or `GUIRL_OSWORLD_DIR`); it is third-party code and is never copied into guirl. Expected
values come from what OSWorld's server does (its README's measured facts) and from the shipped tasks' own
evaluators, never from guirl's server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from guirl.agent.actions import Click, Hotkey, MoveTo, TypeText
from guirl.vmpool.apps import needed_apps
from guirl.vmpool.client import VMClient, VMFatalError
from guirl.vmpool.cloud import _vm_server_health
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.runner import load_solution, play
from guirl.vmpool.tasks.getters import get
from guirl.vmpool.tasks.model import getters_of, load_task
from guirl.vmpool.tasks.setup import TaskContext
from tests.helpers import osworld_dir, run
from tests.integration.test_shipped_tasks import SUITE, _suite

ROOT = Path(__file__).resolve().parents[2]
OSWORLD = osworld_dir()
SERVER = OSWORLD / "server" / "main.py" if OSWORLD else Path("../shared/osworld/server/main.py")
WIDTH, HEIGHT = 1024, 768


@contextlib.asynccontextmanager
async def osworld_desktop(root: Path) -> AsyncIterator[tuple[LocalProvider, str]]:
    """A local desktop whose VM server is OSWorld's (its asyncio processes belong to the running loop)."""
    if OSWORLD is None:
        pytest.fail("OSWorld's files are not beside this checkout (../shared/osworld): set GUIRL_OSWORLD_DIR")
    provider = LocalProvider(root / "vms", width=WIDTH, height=HEIGHT, osworld_server=SERVER)
    vm = await provider.create("osworld")
    try:
        yield provider, vm
    finally:
        await provider.delete(vm)


def _ctx(tmp_path: Path, name: str) -> TaskContext:
    ctx = TaskContext(
        task_id=name,
        cache_dir=tmp_path / "cache" / name,
        download_cache=tmp_path / "downloads",
        width=WIDTH,
        height=HEIGHT,
    )
    ctx.cache_dir.mkdir(parents=True)
    return ctx


def test_the_server_is_osworlds_and_guirl_sees_it_ready(tmp_path):
    """OSWorld's server has no /health (404): guirl's readiness probe, as a cloud pool runs it, must still
    say the VM is up, or every OSWorld VM would be terminated after `ready_timeout_s`."""

    async def main():
        async with osworld_desktop(tmp_path) as (provider, vm):
            address = provider.address(vm)
            async with VMClient(address, timeout_s=30) as client:
                with pytest.raises(VMFatalError) as missing:
                    await client._call("GET", "/health", idempotent=False)
                assert missing.value.status == 404
                assert await client.platform() == "Linux"
                assert await client.screen_size() == (WIDTH, HEIGHT)
                shot = await client.screenshot()
                assert shot.startswith(b"\x89PNG")
                assert await client.health()
            assert await _vm_server_health(address, 5.0)  # the probe a cloud pool waits on

    run(main(), timeout=120)


def _one_task_per_kind(domains: tuple[str, ...]) -> list[tuple[str, Path]]:
    """The first shipped task of each kind in `domains`: a kind is the applications a task starts, its setup
    and post-evaluation steps, its metrics, its getters, and what its reference solution does (the action
    types, and whether it types anything but letters, digits and spaces: formulas, tabs, capitals, `<`)."""
    kinds: dict[tuple, tuple[str, Path]] = {}
    for task_id, path in _suite():
        if path.parent.name not in domains:
            continue
        task = load_task(path)
        actions = load_solution(SUITE / "solutions" / f"{task_id}.jsonl")
        typed = "".join(getattr(a, "text", "") for a in actions)
        kind = (
            tuple(sorted(app.name for app in needed_apps(task))),
            tuple(sorted({step.type for step in task.config})),
            tuple(sorted({step.type for step in task.evaluator.postconfig})),
            tuple(sorted(set(task.funcs))),
            tuple(sorted(set(getters_of(task)))),
            tuple(sorted({type(a).__name__ for a in actions})),
            bool(set(typed) - set("abcdefghijklmnopqrstuvwxyz0123456789 ")),
        )
        kinds.setdefault(kind, (task_id, path))
    return list(kinds.values())


def test_shipped_suite_scores_one_through_osworlds_server(tmp_path):
    """The shipped tasks' reference solutions score 1 through OSWorld's server, as they do through guirl's
    (tests/integration/test_shipped_tasks.py, every task): setup steps, actions, getters and metrics, one
    task of each kind (`_one_task_per_kind`). The tasks alternate between the action
    spaces (computer_use falls back to /execute on a server without /action) and are split over two desktops
    that play at once (a solution's waits leave the CPU idle). The tasks of the terminals, Mousepad and Calc:
    OSWorld's server has no tunnel to Chrome's DevTools (guirl's route), and the other applications' setup,
    getters and metrics are the same calls these make."""
    suite = _one_task_per_kind(("terminal", "text_editor", "spreadsheet"))
    assert {p.parent.name for _, p in suite} == {"terminal", "text_editor", "spreadsheet"}

    async def play_share(share: int) -> dict[str, float]:
        scores = {}
        async with osworld_desktop(tmp_path / f"desktop{share}") as (provider, vm):
            for index, (task_id, path) in enumerate(suite):
                if index % 2 != share:
                    continue
                action_space = ("pyautogui", "computer_use")[index // 2 % 2]
                task = load_task(path)
                await provider.reset(vm)
                async with VMClient(provider.address(vm), timeout_s=60) as client:
                    ctx = _ctx(tmp_path / f"desktop{share}", task_id)
                    actions = load_solution(SUITE / "solutions" / f"{task_id}.jsonl")
                    episode = await play(task, client, actions, ctx, action_space=action_space)
                    assert episode.refused == [], (action_space, task_id, episode.refused)
                    assert ctx.evaluation_errors == [], (action_space, task_id, ctx.evaluation_errors)
                    scores[task_id] = episode.score
        return scores

    async def main():
        return await asyncio.gather(play_share(0), play_share(1))

    scores = {k: v for share in run(main(), timeout=900) for k, v in share.items()}
    assert scores == {task_id: 1.0 for task_id, _ in suite}


def test_pyautogui_programs_type_less_than_and_refuse_what_action_refuses(tmp_path):
    """Through OSWorld's /execute, `<` is typed as `<` (pyautogui alone types `>` on X), and an unknown key
    or an off-screen point is refused with the reason (pyautogui alone drops the one, clamps the other)."""

    async def main():
        async with osworld_desktop(tmp_path) as (provider, vm):
            await provider.reset(vm)
            async with VMClient(provider.address(vm), timeout_s=60) as client:
                # an xterm that writes the first line typed into it to a file, then exits
                out = await client.execute(
                    ["bash", "-c", "xterm -e sh -c 'head -n1 > ~/typed.txt' >/dev/null 2>&1 & echo $!"]
                )
                pid = out["output"].strip()
                found = await client.execute(
                    ["xdotool", "search", "--sync", "--classname", "xterm", "windowactivate", "--sync"],
                    timeout_s=60,
                )
                assert found["returncode"] == 0, found
                typed = await client.perform(TypeText(text="a<b>c <x>\n"), action_space="pyautogui")
                assert typed.ok, typed.error
                done = await client.execute(["timeout", "30", "tail", f"--pid={pid}", "-f", "/dev/null"])
                assert done["returncode"] == 0, done  # the xterm exited: its line is written
                assert await client.get_file("/home/user/typed.txt") == b"a<b>c <x>\n"

                unknown = await client.perform(Hotkey(keys=["ctrl", "no-such-key"]), action_space="pyautogui")
                assert not unknown.ok and "unknown key name(s) ['no-such-key']" in unknown.error
                off = await client.perform(Click(x=WIDTH + 5, y=10), action_space="pyautogui")
                assert not off.ok and f"x={WIDTH + 5} is off the {WIDTH}x{HEIGHT} screen" in off.error
                edge = await client.perform(MoveTo(x=WIDTH - 1, y=HEIGHT - 1), action_space="pyautogui")
                assert edge.ok, edge.error
                assert await client.cursor_position() == (WIDTH - 1, HEIGHT - 1)

    run(main(), timeout=180)


def test_getters_return_what_osworlds_return(tmp_path):
    """A program that cannot start answers 500 on OSWorld's server, and OSWorld's getter returns None (the
    task scores what None scores): not an environment error. `/list_directory` does not expand `~` there,
    so a listing of `~/...` is None, as OSWorld's getter gives."""

    async def main():
        async with osworld_desktop(tmp_path) as (provider, vm):
            async with VMClient(provider.address(vm), timeout_s=60) as client:
                ctx = _ctx(tmp_path, "getters")
                missing = {"type": "vm_command_line", "command": ["no-such-program-anywhere"]}
                assert await get(missing, client, ctx) is None
                assert await get({**missing, "type": "vm_command_error"}, client, ctx) is None
                ok = {"type": "vm_command_line", "command": "echo hi", "shell": True}
                assert await get(ok, client, ctx) == "hi\n"
                listing = {"type": "list_directory", "path": "~/server"}
                assert await get(listing, client, ctx) is None
                tree = await get({"type": "list_directory", "path": "/home/user/server"}, client, ctx)
                assert "main.py" in {c["name"] for c in tree["children"]}
                # no terminal is open: OSWorld answers 200 with no output
                assert await get({"type": "vm_terminal_output"}, client, ctx) is None

    run(main(), timeout=120)


def test_guirls_server_answers_as_osworlds_where_a_client_can_tell(tmp_path):
    """The same requests to guirl's VM server and to OSWorld's: where a client (a getter) can tell them
    apart, guirl's server gives OSWorld's answer, except where OSWorld's is a defect guirl documents
    (docs/osworld-compat.md §1.1) and refuses instead."""

    async def main():
        guirl_provider = LocalProvider(tmp_path / "guirl-vms", width=WIDTH, height=HEIGHT)
        guirl_vm = await guirl_provider.create("guirl")
        try:
            async with (
                osworld_desktop(tmp_path) as (provider, vm),
                VMClient(provider.address(vm), timeout_s=60) as osworld,
                VMClient(guirl_provider.address(guirl_vm), timeout_s=60) as guirl,
            ):
                ctx = _ctx(tmp_path, "differential")
                for client in (osworld, guirl):
                    # `~` is not expanded by /list_directory: no such directory
                    with pytest.raises(VMFatalError) as refused:
                        await client.list_directory("~")
                    assert refused.value.status == 400
                    assert await get({"type": "list_directory", "path": "~"}, client, ctx) is None
                    # no terminal to read: 200 with no output
                    assert await get({"type": "vm_terminal_output"}, client, ctx) is None
                    missing = {"type": "vm_command_line", "command": ["no-such-program-anywhere"]}
                    assert await get(missing, client, ctx) is None
                # `shell: true` with a list: OSWorld runs the first item alone (the rest become $0...);
                # guirl refuses the request instead of running something else than was sent
                cut = await osworld.execute(["echo first", "echo second"], shell=True)
                assert cut["returncode"] == 0 and cut["output"] == "first\n"
                with pytest.raises(VMFatalError) as refused:
                    await guirl.execute(["echo first", "echo second"], shell=True)
                assert refused.value.status == 400 and "a list of one string" in str(refused.value)
                for client in (osworld, guirl):
                    one = await client.execute(["echo only"], shell=True)
                    assert one["output"] == "only\n"
        finally:
            await guirl_provider.delete(guirl_vm)

    run(main(), timeout=180)


def _shape(xml: str) -> list[tuple]:
    """Each element of an accessibility tree in document order: its depth, tag, attributes and text, but for
    what depends on where a window landed or which widget has the focus (positions are checked for OSWorld's
    format instead)."""
    import re

    import lxml.etree

    root = lxml.etree.fromstring(xml.encode())
    st, cp = root.nsmap["st"], root.nsmap["cp"]
    focus = {f"{{{st}}}{s}" for s in ("focused", "active", "selected", "armed", "checked")}
    place = {f"{{{cp}}}screencoord", f"{{{cp}}}size"}
    out = []

    def walk(node, depth):
        for key in place & set(node.attrib):
            assert re.fullmatch(r"\(-?\d+, -?\d+\)", node.get(key)), (node.tag, key, node.get(key))
        attrs = {k: v for k, v in node.attrib.items() if k not in focus}
        attrs.update({k: "(x, y)" for k in place & set(attrs)})
        out.append((depth, node.tag, tuple(sorted(attrs.items())), (node.text or "").strip()))
        for child in node:
            walk(child, depth + 1)

    walk(root, 0)
    return out


def test_the_accessibility_tree_and_terminal_text_are_osworlds(tmp_path):
    """The same application open on a desktop served by OSWorld's own server and on one served by guirl's:
    `/accessibility` gives the same tree (the same elements, tags, names, text and attributes, namespaces
    declared alike) and `/terminal` the same text."""
    import lxml.etree

    async def settle(client: VMClient, want: str) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the application is still starting
            tree = await client.accessibility_tree()
            if want in tree:
                return tree
        raise AssertionError(f"{want!r} never showed in the tree: {tree[:2000]}")

    async def main():
        guirl_provider = LocalProvider(tmp_path / "guirl-vms", width=WIDTH, height=HEIGHT)
        guirl_vm = await guirl_provider.create("guirl")
        try:
            async with (
                osworld_desktop(tmp_path) as (provider, vm),
                VMClient(provider.address(vm), timeout_s=60) as osworld,
                VMClient(guirl_provider.address(guirl_vm), timeout_s=60) as guirl,
            ):
                trees = {}
                for name, client in (("osworld", osworld), ("guirl", guirl)):
                    await client.upload("/home/user/notes.txt", b"remember the milk")
                    await client.launch(["mousepad", "/home/user/notes.txt"])
                    trees[name] = await settle(client, ">remember the milk</text>")
                ours, theirs = lxml.etree.fromstring(trees["guirl"]), lxml.etree.fromstring(trees["osworld"])
                assert ours.tag == theirs.tag == "desktop-frame" and ours.nsmap == theirs.nsmap
                assert dict(ours.attrib) == dict(theirs.attrib) == {}
                assert _shape(trees["guirl"]) == _shape(trees["osworld"])
                outputs = {}
                for name, client in (("osworld", osworld), ("guirl", guirl)):
                    await client.launch(["gnome-terminal"])
                    await client.execute(
                        ["xdotool", "search", "--sync", "--onlyvisible", "--class", "gnome-terminal"],
                        timeout_s=60,
                    )
                    await client.execute(["xdotool", "type", "--delay", "20", "echo $((6 * 7))-done\n"])
                    ctx = _ctx(tmp_path, f"terminal-{name}")
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:
                        outputs[name] = await get({"type": "vm_terminal_output"}, client, ctx)
                        if outputs[name] and outputs[name].endswith("$") and "42-done" in outputs[name]:
                            break
                assert outputs["guirl"] == outputs["osworld"] and "\n42-done\n" in outputs["guirl"]
        finally:
            await guirl_provider.delete(guirl_vm)

    run(main(), timeout=300)
