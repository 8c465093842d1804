"""The `replay` provider behind the pool: a real replay host process, real unix sockets, guirl's VMClient.

- which recorded episodes can be replayed, and why the others are listed as skipped;
- the pool's lifecycle on replayed desktops: pre-warm, leases, reset to the recording's first screen, a
  lease that stops beating taken back, a desktop that dies replaced (its lease broken), close;
- the protocol as the real server speaks it: the recorded screens in order, refusals as the real server
  refuses (bad JSON 400, a point off the screen 422), 501 for what needs programs or files;
- the verdict: the recorded score for the recorded actions (within the tolerance), `ReplayDiverged` at
  the first action that left them;
- the host ends with the process that started it.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from guirl.agent.actions import Click, TypeText
from guirl.testing.recording import write_recording
from guirl.vmpool.client import VMClient, VMTransientError
from guirl.vmpool.pool import VMPool
from guirl.vmpool.provider import ProviderError
from guirl.vmpool.replay import ReplayDiverged, ReplayProvider, load_recording, verdict
from tests.helpers import run

SIZE = (320, 200)


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recording")
    write_recording(root, tasks=3, steps=4, size=SIZE, distinct_screens=5, score=0.5)
    return root


def _episode(root: Path, task: str) -> Path:
    return next((root / "episodes" / task).iterdir())


def _screens(root: Path, task: str) -> list[bytes]:
    folder = _episode(root, task)
    n = len((folder / "traj.jsonl").read_text().splitlines())
    return [(folder / f"step_{i:03d}.png").read_bytes() for i in range(n)] + [
        (folder / "final.png").read_bytes()
    ]


def test_what_can_be_replayed_and_what_is_listed_as_skipped(tmp_path):
    write_recording(tmp_path, tasks=7, steps=3, size=SIZE)
    eps = {t: _episode(tmp_path, f"replayed-{t:04d}") for t in range(7)}
    other = write_recording(tmp_path / "big", tasks=1, steps=2, size=(640, 400))
    result = json.loads((eps[0] / "result.json").read_text())
    (eps[0] / "result.json").write_text(json.dumps({**result, "status": "retried", "env_error": "VM died"}))
    (eps[1] / "step_001.png").unlink()
    (eps[2] / "traj.jsonl").write_text('{"step": 0, "actions": [{"type": "rm -rf /"}]}\n')
    (eps[3] / "result.json").write_text("[1, 2")
    # replayable; what it played ends at its DONE (a parsed action after it was never taken)
    rows = [json.loads(x) for x in (eps[4] / "traj.jsonl").read_text().splitlines()]
    rows[-1]["actions"].append({"type": "click", "x": 1, "y": 1})
    (eps[4] / "traj.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    wrong = tmp_path / "episodes" / "replayed-0004" / "wrong-size"  # another episode of the task
    os.rename(next((tmp_path / "big" / "episodes" / other["tasks"][0]).iterdir()), wrong)
    (wrong / "result.json").write_text(json.dumps({**result, "task_id": "replayed-0004"}))
    (eps[5] / "result.json").write_text(json.dumps({**result, "task_id": "replayed-0003"}))
    (eps[6] / "step_002.png").unlink()  # a link to a shared screen: replaced, not written through
    shutil.copyfile(tmp_path / "big" / "screens" / "0.png", eps[6] / "step_002.png")
    rec = load_recording(tmp_path, SIZE)
    assert sorted(rec.tasks()) == ["replayed-0004"] and len(rec.by_key) == 1
    assert rec.choose("replayed-0004", 0).actions[-1] == {"type": "done"}
    why = {k.split("/")[0] + ("/wrong" if "wrong" in k else ""): v for k, v in rec.skipped.items()}
    assert "not a completed episode" in why["replayed-0000"]
    assert "step_001.png is missing" in why["replayed-0001"]
    assert "not a typed action" in why["replayed-0002"]
    assert "result.json unreadable" in why["replayed-0003"]
    assert "step_000.png is 640x400" in why["replayed-0004/wrong"]
    assert "its task_id 'replayed-0003'" in why["replayed-0005"]  # another task's episode
    assert "step_002.png is 640x400" in why["replayed-0006"]  # a later screen checked too
    assert len(rec.skipped) == 7
    with pytest.raises(ProviderError, match="not a run directory"):
        load_recording(tmp_path / "nowhere")
    with pytest.raises(ProviderError, match="no replayable episode"):
        load_recording(tmp_path, (1920, 1080))  # every screen is the wrong size


def test_the_verdict_takes_the_recorded_actions_within_the_tolerance(recording):
    rec = load_recording(recording, SIZE)
    recorded = rec.choose("replayed-0001", 7)
    actions = [dict(a) for a in recorded.actions]
    assert verdict(recorded, actions, tolerance_px=8) == 0.5
    nudged = [{**a, "x": a["x"] + 8} if a["type"] == "click" else a for a in actions]
    assert verdict(recorded, nudged, tolerance_px=8) == 0.5
    with pytest.raises(ReplayDiverged, match="at action 0"):
        verdict(recorded, [{**actions[0], "x": actions[0]["x"] + 9}, *actions[1:]], tolerance_px=8)
    with pytest.raises(ReplayDiverged, match="at action 1"):
        verdict(recorded, [actions[0], TypeText(text="something else"), *actions[2:]], tolerance_px=8)
    with pytest.raises(ReplayDiverged, match="took 2 actions"):
        verdict(recorded, actions[:2], tolerance_px=8)
    with pytest.raises(ProviderError, match="no replayable recording"):
        rec.choose("not-recorded", 0)


def test_pool_lifecycle_on_replayed_desktops(recording):
    async def scenario() -> None:
        provider = ReplayProvider(recording, step_latency_s=0.05)
        pool = VMPool(provider, max_envs=3, prewarm=2, lease_ttl_s=0.6, health_interval_s=0.2)
        await pool.start()
        try:
            assert pool.metrics()["idle"] == 2 and pool.metrics()["created"] == 2
            screens = _screens(recording, "replayed-0002")
            lease = await pool.acquire(timeout=10)
            beating = asyncio.create_task(_beat(pool, lease.lease_id))
            assert await provider.bind(lease.vm_id, "replayed-0002", 0) == "replayed-0002/replayed-0002-e0"
            async with VMClient(lease.address, timeout_s=10) as client:
                assert await client.screenshot() == screens[0]
                assert await client.screen_size() == SIZE and await client.platform() == "Linux"
                started = time.monotonic()
                result = await client.act(Click(x=10, y=10))
                assert result.ok and result.screenshot == screens[1]
                assert time.monotonic() - started >= 0.05  # the step latency
                # two actions in one step: the screen moves on once, when it is next shown
                assert (await client.act(TypeText(text="a"), screenshot=False)).screenshot is None
                await client.act(TypeText(text="b"), screenshot=False)
                assert await client.screenshot() == screens[2]
                assert await client.screenshot() == screens[2]  # no action since: the same screen
                # refused (off the screen, as the real server says), yet a step taken: the recorded run took
                # the next screen after it too
                refused = await client.act(Click(x=SIZE[0], y=5))
                assert not refused.ok and "off the 320x200 screen" in refused.error
                assert await client.screenshot() == screens[3]
                for _ in range(5):  # past the recording's end: its final screen
                    shot = (await client.act(Click(x=1, y=1))).screenshot
                assert shot == screens[-1]
                with pytest.raises(VMTransientError, match="501"):
                    await client.execute(["ls"])  # no programs
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=lease.address[7:])) as s:
                async with s.post("http://vm/action", data=b"{not json") as resp:
                    assert resp.status == 400
                async with s.post("http://vm/file", json={"file_path": "/etc/passwd"}) as resp:
                    assert resp.status == 501
            # released: reset to the recording's first screen before it is lent again
            beating.cancel()
            await pool.release(lease.lease_id)
            assert pool.metrics()["resets"] == 1
            again = await pool.acquire(timeout=10)
            await provider.bind(again.vm_id, "replayed-0002", 0)
            async with VMClient(again.address, timeout_s=10) as client:
                assert await client.screenshot() == screens[0]
            # a holder that stops beating loses its lease: taken back, reset, lent again
            await asyncio.wait_for(_until(lambda: again.broken == "lease expired", pool), 10)
            assert pool.metrics()["expired"] == 1
            # a desktop that dies mid-lease: its lease is broken and it is replaced
            dying = await pool.acquire(timeout=10)
            beating = asyncio.create_task(
                _beat(pool, dying.lease_id)
            )  # its holder is alive: only the VM dies
            provider.kill(dying.vm_id)
            await asyncio.wait_for(_until(lambda: dying.broken != "", pool), 10)
            beating.cancel()
            assert dying.broken == "the VM stopped answering" and pool.metrics()["replaced"] == 1
            m = pool.metrics()
            assert m["busy"] + m["idle"] + m["resetting"] + m["starting"] <= m["max_envs"]
            assert sorted(await provider.list(pool.tag)) == sorted(pool._vms)
            with pytest.raises(ProviderError, match="no replayable recording"):
                await provider.bind(next(iter(pool._vms)), "not-recorded", 0)
        finally:
            await pool.close()
            host = provider._proc
            sockets = provider._dir
            await provider.close()
        assert host is not None and host.returncode is not None  # the host is gone
        assert sockets is not None and not sockets.exists()

    run(scenario(), timeout=60)


async def _beat(pool: VMPool, lease_id: str) -> None:
    while True:
        pool.heartbeat(lease_id)
        await asyncio.sleep(0.1)  # a holder's heartbeat period


async def _until(condition, pool: VMPool) -> None:
    while not condition():
        try:
            await pool.wait_changed(0.2)
        except TimeoutError:
            pass


def test_the_host_ends_with_the_process_that_started_it(recording, tmp_path):
    """A pool's process killed outright (SIGKILL: no clean-up) leaves no replay host behind."""
    script = tmp_path / "owner.py"
    script.write_text(
        "import asyncio, sys\n"
        "from guirl.vmpool.replay import ReplayProvider\n"
        "async def main():\n"
        f"    p = ReplayProvider({str(recording)!r})\n"
        "    await p.create('t')\n"
        "    print(p._proc.pid, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        host_pid = int(owner.stdout.readline())
        host = os.pidfd_open(host_pid)  # readable once the host has exited
        try:
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(10)
            ended, _, _ = select.select([host], [], [], 15)
            assert ended, "the replay host outlived its owner"
        finally:
            os.close(host)
    finally:
        owner.kill()
        owner.wait(10)


def test_the_admin_routes_refuse_what_is_not_a_desktop_id(recording):
    """The provider's socket is the only way in; still, an id that is not one is refused, never a path."""

    async def scenario() -> None:
        provider = ReplayProvider(recording)
        vm = await provider.create("t")
        admin = provider._dir / "admin.sock"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(admin))) as s:
                for method, path, body in [
                    ("DELETE", "/desktops/..%2F..%2Fx", None),
                    ("POST", "/desktops/a%20b/reset", None),
                    ("POST", "/desktops", {"id": "../x"}),
                    ("POST", "/desktops", {"id": vm}),  # exists
                    ("POST", f"/desktops/{vm}/bind", {"key": "../../etc/passwd"}),
                    ("POST", f"/desktops/{vm}/bind", {"screens": ["../../etc/passwd"]}),  # not recorded
                    ("POST", f"/desktops/{vm}/bind", {"screens": []}),
                    ("POST", "/desktops", {"id": "fresh", "screens": ["/etc/passwd"]}),
                    ("POST", f"/desktops/{vm}/bind", [1, 2]),
                    ("DELETE", "/desktops/unknown", None),
                ]:
                    async with s.request(method, "http://replay" + path, json=body) as resp:
                        assert resp.status in (400, 404, 409), (method, path, resp.status)
            assert admin.exists() and (provider._dir / "d" / f"{vm}.sock").exists()
            assert await provider.list("t") == [vm]  # nothing made, nothing lost
        finally:
            await provider.close()

    run(scenario(), timeout=60)


def test_a_step_sleeping_through_a_reset_does_not_move_the_new_episode(recording):
    """A lease taken back mid-step (the desktop reset and bound anew while the step's latency runs) leaves
    the new episode on its first screen."""

    async def scenario() -> None:
        provider = ReplayProvider(recording, step_latency_s=0.5)
        vm = await provider.create("t")
        await provider.bind(vm, "replayed-0000", 0)
        first = _screens(recording, "replayed-0001")[0]
        try:
            async with VMClient(provider.address(vm), timeout_s=10) as client:
                step = asyncio.create_task(client.act(Click(x=5, y=5)))  # sleeps out the step latency
                while (await provider._admin("GET", "/stats"))["actions"] < 1:
                    pass  # until the desktop has the action (its reply is 0.5 s away)
                assert not step.done()
                await provider.reset(vm)
                await provider.bind(vm, "replayed-0001", 0)
                await step
                assert await client.screenshot() == first
        finally:
            await provider.close()

    run(scenario(), timeout=60)
