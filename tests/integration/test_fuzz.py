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
import random
import string
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psutil
import uvloop
import zmq

from guirl.actors.process import ActorSpec
from guirl.actors.supervisor import Supervisor
from guirl.config import GuirlConfig, load_config
from guirl.messages import (
    PROTOCOL_VERSION,
    Blob,
    Codec,
    CodecError,
    CodecLimits,
    DiagChannel,
    Header,
    make_header,
)
from guirl.messages.codec import MAX_HEADER_BYTES
from guirl.messages.types import Echo, EchoReply, ErrorReply, Heartbeat, StatsReply, StatsRequest

CODEC_CODES = ("frames", "too_large", "too_deep", "decode", "schema", "unknown_type", "version")
OUTBOUND_DROPS = ("dropped.unroutable", "dropped.hwm")  # replies the actor could not send: not inbound
WINDOW = 200  # unanswered messages at most: far below the HWMs (1000), so nothing is dropped for room
REPLY_TIMEOUT_S = 10.0
MEMORY_BOUND = 50 * 2**20
ENC = msgspec.msgpack.encode
Ext = msgspec.msgpack.Ext

PLAN = {
    "random_bytes": 1500,
    "random_frames": 1000,
    "frame_count": 600,
    "too_large": 400,
    "too_deep": 400,
    "deep_schema": 300,
    "wrong_types": 900,
    "unknown_tag": 700,
    "non_utf8": 700,
    "version": 400,
    "blob_refs": 700,
    "no_delimiter": 600,
    "fake_routing": 300,
    "mutation": 2500,
}
TARGET = {  # the code a targeted category must produce (the others may produce anything)
    "frame_count": "frames",
    "too_large": "too_large",
    "too_deep": "too_deep",
    "deep_schema": "schema",
    "wrong_types": "schema",
    "unknown_tag": "unknown_type",
    "non_utf8": "decode",
    "version": "version",
    "no_delimiter": "frames",
}
DIAG_TAGS = {"heartbeat", "shutdown", "error_reply", "stats_request", "stats_reply", "echo", "echo_reply"}
OTHER_TAGS = [
    "register",
    "episode_assignment",
    "trajectory",
    "weights_published",
    "Echo",
    "ECHO",
    "echo ",
    "",
    "echo\x00",
    "echo_",
    "policy_request",
    "step_score",
]
WRONG = {  # Echo field -> values of a wrong type for it (an int is a valid float, so not for delay_s)
    "text": [1, 1.5, True, None, [], {}, b"x", ["hi"]],
    "delay_s": ["x", "0.0", True, None, [], {}, b"x"],
    "return_blobs": [1, 0, "true", None, 1.0, [], {}],
    "blobs": ["x", 1, {}, {"a": 1}, [1], ["s"], [None], b"x", True],
}
BAD_UTF8 = [
    b"\xff",
    b"\xfe\xff",
    b"\xc3\x28",
    b"\xa0\xa1",
    b"\xed\xa0\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xc0\xaf",
    b"\xf4\x90\x80\x80",
    b"\xe2\x82",
]
INTERESTING = [0x00, 0x01, 0x7F, 0x80, 0xC0, 0xC1, 0xCB, 0xD9, 0xDC, 0xDD, 0xDE, 0xDF, 0xFF]
ECHO_PREFIX = b"\x82\xa4type\xa4echo"  # a two-entry map starting {"type": "echo", ...


def raw_str(data: bytes) -> bytes:
    """A MessagePack str with arbitrary (here: invalid UTF-8) bytes, which no encoder would write."""
    return (bytes([0xA0 | len(data)]) if len(data) < 32 else bytes([0xD9, len(data)])) + data


def fuzz_config() -> GuirlConfig:
    """Small body and frame limits, so oversized cases are cheap to send."""
    return load_config(env={}, overrides=["codec.max_body_bytes=65536", "codec.max_frame_bytes=1048576"])


