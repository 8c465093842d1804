"""Fuzzing a running actor's mailbox: over 10,000 malformed messages, and the actor survives all of them.

A raw DEALER floods an `EchoActor` (its own process, under the `Supervisor`) with messages of every
kind the wire protocol can get wrong. Each case's outcome is predicted before it is sent, by modelling
the mailbox's routing rule (routing ids end at the first empty frame) and decoding the rest with a
local `Codec` under the actor's limits; every targeted category must also produce the code it targets,
so the predictions are checked too. Replies are then checked one by one: every message gets an
`ErrorReply` with the predicted code, `reply_to` and routing frames (an `EchoReply` for the rare
mutation that is still a valid `Echo`). Afterwards the actor is the same process, still answers an
`Echo`, has counted every drop under its code, and its RSS has stayed bounded.

Errors are answered from the mailbox callback, in arrival order, so they are matched in send order;
`EchoReply`s come from handler tasks and may overtake them, so they are matched by `reply_to`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import uvloop
import zmq

from guirl.messages import (
    Codec,
    CodecError,
    CodecLimits,
    DiagChannel,
    Header,
    make_header,
)
from guirl.messages.types import Echo, EchoReply, ErrorReply, Heartbeat, StatsReply, StatsRequest
from guirl.runtime.process import ActorSpec
from guirl.runtime.supervisor import Supervisor
from tests.integration.fuzz_cases import (
    CODEC_CODES,
    MEMORY_BOUND,
    OUTBOUND_DROPS,
    PLAN,
    REPLY_TIMEOUT_S,
    WINDOW,
    Case,
    Fuzzer,
    fuzz_config,
)


class Flood:
    """Sends cases through a DEALER, at most WINDOW unanswered, checking every reply as it comes."""

    def __init__(self, sock: zmq.Socket, deadline: float, actor: psutil.Process) -> None:
        self.sock, self.deadline, self.actor = sock, deadline, actor
        self.codec = Codec()
        self.ids = itertools.count()
        self.errors: deque[Case] = deque()  # answered in send order
        self.echoes: Counter[tuple[str, str]] = Counter()  # (reply_to, text) of valid Echos unanswered
        self.outstanding = 0
        self.codes: Counter[str] = Counter()  # ErrorReply codes received (each as predicted)
        self.by_category: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.valid = 0
        self.sent = 0
        self.bytes_sent = 0

    def actor_state(self) -> str:
        try:
            return f"actor pid {self.actor.pid} {self.actor.status()}"
        except psutil.NoSuchProcess:
            return f"actor pid {self.actor.pid} is gone"

    def send(self, case: Case) -> None:
        try:
            self.sock.send_multipart(case.frames)
        except zmq.Again:
            raise AssertionError(f"send blocked ({self.actor_state()}): {case.describe()}") from None
        self.sent += 1
        self.outstanding += 1
        self.bytes_sent += sum(memoryview(f).nbytes for f in case.frames)
        self.by_category[case.category][case.code or "valid"] += 1
        if case.code is None:
            self.echoes[case.reply_to, case.text] += 1
        else:
            self.errors.append(case)
        while self.outstanding >= WINDOW:
            self.receive()

    def drain(self) -> None:
        while self.outstanding:
            self.receive()

    def receive(self) -> None:
        timeout = min(REPLY_TIMEOUT_S, self.deadline - time.monotonic())
        if timeout <= 0 or not self.sock.poll(int(timeout * 1000)):
            oldest = self.errors[0].describe() if self.errors else f"valid Echos {list(self.echoes)[:3]}"
            raise AssertionError(
                f"no reply within {timeout:.1f} s, {self.outstanding} unanswered "
                f"({self.actor_state()}); oldest: {oldest}"
            )
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.check(frames)

    def parse(self, frames: list[bytes]) -> tuple[list[bytes], Header, Any]:
        """A reply's routing frames, header and message; every reply the actor sends must decode."""
        if b"" not in frames:
            raise AssertionError(f"reply without a delimiter: {frames!r:.300}")
        split = frames.index(b"")
        try:
            return frames[:split], *self.codec.decode(frames[split + 1 :], DiagChannel)
        except CodecError as exc:
            raise AssertionError(f"undecodable reply ({exc.code}: {exc}): {frames!r:.300}") from None

    def check(self, frames: list[bytes]) -> None:
        route, header, msg = self.parse(frames)
        match msg:
            case Heartbeat():
                return
            case ErrorReply(code=code) if self.errors:
                case = self.errors.popleft()
                if (code, header.reply_to, route) != (case.code, case.reply_to, case.route):
                    raise AssertionError(
                        f"{case.describe()}\n  but got ErrorReply(code={code!r}, reply_to="
                        f"{header.reply_to!r}, route={route!r}): {msg.message}"
                    )
                self.codes[code] += 1
            case EchoReply(text=text) if self.echoes[header.reply_to, text] > 0 and not route:
                self.echoes[header.reply_to, text] -= 1
                self.valid += 1
            case _:
                raise AssertionError(f"unexpected reply {msg!r}, reply_to={header.reply_to!r}, route={route}")
        self.outstanding -= 1

    def request(self, msg: Any, want: type, strict: bool = True, timeout: float = REPLY_TIMEOUT_S) -> Any:
        """Send one valid message and wait for its answer; with `strict`, any other reply fails."""
        header = make_header(lambda: f"probe-{next(self.ids)}", "fuzz-client")
        self.sock.send_multipart([b"", *self.codec.encode(header, msg)])
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and self.sock.poll(int(left * 1000) + 1):
            route, reply_header, reply = self.parse(self.sock.recv_multipart())
            if isinstance(reply, want) and reply_header.reply_to == header.msg_id and not route:
                return reply
            if strict and not isinstance(reply, Heartbeat):
                raise AssertionError(f"unexpected extra reply {reply!r} while waiting for a {want.__name__}")
        raise AssertionError(
            f"no {want.__name__} to {type(msg).__name__} within {timeout} s ({self.actor_state()})"
        )


