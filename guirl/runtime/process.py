"""Running an actor as its own process: the spec that describes it and the spawned entry point.

Processes are started with the `spawn` method, never forked: a fork would copy live ZeroMQ sockets and
context threads. The child reports readiness (with its actual bound endpoints) over a multiprocessing
pipe, so the parent never sleeps to wait for it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import msgspec

from guirl.config import GuirlConfig
from guirl.proc import die_with_parent

log = logging.getLogger(__name__)


class ActorSpec(msgspec.Struct, kw_only=True):
    """What a supervisor needs to (re)start an actor process."""

    name: str
    """Actor name (unique in a cluster); also its log label."""
    target: str
    """`module:Class` of the actor."""
    bind: list[str] = []
    """Mailbox endpoints (`tcp://127.0.0.1:0` binds a random port, reported back when ready)."""
    options: dict[str, Any] = {}
    """Keyword arguments for the actor class beyond the runtime ones (msgpack-able values)."""
    record: bool = False
    """Record this actor's messages (overrides `recorder.enabled` when True)."""
    run_dir: str = ""
    """The run directory; message logs go under it unless `recorder.dir` says otherwise."""
    cpus: list[int] = []
    """CPU cores the process (and every process it starts) is pinned to; empty = no pinning."""
    env: dict[str, str] = {}
    """Environment variables set in the process before anything else runs (e.g. the learner's
    `CUDA_VISIBLE_DEVICES`, from the GPU placement)."""
    host: str = ""
    """The cluster host it runs on (its launcher starts it there); empty: a child of the supervisor."""


def resolve_target(target: str) -> type:
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"actor target {target!r} must be 'module:Class'")
    return getattr(importlib.import_module(module), attr)


def build_actor(spec: ActorSpec, cfg: GuirlConfig) -> Any:
    """Instantiate the actor of `spec` with its slice of the config (and a recorder if asked)."""
    cls = resolve_target(spec.target)
    recorder = None
    if spec.record or cfg.recorder.enabled:
        from guirl.msglog import Recorder

        directory = cfg.recorder.dir or os.path.join(spec.run_dir or ".", "msglogs")
        os.makedirs(directory, exist_ok=True)
        recorder = Recorder(
            directory,
            spec.name,
            actor=spec.name,
            rotate_bytes=cfg.recorder.rotate_bytes,
            directions=tuple(cfg.recorder.directions),
            sockets=tuple(cfg.recorder.sockets),
        )
    return cls(
        spec.name, runtime=cfg.runtime, codec=cfg.codec, bind=spec.bind, recorder=recorder, **spec.options
    )


def actor_main(spec_bytes: bytes, cfg_bytes: bytes, ready_conn: Any, parent_pid: int) -> None:
    """Entry point of a spawned actor process."""
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)
    spec = msgspec.msgpack.decode(spec_bytes, type=ActorSpec)
    cfg = msgspec.msgpack.decode(cfg_bytes, type=GuirlConfig)
    os.environ.update(spec.env)  # before torch (and CUDA) is imported
    if spec.cpus:  # before anything starts a thread pool sized by the cores it sees
        os.sched_setaffinity(0, spec.cpus)
    from guirl.log import setup_logging

    setup_logging(spec.name, level=cfg.logging.level, fmt=cfg.logging.format)
    actor = build_actor(spec, cfg)

    def ready(endpoints: list[str]) -> None:
        ready_conn.send_bytes(msgspec.msgpack.encode({"pid": os.getpid(), "endpoints": endpoints}))

    run_actor(actor, ready)
    # a clean exit says why, so the supervisor can tell "finished its work" from "was asked to stop"
    exit_info = {"exit": "completed" if actor.completed else "shutdown", "reason": actor.stop_reason}
    try:
        ready_conn.send_bytes(msgspec.msgpack.encode(exit_info))
        ready_conn.close()
    except OSError:  # the supervisor is gone
        pass


def run_actor(actor: Any, ready: Any = None) -> None:
    """Run one actor that owns this process (it handles SIGTERM/SIGINT) on uvloop until it shuts
    down; a crash exits the process with status 1."""
    import uvloop

    from guirl.runtime.errors import FatalError

    try:
        uvloop.run(actor.run(ready, handle_signals=True))
    except FatalError as exc:  # a clear, expected failure (e.g. the port is taken): no traceback
        log.error("%s", exc)
        logging.shutdown()
        os._exit(1)
    except BaseException:
        log.exception("actor %s crashed", actor.name)
        logging.shutdown()
        os._exit(1)
    logging.shutdown()
