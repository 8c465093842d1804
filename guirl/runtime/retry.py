"""Jittered exponential backoff for idempotent calls (never wrap a call that changes state twice)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def backoff_delays(initial: float, cap: float, *, jitter: float = 0.5, rng: random.Random | None = None):
    """Infinite delays: initial, 2×, 4× … capped at `cap`, each scaled by a factor in [1-jitter, 1]."""
    rng = rng or random.Random()
    delay = initial
    while True:
        yield delay * (1.0 - jitter * rng.random())
        delay = min(delay * 2.0, cap)


async def retry_idempotent(
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    initial: float = 0.1,
    cap: float = 5.0,
    is_transient: Callable[[BaseException], bool] = lambda e: getattr(e, "transient", False),
) -> T:
    """Run `call` until it succeeds, retrying transient errors up to `attempts` times in all."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    delays = backoff_delays(initial, cap)
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            await asyncio.sleep(next(delays))
    raise AssertionError("unreachable: the last attempt returns or raises")
