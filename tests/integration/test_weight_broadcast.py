"""The learner → engine weight group over gloo: this test process is the learner's rank 0, a separate
(spawned) process runs the `hf` engine on the tiny Qwen3-VL and takes the broadcast through
`update_weights`; the weights it then serves are bit-identical to the ones sent. And a side whose peer
never comes fails within the group's timeout instead of hanging."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

import multiprocessing as mp
import socket
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from guirl.messages.weights import WeightsFromBroadcast
from guirl.weights.broadcast import (
    WeightGroupSpec,
    WeightGroupTimeout,
    WeightReceiver,
    WeightSender,
    state_digest,
)
from tests.helpers import shared_tiny

REPLY_TIMEOUT_S = 60.0  # a generous bound on any one step of the engine process (spawn + load ≈ 5 s)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny(tmp_path_factory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_process(ckpt: str, conn: Connection) -> None:
    """An `hf` engine in its own process, driven over `conn`: ("update", version, source) → ("updated",
    policy_version, digest of the served weights) or ("error", text); ("stop",) ends it."""
    import asyncio

    from guirl.inference.hf import HFEngine

    async def serve() -> None:
        engine = HFEngine("hf-remote", ckpt)
        await engine.start()
        try:
            # The test reads the served model's weights directly: nothing public exposes them, by design.
            conn.send(("ready", engine.policy_version, state_digest(engine._model.state_dict())))
            while True:
                command = await asyncio.to_thread(conn.recv)
                if command[0] == "stop":
                    return
                _, version, source = command
                try:
                    await engine.update_weights(version, source, rank=1)
                except Exception as exc:  # reported to the test, which fails on it
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
                    continue
                conn.send(("updated", engine.policy_version, state_digest(engine._model.state_dict())))
        finally:
            await engine.close()

    asyncio.run(serve())


def reply(conn: Connection) -> Any:
    if not conn.poll(REPLY_TIMEOUT_S):
        raise AssertionError(f"engine process silent for {REPLY_TIMEOUT_S:g} s")
    return conn.recv()


def perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 1e-3 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in state.items()}


def test_broadcast_lands_bit_identical_in_engine_process(ckpt: Path) -> None:
    from safetensors.torch import load_file

    spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=2, timeout_s=30)
    group = WeightsFromBroadcast(group=spec)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=engine_process, args=(str(ckpt), child_conn), daemon=True)
    proc.start()
    sender = WeightSender()
    try:
        tag, version, original = reply(conn)
        assert tag == "ready" and version == -1
        base = load_file(str(ckpt / "model.safetensors"))
        assert state_digest(base) == original  # the engine serves exactly the checkpoint, to start with
        # Small (bucket_bytes 64 KiB) buckets, so the tiny model travels both packed and in place.
        for new_version, seed in ((1, 1), (2, 2)):
            weights = perturbed(base, seed)
            # Tell the engine first: it joins (the first time) and waits in `receive` while we send;
            # `open` returns only once it has joined.
            conn.send(("update", new_version, group))
            if new_version == 1:
                sender.open(spec)
            stats = sender.broadcast(weights, new_version, bucket_bytes=64 << 10)
            assert stats.buckets > 1 and stats.tensors == len(weights)
            tag, version, digest = reply(conn)
            assert tag == "updated", digest if tag == "error" else tag
            assert version == new_version
            assert digest == state_digest(weights) != original
        conn.send(("stop",))
        proc.join(REPLY_TIMEOUT_S)
        assert proc.exitcode == 0
    finally:
        sender.close()
        if proc.is_alive():
            proc.kill()


def test_engine_rejects_a_broadcast_of_another_version(ckpt: Path) -> None:
    """An engine told version 3 that is sent version 5 refuses the weights (they would be mislabelled)
    and keeps serving the old ones; the group stays usable for the next update."""
    from safetensors.torch import load_file

    spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=2, timeout_s=30)
    group = WeightsFromBroadcast(group=spec)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=engine_process, args=(str(ckpt), child_conn), daemon=True)
    proc.start()
    sender = WeightSender()
    try:
        _, _, original = reply(conn)
        weights = perturbed(load_file(str(ckpt / "model.safetensors")), 7)
        conn.send(("update", 3, group))
        sender.open(spec)
        sender.broadcast(weights, 5)
        tag, text = reply(conn)
        assert tag == "error" and "sent version 5" in text
        conn.send(("update", 5, group))
        sender.broadcast(weights, 5)
        assert reply(conn) == ("updated", 5, state_digest(weights))
        conn.send(("stop",))
        proc.join(REPLY_TIMEOUT_S)
    finally:
        sender.close()
        if proc.is_alive():
            proc.kill()


def test_receiver_without_learner_times_out_after_the_join_time_not_the_transfer_time() -> None:
    spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=2, timeout_s=600, join_timeout_s=1.5)
    receiver = WeightReceiver()
    started = time.monotonic()
    with pytest.raises(WeightGroupTimeout, match=r"learner \(rank 0\) did not open it within 1.5 s"):
        receiver.open(spec, rank=1)
    assert time.monotonic() - started < 1.5 + 2.0


def test_sender_without_engines_times_out() -> None:
    spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=3, timeout_s=1.5)
    sender = WeightSender()
    started = time.monotonic()
    with pytest.raises(WeightGroupTimeout, match="engines did not join"):
        sender.open(spec)
    assert time.monotonic() - started < 1.5 + 2.0


def test_spec_round_trips_and_validates() -> None:
    spec = WeightGroupSpec("10.0.0.1", 29600, world_size=3, group_name="w", backend="gloo", timeout_s=5.0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=WeightGroupSpec) == spec
    with pytest.raises(ValueError, match=r"Expected `int`, got `str` - at `\$\.port`"):
        msgspec.convert({**msgspec.structs.asdict(spec), "port": "29600"}, WeightGroupSpec)
    with pytest.raises(ValueError, match="world_size"):
        WeightGroupSpec("h", 1, world_size=1)
    with pytest.raises(ValueError, match="rank must be in 1..2"):
        WeightReceiver().open(spec, rank=0)
