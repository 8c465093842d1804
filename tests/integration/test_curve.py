"""CURVE encryption with ZAP authentication on actor sockets (`runtime.curve_keys_dir`), and
`guirl keys init`: a peer without the cluster's keys gets no message accepted, and is counted."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from guirl.actors.echo import EchoActor
from guirl.cli import main as guirl
from guirl.messages import Blob, Codec, DiagChannel, IdGen, make_header
from guirl.messages.types import Echo, EchoReply, StatsReply, StatsRequest
from guirl.runtime.base import Actor
from guirl.runtime.errors import PeerDead, RequestTimeout
from guirl.runtime.process import ActorSpec
from guirl.runtime.security import KeysError, load_keys
from guirl.runtime.supervisor import Supervisor
from tests.helpers import client_actor, fast_config, run


def _keys(tmp_path: Path, name: str = "keys") -> Path:
    path = tmp_path / name
    assert guirl(["keys", "init", str(path)]) == 0
    return path


def _curve_config(keys: Path, *overrides: str):
    return fast_config(f'runtime.curve_keys_dir="{keys}"', *overrides)


def _echo_server(cfg, bind: str = "tcp://127.0.0.1:0"):
    """An echo actor serving on `bind`, in this process."""
    return client_actor(cfg, "echo", cls=EchoActor, bind=[bind])


async def _until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll `condition()` (cheap, in-process) until true; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _stranger(ctx: zmq.Context, endpoint: str, *, public=None, secret=None, server=None) -> zmq.Socket:
    """A raw DEALER that sends one well-formed Echo request: CURVE when keys are given, plain otherwise."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.connect(endpoint)
    codec = Codec()
    sock.send_multipart([b"", *codec.encode(make_header(IdGen(), "stranger"), Echo(text="let me in"))])
    return sock


# -- the happy path ----------------------------------------------------------------------------------


def test_requests_work_between_spawned_actors_with_curve(tmp_path):
    """The key directory travels in the config to a spawned actor; its mailbox serves CURVE clients."""
    cfg = _curve_config(_keys(tmp_path))

    async def main():
        async with Supervisor(cfg) as sup, client_actor(cfg) as client:
            echo = await sup.start(
                ActorSpec(name="echo", target="guirl.actors.echo:EchoActor", bind=["tcp://127.0.0.1:0"])
            )
            conn = client.connect("echo", echo.endpoints[0], DiagChannel)
            payload = os.urandom(100_000)
            reply = await conn.request(Echo(text="hi", blobs=[Blob(payload)], return_blobs=True), timeout=10)
            assert isinstance(reply, EchoReply) and bytes(reply.blobs[0]) == payload
            stats = await conn.request(StatsRequest(), timeout=10)
            assert isinstance(stats, StatsReply)
            assert stats.counters["security.accepted"] >= 1 and stats.counters["handled"] == 1
            assert stats.counters.get("security.refused", 0) == 0
            assert stats.counters.get("security.handshake_failed", 0) == 0

    run(main(), timeout=60)


def test_requests_work_over_ipc_with_curve(tmp_path):
    cfg = _curve_config(_keys(tmp_path))

    async def main():
        async with _echo_server(cfg, f"ipc://{tmp_path}/echo.sock") as server, client_actor(cfg) as client:
            conn = client.connect("echo", server.endpoints[0], DiagChannel)
            assert (await conn.request(Echo(text="over ipc"), timeout=10)).text == "over ipc"
            assert server.counters["security.accepted"] >= 1

    run(main(), timeout=30)


# -- peers without the cluster's keys ----------------------------------------------------------------


