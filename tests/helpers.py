"""Shared test helpers: fast runtime settings, an in-process client actor, running coroutines on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import subprocess
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import uvloop

from guirl.config import GuirlConfig, load_config
from guirl.runtime.base import Actor

FAST = [
    "runtime.heartbeat_interval_s=0.2",
    "runtime.heartbeat_liveness=3",
    "runtime.reconnect_backoff_initial_s=0.05",
    "runtime.reconnect_backoff_max_s=0.5",
    "runtime.request_timeout_s=10",
    "supervisor.restart_backoff_initial_s=0.1",
    "supervisor.start_timeout_s=60",
    "logging.level=WARNING",
]


def fast_config(*overrides: str) -> GuirlConfig:
    """A config with short heartbeats and backoffs, so failure detection happens in test time."""
    return load_config(env={}, overrides=[*FAST, *overrides])


def run(coro: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
    """Run a coroutine on uvloop with an overall deadline (a hang fails the test, never blocks CI)."""

    async def guarded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return uvloop.run(guarded())


@contextlib.asynccontextmanager
async def client_actor(
    cfg: GuirlConfig, name: str = "client", *, cls: type = Actor, **kwargs: Any
) -> AsyncIterator[Any]:
    """A running actor of `cls` in this process (no mailbox unless `bind=` is given), shut down on exit."""
    actor = cls(name, runtime=cfg.runtime, codec=cfg.codec, **kwargs)
    task = await actor.start()
    try:
        yield actor
    finally:
        actor.request_shutdown("test done")
        await asyncio.wait_for(task, 15)


# -- W&B offline runs ------------------------------------------------------------------------------------


def read_records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` transaction log, decoded with wandb's own protobuf schema.

    The file is a 7-byte header (``:W&B``, magic 0xBEE1, version 0) followed by LevelDB's log format:
    32 KiB blocks of chunks, each ``crc32c u32 | length u16 | type u8 | data`` (type 1 = a whole record,
    2/3/4 = its first/middle/last piece). wandb 0.31 ships no Python reader, so this is one.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, pieces, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pieces = b""
        pieces += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            out.append(record)
    return out


def history(records: list[Any]) -> list[dict[str, Any]]:
    """Each logged step as ``{key: value}`` (wandb's own ``_step``/``_runtime``/``_timestamp`` included)."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in items})
    return rows


# -- learner fixtures -------------------------------------------------------------------------------------


def one_step_trajectory(
    group: int,
    index: int,
    prompt: list[int],
    response: list[int],
    *,
    reward: float,
    policy_version: int,
    images: tuple[bytes, ...] | list[bytes] = (),
) -> Any:
    """A completed one-step episode `ep<group><index>` of task `t<group>` (group `t<group>@<group>`), with
    made-up behaviour log-probs, as an env worker would send it to the learner."""
    from guirl.messages.blob import Blob
    from guirl.messages.types import Image, StepSample, Tensor, Trajectory

    step = StepSample(
        step=0,
        prompt_ids=Tensor.from_list(prompt),
        response_ids=Tensor.from_list(response),
        logprobs=Tensor.from_list([-6.5 - 0.1 * k for k in range(len(response))], "float32"),
        images=[Image(data=Blob(png)) for png in images],
        policy_version=policy_version,
    )
    return Trajectory(
        episode_id=f"ep{group}{index}",
        task_id=f"t{group}",
        group_id=f"t{group}@{group}",
        sample_index=index,
        status="completed",
        reward=reward,
        steps=[step],
        score=1.0 if reward > 0 else 0.0,
    )


class ServedInThread:
    """A loopback fake (anything with async `start` / `close`) served on an event loop of its own thread,
    for the length of a `with` block in which a subprocess (a `guirl` command) talks to it."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake

    def __enter__(self) -> Any:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(30)
        return self.fake

    def call(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on the fake's loop (its state is only touched there)."""
        import asyncio

        async def on_loop() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result(30)

    def __exit__(self, *exc: object) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.fake.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def osworld_dir() -> Path | None:
    """OSWorld's files beside the checkout (`../shared/osworld`: its task suite and its VM server), or
    `GUIRL_OSWORLD_DIR`. A clone made from a checkout on this machine finds them beside its origin."""
    root = Path(__file__).resolve().parents[1]
    candidates = [Path(os.environ["GUIRL_OSWORLD_DIR"])] if os.environ.get("GUIRL_OSWORLD_DIR") else []
    candidates += [root.parent / "shared" / "osworld", root / "shared" / "osworld"]
    try:
        origin = subprocess.run(
            ["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared" / "osworld")
    return next((c for c in candidates if (c / "server" / "main.py").is_file()), None)


CLOUD_ENV = {  # what the osworld configs' Volcengine desktops need from the environment (fake values)
    "GUI_CLUSTER_CIDR": "10.0.0.0/16",
    "VOLC_ACCESSKEY": "AK-test",
    "VOLC_SECRETKEY": "SK-test",
    "VOLCENGINE_IMAGE_ID": "image-osworld",
    "VOLCENGINE_SUBNET_ID": "subnet-1",
    "VOLCENGINE_SECURITY_GROUP_ID": "sg-1",
    # and their task lists, which come from an OSWorld checkout: the shipped local suite stands in
    "GUI_EVAL_TASKS": str(Path(__file__).resolve().parents[1] / "tasks" / "local" / "test.json"),
    "GUI_TRAIN_TASKS": str(Path(__file__).resolve().parents[1] / "tasks" / "local" / "train.json"),
}


def sharp_tiny_checkpoint(root: Path, factor: float = 20.0) -> Path:
    """The tiny checkpoint with its LM head scaled by `factor`. The random tiny model is nearly uniform (every
    log-prob about -log V = -6.9, +-0.2): a scorer or an update could pass by flatness, and its greedy answer
    flips with any update; scaled, its log-probs spread over 0 .. -5 as a trained model's do."""
    import shutil

    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from guirl.model.tiny import ensure_tiny_checkpoint

    base = ensure_tiny_checkpoint(root / "tiny-qwen3vl")
    sharp = root / "tiny-sharp"
    shutil.copytree(base, sharp)
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(base), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    model.save_pretrained(sharp)
    return sharp


def shared_tiny(tmp_path_factory: Any, *, thinking: bool = False) -> Path:
    """The tiny checkpoint (`guirl.model.tiny`), built once for the whole test run: in the run's base temp
    directory, which both xdist workers share (building it takes ~8 s of CPU; ensure_tiny_checkpoint settles
    two builders racing). Tests only read it."""
    from guirl.model.tiny import ensure_tiny_checkpoint

    base = tmp_path_factory.getbasetemp()
    if base.name == f"popen-{os.environ.get('PYTEST_XDIST_WORKER')}":
        base = base.parent  # <basetemp>/popen-gwN: the run's root, shared by its workers
    name = "tiny-qwen3vl-thinking" if thinking else "tiny-qwen3vl"
    return ensure_tiny_checkpoint(base / name, thinking=thinking)
