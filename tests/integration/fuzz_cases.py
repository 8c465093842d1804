"""The malformed-message generator of the mailbox fuzz test (`test_fuzz.py`): every case with the
outcome the mailbox must produce for it, predicted from its routing rule and a local `Codec`."""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

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
from guirl.messages.types import Echo

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