@dataclass
class Case:
    """One message to send and what the actor must answer."""

    index: int
    category: str
    frames: list[Any]  # exactly what the DEALER sends
    code: str | None  # the ErrorReply code expected; None: a valid Echo, answered with an EchoReply
    reply_to: str  # the `reply_to` expected ("" when the header itself could not be decoded)
    route: list[bytes] = field(default_factory=list)  # routing frames the reply carries before b""
    text: str = ""  # for a valid Echo: the text echoed

    def describe(self) -> str:
        parts = [
            bytes(memoryview(f)[:20]).hex() + ("…" if memoryview(f).nbytes > 20 else "")
            for f in self.frames[:6]
        ]
        return (
            f"case {self.index} [{self.category}] expects {self.code or 'EchoReply'} "
            f"reply_to={self.reply_to!r} route={self.route!r}; {len(self.frames)} frames {parts}"
        )


class Fuzzer:
    """Deterministic malformed messages of each category (seeded), each with its predicted outcome."""

    def __init__(self, seed: int, limits: CodecLimits) -> None:
        self.rng = random.Random(seed)
        self.limits = limits
        self.oracle = Codec(limits)
        self.codec = Codec(limits)
        huge = 2**31  # an encoder that writes what the actor must refuse
        self.loose = Codec(
            CodecLimits(max_frames=huge, max_frame_bytes=huge, max_body_bytes=huge, max_depth=huge)
        )
        counter = itertools.count()
        self.ids = lambda: f"fuzz{seed}-{next(counter)}"  # deterministic, unlike IdGen's random prefix
        self.big = self.rng.randbytes(limits.max_frame_bytes + 4096)

    def cases(self, plan: dict[str, int]) -> Iterator[Case]:
        order = [category for category, n in plan.items() for _ in range(n)]
        self.rng.shuffle(order)
        for index, category in enumerate(order):
            yield self.make(index, category)

    def make(self, index: int, category: str) -> Case:
        for _ in range(100):  # a random case that decodes as a valid non-Echo (or a slow one) is redrawn
            case = self.expect(index, category, getattr(self, f"_{category}")())
            if case is not None:
                return case
        raise AssertionError(f"cannot generate a {category} case")

    def expect(self, index: int, category: str, sent: list[Any]) -> Case | None:
        """The mailbox's rule: routing ids end at the first empty frame; no empty frame is an error."""
        split = next((i for i, f in enumerate(sent) if memoryview(f).nbytes == 0), -1)
        if split < 0:
            case = Case(index, category, sent, "frames", "")
        else:
            route = [bytes(f) for f in sent[:split]]
            try:
                header, msg = self.oracle.decode(sent[split + 1 :], DiagChannel)
            except CodecError as exc:
                case = Case(index, category, sent, exc.code, exc.header.msg_id if exc.header else "", route)
            else:
                if not (isinstance(msg, Echo) and not msg.delay_s > 0 and not msg.blobs):
                    return None
                case = Case(index, category, sent, None, header.msg_id, route, msg.text)
        target = TARGET.get(category)
        if target is not None and case.code != target:
            raise AssertionError(f"generator bug or codec change: {case.describe()}; {target} targeted")
        if case.code is None and category != "mutation":
            return None
        return case

    # -- helpers ---------------------------------------------------------------------------------

    def header(self, v: int = PROTOCOL_VERSION, sender: str = "fuzz") -> Header:
        return Header(v, self.ids(), sender, 1.7e9)

    def valid(self, **fields: Any) -> list[Any]:
        return self.codec.encode(make_header(self.ids, "fuzz", now=1.7e9), Echo(**fields))

    def junk(self, lo: int, hi: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(lo, hi))

    def nesting(self, depth: int) -> bytes:
        return self.rng.choice([b"\x91", b"\x81\xa1k", b"\x92\xc0"]) * depth + b"\xc0"

    # -- categories: each returns the frames to send ----------------------------------------------

    def _random_bytes(self) -> list[Any]:
        header = self.junk(0, 64) if self.rng.random() < 0.5 else ENC(self.header())
        return [b"", header, self.junk(0, 256)]

    def _random_frames(self) -> list[Any]:
        frames = [self.junk(0, 48) for _ in range(self.rng.randint(2, 12))]
        if self.rng.random() < 0.3:
            frames[0] = ENC(self.header())
        return [b"", *frames]

    def _frame_count(self) -> list[Any]:
        r = self.rng
        header, body = self.valid(text="hi")
        match r.randrange(4):
            case 0:
                return [b""]
            case 1:
                return [b"", r.choice([header, body, self.junk(1, 32)])]
            case _:
                extra = r.randint(self.limits.max_frames - 1, self.limits.max_frames + 40)
                return [b"", header, body, *(self.junk(0, 16) for _ in range(extra))]

    def _too_large(self) -> list[Any]:
        r = self.rng
        match r.randrange(4):
            case 0:
                body = ENC(Echo(text="a" * (self.limits.max_body_bytes + r.randint(1, 4096))))
                return [b"", ENC(self.header()), body]
            case 1:
                header = self.header(sender="s" * (MAX_HEADER_BYTES + r.randint(1, 512)))
                return [b"", ENC(header), ENC(Echo(text="hi"))]
            case _:  # a blob frame just over the limit (2x over, ZeroMQ's MAXMSGSIZE would cut the link)
                blob = memoryview(self.big)[: self.limits.max_frame_bytes + r.randint(1, 4096)]
                return [b"", *self.loose.encode(self.header(), Echo(blobs=[Blob(blob)]))]

    def _too_deep(self) -> list[Any]:
        r = self.rng
        if r.random() < 0.8:  # an unknown field: skipped, but skipping still recurses
            body = b"\x83\xa4type\xa4echo\xa4text\xa2hi\xa3zzz" + self.nesting(r.randint(2_000, 15_000))
            return [b"", ENC(self.header()), body]
        header = ENC(self.header())  # the same in a trailing element of the header (array_like skips extras)
        assert header[0] == 0x96
        nested = b"\x91" * r.randint(2_000, MAX_HEADER_BYTES - 200) + b"\xc0"  # within the header limit
        return [b"", b"\x97" + header[1:] + nested, ENC(Echo(text="hi"))]

    def _deep_schema(self) -> list[Any]:
        nested = self.nesting(self.rng.randint(self.limits.max_depth + 1, 5_000))
        body = self.rng.choice(
            [
                ECHO_PREFIX + b"\xa4text" + nested,
                b"\x83\xa4type\xabstats_reply\xa5actor\xa1a\xa8counters\x81\xa1k" + nested,
                b"\x82\xa4type\xa9heartbeat\xa8inflight" + nested,
            ]
        )
        return [b"", ENC(self.header()), body]

    def _wrong_types(self) -> list[Any]:
        r = self.rng
        match r.randrange(4):
            case 0 | 1:
                name = r.choice(list(WRONG))
                body: Any = {"type": "echo", "text": "hi", name: r.choice(WRONG[name])}
            case 2:
                body = r.choice(
                    [
                        {"type": "heartbeat", "inflight": "x"},
                        {"type": "heartbeat", "incarnation": 7},
                        {"type": "stats_reply", "actor": "a", "counters": {"x": "y"}},
                        {"type": "stats_reply", "actor": 1, "counters": {}},
                        {"type": "stats_reply"},
                        {"type": "error_reply", "code": "nope", "message": "m"},
                        {"type": "shutdown", "reason": 1},
                        {"type": "echo_reply", "sizes": ["x"]},
                    ]
                )
            case _:  # not a map at all
                body = r.choice([[1, 2], 7, "echo", None, 1.5, b"\x00", [{"type": "echo"}]])
        return [b"", ENC(self.header()), ENC(body)]

    def _unknown_tag(self) -> list[Any]:
        r = self.rng
        match r.randrange(4):
            case 0:
                tag: Any = "".join(r.choices(string.ascii_lowercase + "_", k=r.randint(1, 24)))
                body = {"type": tag + "_x" if tag in DIAG_TAGS else tag, "text": "hi"}
            case 1:
                body = {"type": r.choice(OTHER_TAGS), "text": "hi"}
            case 2:
                body = {"text": "hi", "delay_s": 0.0}  # no tag
            case _:
                body = {"type": r.choice([1, None, 1.5, [], {}, True, b"echo"])}
        return [b"", ENC(self.header()), ENC(body)]

    def _non_utf8(self) -> list[Any]:
        r = self.rng
        ascii = [r.choice(string.ascii_letters).encode() * r.randint(0, 4) for _ in range(2)]
        bad = raw_str(ascii[0] + r.choice(BAD_UTF8) + ascii[1])  # ASCII around it cannot complete it
        header = ENC(self.header())
        match r.randrange(5):
            case 0:
                return [b"", header, ECHO_PREFIX + b"\xa4text" + bad]
            case 1:
                return [b"", header, b"\x81\xa4type" + bad]
            case 2:
                return [b"", header, b"\x82\xa4type\xa9heartbeat\xabincarnation" + bad]
            case _:  # in the header: msg_id, sender or reply_to
                fields = [ENC(x) for x in (PROTOCOL_VERSION, "m-1", "fuzz", 1.7e9, -1, "")]
                fields[r.choice([1, 2, 5])] = bad
                return [b"", b"\x96" + b"".join(fields), ENC(Echo(text="hi"))]

    def _version(self) -> list[Any]:
        r = self.rng
        v = r.choice([0, 2, 3, -1, 255, 2**31, -(2**63), 2**64 - 1, r.randint(-(10**9), 10**9)])
        return [b"", ENC(self.header(v=v if v != PROTOCOL_VERSION else 2)), ENC(Echo(text="hi"))]

    def _blob_refs(self) -> list[Any]:
        r = self.rng
        header = ENC(self.header())
        blobs = [self.junk(1, 64) for _ in range(r.randint(0, 3))]
        refs = [Ext(1, i.to_bytes(4, "big")) for i in range(len(blobs))]
        match r.randrange(5):
            case 0:  # a reference past the last frame
                refs.append(Ext(1, r.randint(len(blobs), 2**32 - 1).to_bytes(4, "big")))
            case 1:  # an extension type that is not a blob reference
                refs.append(Ext(r.choice([c for c in range(-128, 128) if c not in (1, -1)]), b"\0\0\0\0"))
            case 2:  # a blob reference of the wrong length
                refs.append(Ext(1, r.randbytes(r.choice([0, 1, 2, 3, 5, 8]))))
            case 3:  # frames nobody refers to
                blobs += [self.junk(1, 64) for _ in range(r.randint(1, 4))]
            case _:  # one frame referred to twice, another never
                blobs.append(self.junk(1, 8))
                refs = [Ext(1, b"\0\0\0\0")] * len(blobs)
        return [b"", header, ENC({"type": "echo", "blobs": refs}), *blobs]

    def _no_delimiter(self) -> list[Any]:
        if self.rng.random() < 0.5:
            return self.valid(text="hi", blobs=[Blob(self.junk(1, 64))])
        return [self.junk(1, 48) for _ in range(self.rng.randint(1, 8))]

    def _fake_routing(self) -> list[Any]:
        route = [self.junk(1, 16) for _ in range(self.rng.randint(1, 3))]
        build = self.rng.choice([self._random_bytes, self._wrong_types, self._unknown_tag, self._version])
        return [*route, *build()]

    def _mutation(self) -> list[Any]:
        r = self.rng
        frames = [bytearray(f) for f in self.valid(text="hi")]
        for _ in range(r.randint(1, 3)):
            if not frames:
                frames.append(bytearray(self.junk(1, 8)))
            f = frames[r.randrange(len(frames))]
            op = r.randrange(9)
            if op <= 2 and f:  # bit flips, the most common
                for _ in range(r.randint(1, 4)):
                    bit = r.randrange(len(f) * 8)
                    f[bit // 8] ^= 1 << (bit % 8)
            elif op == 3:
                del f[r.randrange(len(f) + 1) :]
            elif op == 4:
                f.insert(r.randrange(len(f) + 1), r.randrange(256))
            elif op == 5 and f:
                del f[r.randrange(len(f))]
            elif op == 6 and f:
                f[r.randrange(len(f))] = r.choice(INTERESTING)
            elif op == 7:
                frames.remove(f)
            else:
                frames.insert(r.randrange(len(frames) + 1), bytearray(self.junk(0, 16)))
        return [b"", *map(bytes, frames)]

    def _garbage(self) -> list[Any]:  # random frames, delimiter or not: for the ipc test
        frames = [self.junk(0, 64) for _ in range(self.rng.randint(1, 10))]
        return [b"", *frames] if self.rng.random() < 0.5 else frames


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
