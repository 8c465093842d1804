"""Shared test helpers: fast runtime settings, an in-process client actor, running coroutines on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import uvloop

from guirl.actors.base import Actor
from guirl.config import GuirlConfig, load_config

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
async def client_actor(cfg: GuirlConfig, name: str = "client", **kwargs: Any) -> AsyncIterator[Actor]:
    """A running actor in this process (no mailbox unless `bind=` is given), shut down on exit."""
    actor = Actor(name, runtime=cfg.runtime, codec=cfg.codec, **kwargs)
    task = await actor.start()
    try:
        yield actor
    finally:
        actor.request_shutdown("test done")
        await asyncio.wait_for(task, 15)
