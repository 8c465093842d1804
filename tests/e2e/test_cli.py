"""The real commands on tiny budgets: `guirl demo`, `guirl config`, `guirl actor run`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import zmq

from guirl.messages import DiagChannel, IdGen, make_header
from guirl.messages.codec import Codec
from guirl.messages.types import Echo, EchoReply

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_KEY", "GUI_RESULT_DIR")}
    env.update(extra)
    return env


def test_demo_end_to_end(tmp_path):
    cmd = [
        *GUIRL,
        "demo",
        "--set",
        f"run.root_dir={tmp_path}",
        "--set",
        "demo.workers=2",
        "--set",
        "demo.episodes=2",
        "--set",
        "demo.steps=4",
        "--set",
        "logging.level=WARNING",
        "--set",
        "runtime.heartbeat_interval_s=0.25",
        "--set",  # endpoints come from config; an ipc mailbox survives the broker's restart too
        f"endpoints.broker=ipc://{tmp_path}/broker.sock",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(WANDB_KEY="sekret-123"))
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] == {"completed": 4} and summary["steps"] == 16
    events = summary["supervisor_events"]
    assert "exited:broker" in events and "restarted:broker" in events
    assert all(f"completed:worker{i}" in events for i in range(2))
    assert summary["recorded_messages"]["echo"] >= 16 and summary["log_warnings"] == []
    config = (run_dir / "config.toml").read_text()
    assert "sekret-123" not in config  # secrets never reach the run directory
    assert tomllib.loads(config)["demo"]["steps"] == 4
    assert not (tmp_path / "broker.sock").exists()  # the ipc socket file is gone with the broker
    assert "SIGKILLed the broker" in out.stdout and "restarted the broker" in out.stdout
    # two local VMs played two shipped tasks with their reference solutions
    desktops = summary["desktops"]
    assert [e["score"] for e in desktops["episodes"]] == [1.0, 1.0]
    assert len({e["vm"] for e in desktops["episodes"]}) == 2 and desktops["pool"]["replaced"] == 0
    assert out.stdout.count("scored 1.0") == 2
    listed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bin" / "replay"),
            str(run_dir / "msglogs"),
            "--type",
            "episode_ended",
            "--dir",
            "in",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0 and len(listed.stdout.strip().splitlines()) == 4


def test_config_errors_are_clear():
    bad = subprocess.run(
        [*GUIRL, "config", "show", "--set", "runtime.heartbeat_interval_s=-1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert bad.returncode == 2 and "runtime.heartbeat_interval_s" in bad.stderr and "--set" in bad.stderr
    typo = subprocess.run(
        [*GUIRL, "config", "show", "--set", "runtime.heartbeat_intervall=1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert typo.returncode == 2 and "heartbeat_intervall" in typo.stderr
    env_bad = subprocess.run(
        [*GUIRL, "config", "show"], capture_output=True, text=True, timeout=60, env=_env(NUM_GPUS="eight")
    )
    assert env_bad.returncode == 2 and "NUM_GPUS" in env_bad.stderr
    good = subprocess.run(
        [*GUIRL, "config", "show"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(GUI_POOL_MAX_ENVS="16"),
    )
    assert good.returncode == 0 and tomllib.loads(good.stdout)["env"]["max_envs"] == 16
    described = subprocess.run(
        [*GUIRL, "config", "show", "--describe"], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert "[env HF_CKPT]" in described.stdout and "runtime.heartbeat_liveness" in described.stdout


def test_actor_run_serves_until_sigterm():
    proc = subprocess.Popen(
        [
            *GUIRL,
            "actor",
            "run",
            "guirl.actors.echo:EchoActor",
            "--name",
            "echo",
            "--bind",
            "tcp://127.0.0.1:0",
            "--set",
            "logging.level=WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] == "echo"
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ready["endpoints"][0])
        codec = Codec()
        sock.send_multipart([b"", *codec.encode(make_header(IdGen(), "test"), Echo(text="hello"))])
        while True:
            assert sock.poll(10_000), "no reply from the actor"
            _, msg = codec.decode(sock.recv_multipart()[1:], DiagChannel)
            if isinstance(msg, EchoReply):
                break
        assert msg.text == "hello"
        sock.close(linger=0)
        ctx.term()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_actor_run_takes_typed_options_and_refuses_a_misspelled_one():
    base = [*GUIRL, "actor", "run", "guirl.actors.demo:DemoWorker", "--name", "w"]
    done = subprocess.run(
        [
            *base,
            "--option",
            "coordinator=tcp://127.0.0.1:1",
            "--option",
            "broker=tcp://127.0.0.1:2",
            "--option",
            "widht=640",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert (
        done.returncode == 2
        and "actor w (guirl.actors.demo:DemoWorker): unknown option 'widht'" in done.stderr
    )
    done = subprocess.run(
        [*base, "--option", "coordinator=tcp://127.0.0.1:1", "--option", "width=wide"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert done.returncode == 2 and "option 'width': expected `int`, got `str`" in done.stderr
