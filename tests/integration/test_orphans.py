"""Actors die with their supervisor, even when the supervisor is SIGKILLed (no orphaned actor processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

SUPERVISOR = textwrap.dedent(
    """
    import asyncio, json, sys
    import uvloop
    from guirl.runtime.process import ActorSpec
    from guirl.runtime.supervisor import Supervisor
    from tests.helpers import fast_config

    async def main():
        sup = Supervisor(fast_config())
        handles = [await sup.start(ActorSpec(name=f"echo{i}", target="guirl.actors.echo:EchoActor",
                                             bind=["tcp://127.0.0.1:0"])) for i in range(2)]
        print(json.dumps([h.pid for h in handles]), flush=True)
        await asyncio.Event().wait()  # until killed

    if __name__ == "__main__":
        uvloop.run(main())
    """
)


def test_actors_exit_when_their_supervisor_is_killed(tmp_path):
    children, alive = _kill_and_wait(tmp_path, SUPERVISOR)
    assert len(children) == 2
    assert alive == [], f"orphaned actors: {alive}"


def _kill_and_wait(tmp_path: Path, source: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Run `source` (it prints a JSON list of the pids it started, or one pid), SIGKILL it, and wait up to
    30 s for those processes to end: (all of them, those still alive). Any left are killed afterwards."""
    script = tmp_path / "parent.py"
    script.write_text(source)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    children: list[psutil.Process] = []
    try:
        pids = json.loads(proc.stdout.readline())
        children = [psutil.Process(pid) for pid in (pids if isinstance(pids, list) else [pids])]
        assert children and all(c.is_running() for c in children)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        _, alive = psutil.wait_procs(children, timeout=30)
        return children, alive
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in children:
            if c.is_running():
                c.kill()


LAUNCHER = textwrap.dedent(
    """
    import json, sys, time
    from guirl.inference.sglang_launch import LaunchSpec, spawn_server

    # an inference server as the sglang engine launches one (the command does not matter here: a sleeper)
    spec = LaunchSpec(model_path="m", command=[sys.executable, "-c", "import time; time.sleep(600)"])
    proc, url, _ = spawn_server(spec, "sglang0")
    print(json.dumps(proc.pid), flush=True)
    time.sleep(600)  # until killed
    """
)


def test_launched_inference_servers_exit_when_their_broker_is_killed(tmp_path):
    """A launched SGLang server holds GPUs: it must not outlive a broker SIGKILLed (own process group, so
    the group kill of a clean stop does not reach it; the parent-death signal does)."""
    _, alive = _kill_and_wait(tmp_path, LAUNCHER)
    assert alive == [], f"orphaned server: {alive}"
