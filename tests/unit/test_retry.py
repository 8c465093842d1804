"""Jittered exponential backoff, retries of idempotent calls, and drop counters."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from guirl.runtime.errors import (
    ActorError,
    FatalError,
    Overloaded,
    PeerDead,
    RemoteError,
    RequestTimeout,
    TransientError,
)
from guirl.runtime.retry import backoff_delays, retry_idempotent
from guirl.runtime.stats import Counters

TINY = 1e-4


def take(n: int, delays) -> list[float]:
    return list(itertools.islice(delays, n))


# --- backoff_delays -------------------------------------------------------------------------------


def test_backoff_without_jitter_doubles_to_the_cap() -> None:
    delays = take(7, backoff_delays(0.1, 1.0, jitter=0.0))
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("jitter", [0.25, 0.5, 1.0])
def test_backoff_jitter_scales_each_delay_into_range(jitter: float) -> None:
    nominal = [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0, 2.0]
    delays = take(len(nominal), backoff_delays(0.1, 2.0, jitter=jitter, rng=random.Random(7)))
    for d, n in zip(delays, nominal):
        assert (1.0 - jitter) * n <= d <= n
    # Exactly the seeded factors, so the schedule is reproducible.
    ref = random.Random(7)
    assert delays == pytest.approx([n * (1.0 - jitter * ref.random()) for n in nominal])
    assert delays != pytest.approx(nominal)  # the jitter is actually applied


def test_backoff_is_reproducible_with_a_seed_and_varies_without() -> None:
    a = take(20, backoff_delays(1.0, 8.0, rng=random.Random(1)))
    b = take(20, backoff_delays(1.0, 8.0, rng=random.Random(1)))
    c = take(20, backoff_delays(1.0, 8.0, rng=random.Random(2)))
    assert a == b and a != c
    assert max(a) <= 8.0 and min(a) >= 0.5


# --- retry_idempotent -----------------------------------------------------------------------------


class Flaky:
    """An idempotent call that raises the given errors in order, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def run(call: Flaky, **kw) -> str:
    return asyncio.run(retry_idempotent(call, initial=TINY, cap=TINY * 4, **kw))


def test_success_first_time_calls_once() -> None:
    call = Flaky()
    assert run(call) == "ok" and call.calls == 1


@pytest.mark.parametrize(
    "error",
    [
        TransientError("x"),
        RequestTimeout("slow"),
        PeerDead("gone"),
        Overloaded("full"),
        RemoteError("overloaded", "queue full", retryable=True, peer="broker"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_errors_are_retried(error: Exception) -> None:
    call = Flaky(error, error, error)
    assert run(call, attempts=4) == "ok"
    assert call.calls == 4


@pytest.mark.parametrize(
    "error",
    [
        FatalError("bad config"),
        ActorError("generic"),
        RemoteError("schema", "bad field", retryable=False),
        ValueError("bug"),
        KeyError("k"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_fatal_errors_are_raised_at_once(error: Exception) -> None:
    call = Flaky(error)
    with pytest.raises(type(error)) as info:
        run(call, attempts=5)
    assert info.value is error
    assert call.calls == 1


def test_gives_up_after_attempts_with_the_last_error() -> None:
    errors = [RequestTimeout(f"try {i}") for i in range(5)]
    call = Flaky(*errors)
    with pytest.raises(RequestTimeout) as info:
        run(call, attempts=3)
    assert info.value is errors[2]
    assert call.calls == 3


def test_fatal_after_transient_stops_retrying() -> None:
    fatal = FatalError("protocol mismatch")
    call = Flaky(PeerDead("restarting"), fatal, PeerDead("never reached"))
    with pytest.raises(FatalError) as info:
        run(call, attempts=10)
    assert info.value is fatal and call.calls == 2


def test_single_attempt_does_not_retry() -> None:
    call = Flaky(Overloaded("full"))
    with pytest.raises(Overloaded):
        run(call, attempts=1)
    assert call.calls == 1


def test_custom_transient_predicate() -> None:
    call = Flaky(ConnectionResetError(), ConnectionResetError())
    assert run(call, attempts=3, is_transient=lambda e: isinstance(e, ConnectionError)) == "ok"
    assert call.calls == 3
    call = Flaky(TransientError("not by this predicate"))
    with pytest.raises(TransientError):
        run(call, attempts=3, is_transient=lambda e: isinstance(e, ConnectionError))
    assert call.calls == 1


def test_cancellation_is_not_retried() -> None:
    call = Flaky(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        run(call, attempts=5, is_transient=lambda e: True)
    assert call.calls == 1


# --- Counters -------------------------------------------------------------------------------------


def test_dropped_sums_only_dropped_counters() -> None:
    c = Counters()
    c["dropped.decode"] += 2
    c["dropped.frames"] += 3
    c["dropped.overloaded"] += 1
    c["received"] += 10
    c["dropped"] += 100  # no reason: not a `dropped.*` counter
    c["not_dropped.decode"] += 50
    c["sent.dropped.x"] += 7
    assert c.dropped() == 6
    assert Counters().dropped() == 0


def test_snapshot_is_a_sorted_plain_dict() -> None:
    c = Counters()
    c["b"] += 2
    c["a"] += 1
    snap = c.snapshot()
    assert type(snap) is dict and list(snap) == ["a", "b"] and snap == {"a": 1, "b": 2}