def test_an_unauthorized_key_gets_nothing_accepted_and_is_counted(tmp_path, caplog):
    """A CURVE client that knows the server's public key but holds its own keypair: refused by ZAP."""
    keys = _keys(tmp_path)
    cfg = _curve_config(keys)
    cluster_public = load_keys(keys).public

    async def main():
        ctx = zmq.Context()
        async with _echo_server(cfg) as server:
            endpoint = server.endpoints[0]
            # two strangers from one address: both refused and counted, the address logged once
            strangers = []
            for _ in range(2):
                public, secret = zmq.curve_keypair()
                strangers.append(
                    _stranger(ctx, endpoint, public=public, secret=secret, server=cluster_public)
                )
            await _until(lambda: server.counters["security.refused"] >= 2, "two ZAP refusals")
            for sock in strangers:
                assert not await asyncio.to_thread(sock.poll, 300), "a refused peer got an answer"
            assert server.counters["frames_in"] == 0 and server.counters["handled"] == 0
            assert not server.mailbox.peers
            # the refusals show in the StatsReply an authorized client gets
            async with client_actor(cfg) as client:
                conn = client.connect("echo", endpoint, DiagChannel)
                stats = await conn.request(StatsRequest(), timeout=10)
                assert stats.counters["security.refused"] >= 2 and stats.counters["security.accepted"] >= 1
                assert stats.peers == [conn.identity.decode()]
            for sock in strangers:
                sock.close(linger=0)
        ctx.term()

    with caplog.at_level(logging.WARNING, logger="guirl.runtime.security"):
        run(main(), timeout=30)
    refusals = [r for r in caplog.records if "refused a CURVE peer at 127.0.0.1" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    assert str(keys / "authorized") in refusals[0].getMessage()


@pytest.mark.parametrize("kind", ["plain", "wrong_server_key"])
def test_a_peer_that_cannot_do_the_handshake_gets_nothing_accepted(tmp_path, kind):
    """A plain-text DEALER, and a DEALER holding the authorized client key but a wrong server key."""
    keys = load_keys(_keys(tmp_path))
    cfg = _curve_config(keys.path)

    async def main():
        ctx = zmq.Context()
        async with _echo_server(cfg) as server:
            if kind == "plain":
                sock = _stranger(ctx, server.endpoints[0])
            else:
                wrong_server, _ = zmq.curve_keypair()
                sock = _stranger(
                    ctx, server.endpoints[0], public=keys.public, secret=keys.secret, server=wrong_server
                )
            await _until(lambda: server.counters["security.handshake_failed"] >= 1, "a failed handshake")
            assert not await asyncio.to_thread(sock.poll, 300), "a peer without the keys got an answer"
            assert server.counters["frames_in"] == 0 and not server.mailbox.peers
            assert server.counters.get("security.accepted", 0) == 0
            sock.close(linger=0)
        ctx.term()

    run(main(), timeout=30)


def test_an_actor_of_another_cluster_never_connects(tmp_path):
    """Another cluster's actor has the wrong server key and an unauthorized client key: its requests
    fail (timeout, then the peer is declared never reached), and nothing reaches the server."""
    cfg = _curve_config(_keys(tmp_path, "ours"))
    other = _curve_config(_keys(tmp_path, "theirs"))

    async def main():
        async with _echo_server(cfg) as server, client_actor(other, "intruder") as intruder:
            conn = intruder.connect("echo", server.endpoints[0], DiagChannel)
            with pytest.raises((RequestTimeout, PeerDead)):
                await conn.request(Echo(text="let me in"), timeout=1.0)
            assert conn.state != "alive"
            assert server.counters["security.handshake_failed"] >= 1
            assert server.counters["frames_in"] == 0 and not server.mailbox.peers

    run(main(), timeout=30)


def test_an_actor_with_a_missing_key_directory_does_not_start(tmp_path):
    cfg = _curve_config(tmp_path / "nowhere")

    async def main():
        actor = Actor("lost", runtime=cfg.runtime, codec=cfg.codec, bind=["tcp://127.0.0.1:0"])
        with pytest.raises(KeysError, match="does not exist; create it with `guirl keys init"):
            await actor.start()

    run(main(), timeout=30)


# -- guirl keys init ---------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_init_modes_and_no_overwrite(tmp_path, capsys):
    path = _keys(tmp_path)
    assert _mode(path) == 0o700 and _mode(path / "authorized") == 0o700
    assert _mode(path / "cluster.key_secret") == 0o600
    keys = load_keys(path)
    assert z85.decode(keys.public) in keys.authorized and len(keys.authorized) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["keys"]  # no temporary directory left behind
    capsys.readouterr()

    assert guirl(["keys", "init", str(path)]) == 1
    assert "already exists and is not empty; use --force" in capsys.readouterr().err
    assert load_keys(path).public == keys.public  # untouched

    assert guirl(["keys", "init", str(path), "--force"]) == 0
    renewed = load_keys(path)
    assert renewed.public != keys.public and _mode(path / "cluster.key_secret") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys"]

    (tmp_path / "file").write_text("x")
    assert guirl(["keys", "init", str(tmp_path / "file")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def _break(path: Path, how: str) -> str:
    """Damage a fresh key directory one way; returns the error expected."""
    secret = path / "cluster.key_secret"
    match how:
        case "no_secret":
            secret.unlink()
            return "cluster.key_secret is missing or unreadable"
        case "no_public":
            (path / "cluster.key").unlink()
            return "cluster.key is missing"
        case "open_secret":
            secret.chmod(0o644)
            return r"readable by other users .*chmod 600"
        case "short_secret":
            text = secret.read_text()
            key = zmq.auth.load_certificate(secret)[1].decode()
            secret.write_text(text.replace(key, key[:20]))
            return "the secret key is not a 40-character Z85 CURVE key"
        case "no_key_line":
            secret.write_text("# nothing here\n")
            return "not a readable ZeroMQ certificate: No public key found"
        case "mismatched":
            _, other_secret = zmq.curve_keypair()
            text = secret.read_text()
            key = zmq.auth.load_certificate(secret)[1].decode()
            secret.write_text(text.replace(key, other_secret.decode()))
            return "the secret key does not belong to the public key"
        case "no_authorized":
            for p in (path / "authorized").iterdir():
                p.unlink()
            (path / "authorized").rmdir()
            return "authorized is missing"
        case "empty_authorized":
            (path / "authorized" / "cluster.key").unlink()
            return r"holds no public keys \(\*\.key\)"
        case "bad_authorized":
            (path / "authorized" / "worker.key").write_text('public-key = "not a key"\n')
            return "worker.key: the public key is not a 40-character Z85 CURVE key"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "no_secret",
        "no_public",
        "open_secret",
        "short_secret",
        "no_key_line",
        "mismatched",
        "no_authorized",
        "empty_authorized",
        "bad_authorized",
    ],
)
def test_a_damaged_key_directory_is_a_clear_error(tmp_path, how):
    path = _keys(tmp_path)
    expected = _break(path, how)
    with pytest.raises(KeysError, match=expected):
        load_keys(path)
