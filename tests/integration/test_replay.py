"""Record a multi-actor exchange with screenshots, replay it into a fresh actor, compare what it received."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import msgpack

from guirl.messages import Blob, DiagChannel
from guirl.messages.types import Echo
from guirl.msglog import LogReader, Recorder
from guirl.runtime.process import ActorSpec
from guirl.runtime.replay import replay_to
from guirl.runtime.supervisor import Supervisor
from tests.helpers import client_actor, fast_config, run

ECHO = "guirl.actors.echo:EchoActor"
ROOT = Path(__file__).resolve().parents[2]


def _received(log_dir: Path) -> list[tuple]:
    """What the echo actor received, in order: (type, text, blob hashes)."""
    reader = LogReader([log_dir])
    out = [
        (r.type, r.body.get("text"), tuple(r.blobs))
        for r in reader
        if r.actor == "echo" and r.direction == "in"
    ]
    assert reader.warnings == []
    return out


def _record_exchange(cfg, run_dir: Path, screens: list[bytes]) -> None:
    async def main():
        async with Supervisor(cfg, run_dir=str(run_dir)) as sup:
            echo = await sup.start(
                ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], record=True)
            )
            recorders = [Recorder(run_dir / "msglogs", f"client{i}", actor=f"client{i}") for i in range(2)]
            async with (
                client_actor(cfg, "client0", recorder=recorders[0]) as c0,
                client_actor(cfg, "client1", recorder=recorders[1]) as c1,
            ):
                conns = [c.connect("echo", echo.endpoints[0], DiagChannel) for c in (c0, c1)]
                for step, png in enumerate(screens):
                    # the two clients alternate, one request at a time, so the arrival order is known
                    conn = conns[step % 2]
                    await conn.request(Echo(text=f"step {step}", blobs=[Blob(png)], return_blobs=False))

    run(main())


def test_replay_reproduces_the_received_stream(tmp_path):
    cfg = fast_config()
    distinct = [os.urandom(20_000 + 1000 * i) for i in range(3)]
    screens = [distinct[i % 3] for i in range(12)]  # 3 distinct screenshots, 12 uses
    _record_exchange(cfg, tmp_path / "a", screens)
    original = _received(tmp_path / "a" / "msglogs")
    assert [t for t, _, _ in original] == ["echo"] * 12
    assert [text for _, text, _ in original] == [f"step {i}" for i in range(12)]
    # every actor wrote its own log; a screenshot is stored once per segment
    reader = LogReader([tmp_path / "a" / "msglogs"])
    records = list(reader)
    assert {r.actor for r in records} == {"echo", "client0", "client1"}
    hashes = {h for _, _, hs in original for h in hs}
    assert len(hashes) == 3 and {reader.blob(h) for h in hashes} == set(distinct)
    echo_segments = sorted((tmp_path / "a" / "msglogs").glob("echo.*.msglog"))
    assert len(echo_segments) == 1
    blob_records = [
        i
        for i in msgpack.Unpacker(open(echo_segments[0], "rb"), raw=False, strict_map_key=False)
        if isinstance(i, dict) and i.get("k") == "blob"
    ]
    assert len(blob_records) == 3  # each screenshot written once

    async def replay_into_fresh_actor():
        async with Supervisor(cfg, run_dir=str(tmp_path / "b")) as sup:
            fresh = await sup.start(
                ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], record=True)
            )
            selected = [r for r in records if r.actor == "echo" and r.direction == "in"]
            report = await asyncio.to_thread(replay_to, reader, selected, fresh.endpoints[0], speed=0)
            assert report.sent == 12 and report.replies["EchoReply"] == 12 and report.unanswered == 0

    run(replay_into_fresh_actor())
    assert _received(tmp_path / "b" / "msglogs") == original

    # an actor that admits only the cluster's CURVE keys: answered with them, refused without
    from guirl.runtime.security import init_keys

    keys = init_keys(tmp_path / "keys").path
    secured = fast_config(f'runtime.curve_keys_dir="{keys}"')

    async def replay_into_secured_actor():
        async with Supervisor(secured, run_dir=str(tmp_path / "c")) as sup:
            actor = await sup.start(ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"]))
            selected = [r for r in records if r.actor == "echo" and r.direction == "in"][:3]
            send = replay_to
            plain = await asyncio.to_thread(send, reader, selected, actor.endpoints[0], speed=0, wait_s=1.0)
            assert plain.replies == {} and plain.unanswered == 3
            keyed = await asyncio.to_thread(
                send, reader, selected, actor.endpoints[0], speed=0, keys_dir=str(keys)
            )
            assert keyed.replies["EchoReply"] == 3 and keyed.unanswered == 0

    run(replay_into_secured_actor())

    # an endpoint nobody serves: the replay stops once the send queue is full, says so, and returns
    nobody = f"ipc://{tmp_path}/nobody.sock"
    many = [r for r in records if r.actor == "echo" and r.direction == "in"] * 200  # 2,400 > the HWM
    report = replay_to(reader, many, nobody, speed=0, wait_s=0.5)
    assert report.unsent > 0 and report.sent + report.unsent == len(many)


def test_replay_cli_and_truncated_log(tmp_path):
    cfg = fast_config()
    screens = [b"\x89PNG\r\n\x1a\n" + os.urandom(5000) for _ in range(4)]
    _record_exchange(cfg, tmp_path, screens)
    logs = tmp_path / "msglogs"
    replay = [sys.executable, str(ROOT / "bin" / "replay")]
    out = subprocess.run(
        [*replay, str(logs), "--type", "echo", "--dir", "in"], capture_output=True, text=True, check=True
    )
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4 and all(" echo " in line and "from=client" in line for line in lines)
    everything = subprocess.run([*replay, str(logs)], capture_output=True, text=True, check=True)
    n_all = len(everything.stdout.strip().splitlines())
    assert n_all == 16  # 4 requests and 4 replies, each recorded at both ends
    first = int(lines[0].split()[0])
    shown = subprocess.run(
        [*replay, "show", str(logs), "-n", str(first)], capture_output=True, text=True, check=True
    )
    assert '"text": "step 0"' in shown.stdout
    exported = subprocess.run(
        [*replay, "export", str(logs), "--type", "echo", "--dir", "in", "--out", str(tmp_path / "shots")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote 4 screenshots" in exported.stdout
    assert sorted(p.read_bytes() for p in (tmp_path / "shots").iterdir()) == sorted(screens)

    # plain msgpack reads the log: [len, crc] prefixes alternating with records
    segment = sorted(logs.glob("echo.*.msglog"))[0]
    items = list(msgpack.Unpacker(open(segment, "rb"), raw=False, strict_map_key=False))
    assert items[1]["k"] == "meta" and any(isinstance(i, dict) and i.get("k") == "msg" for i in items)

    # cut the last record short, as a kill mid-write would: earlier records survive, with a warning
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])
    cut = subprocess.run([*replay, str(logs)], capture_output=True, text=True, check=True)
    assert len(cut.stdout.strip().splitlines()) == n_all - 1
    assert "warning" in cut.stderr and "echo" in cut.stderr

    bad = subprocess.run([*replay, str(tmp_path / "nope.msglog")], capture_output=True, text=True)
    assert bad.returncode != 0 and "nope.msglog" in bad.stderr
