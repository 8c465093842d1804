"""`VMPool` over real local VMs: leasing, reset on release, health checks and replacement, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.pool import PoolError, VMPool
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[2]


def _sandboxes() -> list[psutil.Process]:
    """Our descendants that are sandboxes or X servers."""
    return [p for p in psutil.Process().children(recursive=True) if p.name() in ("bwrap", "Xvfb")]


def test_lease_reset_replace_and_close(tmp_path):
    provider = LocalProvider(tmp_path / "vms", width=640, height=480)

    async def main():
        async with VMPool(provider, max_envs=2, prewarm=2, health_interval_s=0.5, lease_ttl_s=60) as pool:
            assert pool.metrics()["idle"] == 2 and pool.metrics()["created"] == 2
            a, b = await pool.acquire(), await pool.acquire()
            assert a.vm_id != b.vm_id and pool.metrics()["busy"] == 2
            with pytest.raises(PoolError, match="no VM free"):
                await pool.acquire(timeout=0.5)
            # a dirty VM comes back pristine
            async with VMClient(a.address) as client:
                await client.upload("/home/user/dirty.txt", b"x")
            await pool.release(a.lease_id)
            m = pool.metrics()
            assert m["idle"] == 1 and m["busy"] == 1 and m["resets"] == 1 and m["reset_p50_s"] is not None
            again = await pool.acquire()
            assert again.vm_id == a.vm_id
            async with VMClient(again.address) as client:
                assert await client.get_file("/home/user/dirty.txt") is None
            # the X server of a leased VM dies: the health check sees it and the VM is replaced
            async with VMClient(b.address) as client:
                await client.execute(["pkill", "-x", "Xvfb"])
            while not b.broken:
                await pool.wait_changed(30)
            m = pool.metrics()
            assert b.broken == "the VM stopped answering" and m["replaced"] == 1
            assert m["busy"] + m["idle"] + m["resetting"] + m["starting"] <= m["max_envs"]
            replacement = await pool.acquire(timeout=60)
            assert replacement.vm_id not in (a.vm_id, b.vm_id)
            assert len(_sandboxes()) >= 2
        assert _sandboxes() == []  # nothing left once the pool is closed
        assert list((tmp_path / "vms").glob("vm-*")) == []

    run(main(), timeout=240)


POOL = textwrap.dedent(
    """
    import asyncio, json, sys
    from guirl.vmpool.local import LocalProvider
    from guirl.vmpool.pool import VMPool

    async def main():
        pool = VMPool(LocalProvider(sys.argv[1], width=640, height=480), max_envs=2, prewarm=2)
        await pool.start()
        print(json.dumps(pool.metrics()), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_a_killed_pool_leaves_no_sandbox_and_its_vms_are_reaped(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    root = tmp_path / "vms"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert json.loads(proc.stdout.readline())["idle"] == 2
        sandboxes = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() in ("bwrap", "Xvfb")
        ]
        assert sandboxes
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        _, alive = psutil.wait_procs(sandboxes, timeout=30)
        assert alive == []  # the sandboxes die with the pool process
        assert len(list(root.glob("vm-*"))) == 2  # its directories remain, until the next start
        provider = LocalProvider(root)
        assert len(provider.reaped) == 2 and list(root.glob("vm-*")) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_idle_vms_beyond_the_prewarm_count_are_retired(tmp_path):
    provider = LocalProvider(tmp_path / "vms", width=640, height=480)

    async def main():
        async with VMPool(provider, max_envs=2, prewarm=1, idle_ttl_s=0.3, health_interval_s=0.2) as pool:
            a, b = await pool.acquire(), await pool.acquire()
            await pool.release(a.lease_id)
            await pool.release(b.lease_id)
            while pool.metrics()["retired"] < 1:
                await pool.wait_changed(30)
            m = pool.metrics()
            assert m["retired"] == 1 and m["idle"] == 1  # the pre-warmed one stays ready
            assert len(list((tmp_path / "vms").glob("vm-*"))) == 1

    run(main(), timeout=120)


def test_a_cancelled_release_still_resets_and_max_envs_holds(tmp_path):
    provider = LocalProvider(tmp_path / "vms", width=640, height=480)

    async def main():
        async with VMPool(provider, max_envs=1, health_interval_s=60) as pool:
            lease = await pool.acquire()
            release = asyncio.create_task(pool.release(lease.lease_id))
            await asyncio.sleep(0.05)  # the reset is under way
            release.cancel()
            again = await pool.acquire(timeout=60)  # the VM came back although its releaser gave up
            assert again.vm_id == lease.vm_id and pool.metrics()["resetting"] == 0
            assert len(list((tmp_path / "vms").glob("vm-*"))) == 1

    run(main(), timeout=120)