@dataclass
class Outcome:
    flood: Flood
    before: dict[str, int]
    after: dict[str, int]
    rss_warm: int
    rss_end: int
    bytes_after_warmup: int
    elapsed_s: float

    def delta(self, key: str) -> int:
        return self.after.get(key, 0) - self.before.get(key, 0)


async def fuzz_actor(bind: str, cases: Iterator[Case], warmup: int, deadline_s: float = 90.0) -> Outcome:
    """Start an EchoActor, flood it with `cases`, and check it survived; returns what was observed."""
    async with Supervisor(fuzz_config()) as sup:
        spec = ActorSpec(name="fuzz-echo", target="guirl.actors.echo:EchoActor", bind=[bind])
        handle = await sup.start(spec)
        pid = handle.pid
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, int(REPLY_TIMEOUT_S * 1000))
        sock.connect(handle.endpoints[0])
        flood = Flood(sock, time.monotonic() + deadline_s, psutil.Process(pid))
        try:
            # The flood runs synchronously on this loop: every wait is a poll with a timeout instead.
            assert flood.request(Echo(text="ready"), EchoReply).text == "ready"
            before = flood.request(StatsRequest(), StatsReply).counters
            started = time.monotonic()
            rss_warm, warm_bytes = 0, 0
            for n, case in enumerate(cases, 1):
                flood.send(case)
                if n == warmup:
                    flood.drain()
                    rss_warm, warm_bytes = flood.actor.memory_info().rss, flood.bytes_sent
            flood.drain()
            elapsed = time.monotonic() - started
            rss_end = flood.actor.memory_info().rss
            after = flood.request(StatsRequest(), StatsReply).counters
            assert flood.request(Echo(text="still here"), EchoReply).text == "still here"
            assert flood.actor.status() != psutil.STATUS_ZOMBIE and handle.pid == pid, flood.actor_state()
        except (AssertionError, psutil.Error) as exc:
            try:
                stats = flood.request(StatsRequest(), StatsReply, strict=False, timeout=2.0).counters
            except AssertionError as again:
                stats = f"unavailable: {again}"
            raise AssertionError(f"{exc}\nactor stats: {stats}\nsupervisor: {sup.history}") from exc
        finally:
            sock.close(linger=0)
            ctx.term()
        await asyncio.sleep(0)  # let the supervisor's watcher see an exit, if there was one
        exits = [e for e in sup.history if e.kind != "started"]
        assert not exits, f"the actor exited or restarted during the flood: {exits}"
        return Outcome(flood, before, after, rss_warm, rss_end, flood.bytes_sent - warm_bytes, elapsed)


