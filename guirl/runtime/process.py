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
from guirl.errors import InputError
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
    """The actor's typed options (its class's `Options`) as msgpack-able values; checked by the supervisor
    before the process starts (`check_options`)."""
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


class ActorOptionsError(InputError):
    """An actor spec's options do not fit the actor's `Options`: the message names the actor and the key."""


def check_options(spec: ActorSpec, *, strict: bool = True) -> Any:
    """`spec.options` as the actor's typed `Options` (None for an actor that takes none), checked where the
    spec is made, before any process starts; ActorOptionsError naming the key otherwise. `strict=False`
    also takes numbers and flags written as strings (a command line's)."""
    try:
        cls = resolve_target(spec.target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ActorOptionsError(f"actor {spec.name}: cannot load {spec.target!r}: {exc}") from None
    options_type = getattr(cls, "Options", None)
    if options_type is None:
        if spec.options:
            raise ActorOptionsError(
                f"actor {spec.name} ({spec.target}) takes no options, got {', '.join(sorted(spec.options))}"
            )
        return None
    try:
        return msgspec.convert(spec.options, options_type, strict=strict)
    except msgspec.ValidationError as exc:
        raise ActorOptionsError(f"actor {spec.name} ({spec.target}): {_explain_option(str(exc))}") from None


def _explain_option(message: str) -> str:
    """msgspec's "Object contains unknown field `x` - at `$.a`" / "Expected `int`, got `str` - at `$.a`" as
    "unknown option a.x" / "option a: expected `int`, got `str`"."""
    reason, _, at = message.partition(" - at `$")
    path = at.rstrip("`").lstrip(".")
    if reason.startswith("Object contains unknown field `"):
        field = reason.split("`")[1]
        return f"unknown option {'.'.join(p for p in (path, field) if p)!r}"
    if reason.startswith("Object missing required field `"):
        field = reason.split("`")[1]
        return f"missing option {'.'.join(p for p in (path, field) if p)!r}"
    reason = reason[:1].lower() + reason[1:]
    return f"option {path!r}: {reason}" if path else reason


def build_actor(spec: ActorSpec, cfg: GuirlConfig) -> Any:
    """Instantiate the actor of `spec` with its typed options and its slice of the config (and a recorder
    if asked)."""
    cls = resolve_target(spec.target)
    options = check_options(spec)
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
    runtime = {"runtime": cfg.runtime, "codec": cfg.codec, "bind": spec.bind, "recorder": recorder}
    return cls(spec.name, **runtime) if options is None else cls(spec.name, options, **runtime)


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