def check_counters(out: Outcome) -> None:
    """Every drop counted, under the code answered; nothing dropped for lack of room; frames all seen."""
    flood = out.flood
    malformed = sum(flood.codes.values())
    counted = {code: out.delta(f"dropped.{code}") for code in CODEC_CODES}
    answered = {code: flood.codes[code] for code in CODEC_CODES}
    assert counted == answered, f"drops counted {counted} differ from the ErrorReplies received {answered}"
    inbound = sum(
        out.delta(k)
        for k in set(out.after) | set(out.before)
        if k.startswith("dropped.") and k not in OUTBOUND_DROPS
    )
    assert inbound == malformed, f"{inbound} drops counted for {malformed} malformed messages: {out.after}"
    assert out.delta("dropped.hwm") == 0, out.after
    assert out.delta("received") == flood.valid, (out.after, flood.valid)
    assert out.delta("frames_in") == flood.sent + 1, (out.after, flood.sent)  # + the second StatsRequest


def test_fuzz_flood_of_malformed_messages() -> None:
    fuzzer = Fuzzer(seed=20240601, limits=CodecLimits.from_config(fuzz_config().codec))
    out = uvloop.run(asyncio.wait_for(fuzz_actor("tcp://127.0.0.1:0", fuzzer.cases(PLAN), 1_000), 120))
    flood = out.flood
    for category, codes in sorted(flood.by_category.items()):
        print(f"{category:>14}: {sum(codes.values()):5d}  {dict(codes.most_common())}")
    print(
        f"sent {flood.sent} in {out.elapsed_s:.1f} s: {flood.valid} valid, errors {dict(flood.codes)}; "
        f"RSS {out.rss_warm / 2**20:.1f} -> {out.rss_end / 2**20:.1f} MiB; drops "
        f"{ {k: out.delta(k) for k in out.after if k.startswith('dropped.')} }"
    )

    assert sum(flood.codes.values()) >= 10_000, flood.codes
    assert all(flood.codes[code] > 0 for code in CODEC_CODES), flood.codes
    check_counters(out)
    # Keeping the bad frames would retain more than twice the bound, so this check can fail.
    assert out.bytes_after_warmup > 2 * MEMORY_BOUND, out.bytes_after_warmup
    assert out.rss_end - out.rss_warm < MEMORY_BOUND, (
        f"actor RSS grew {(out.rss_end - out.rss_warm) / 2**20:.1f} MiB over the flood"
    )


def test_fuzz_garbage_over_ipc(tmp_path: Any) -> None:
    fuzzer = Fuzzer(seed=7, limits=CodecLimits.from_config(fuzz_config().codec))
    cases = fuzzer.cases({"garbage": 1_000})
    out = uvloop.run(asyncio.wait_for(fuzz_actor(f"ipc://{tmp_path}/echo.sock", cases, 100), 60))
    assert out.flood.sent == 1_000 and out.flood.valid == 0, out.flood.by_category
    assert out.flood.codes["frames"] > 0 and out.flood.codes["decode"] > 0, out.flood.codes
    check_counters(out)
