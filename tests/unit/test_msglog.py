"""Message logs: recorder/reader round trip, dedupe, rotation, torn and corrupt data, replay frames."""

from __future__ import annotations

import logging
import random
import zlib
from pathlib import Path

import msgpack
import pytest
import zmq

from guirl.messages import ANY, Blob, Codec, IdGen, make_header
from guirl.messages.types import Echo
from guirl.msglog import BlobRef, LogReader, MsgLogError, Recorder, read_log
from guirl.msglog import format as fmt
from guirl.msglog.query import record_to_json

IDS = IdGen()


def echo_frames(text: str, *blobs: bytes, sender: str = "a") -> list:
    return Codec().encode(make_header(IDS, sender), Echo(text=text, blobs=[Blob(b) for b in blobs]))


def record(rec: Recorder, frames: list, direction: str = "out", **kw) -> None:
    rec.record(
        direction,
        kw.get("sock", "diag"),
        kw.get("peer", "b"),
        frames[0],
        frames[1],
        frames[2:],
        t=kw.get("t"),
    )


def write_log(tmp_path: Path, n: int = 4, **kw) -> list[list]:
    sent = [echo_frames(f"m{i}", b"shared-blob", bytes([i]) * (10 + i)) for i in range(n)]
    with Recorder(tmp_path, "log", actor="tester", **kw) as rec:
        for i, frames in enumerate(sent):
            record(rec, frames, direction="in" if i % 2 else "out", t=100.0 + i)
    return sent


def raw_records(path: Path) -> list[dict]:
    """Records of a segment through the plain msgpack package, checking each [len, crc] prefix."""
    data = path.read_bytes()
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    items = list(unpacker)
    out = []
    pos = 0
    for prefix, rec in zip(items[::2], items[1::2]):
        length, crc = prefix
        assert zlib.crc32(data[pos + 11 : pos + 11 + length]) == crc
        pos += 11 + length
        out.append(rec)
    assert len(items) % 2 == 0 and pos == len(data)
    return out


def test_round_trip(tmp_path: Path) -> None:
    sent = write_log(tmp_path)
    reader = LogReader([tmp_path])
    records = list(reader)
    assert [r.index for r in records] == [0, 1, 2, 3]
    assert reader.warnings == []
    for i, (r, frames) in enumerate(zip(records, sent)):
        assert (r.t, r.direction, r.sock, r.peer, r.actor, r.type) == (
            100.0 + i,
            "in" if i % 2 else "out",
            "diag",
            "b",
            "tester",
            "echo",
        )
        assert r.header["sender"] == "a" and r.header["v"] == 1 and r.header["msg_id"]
        assert r.body["text"] == f"m{i}"
        refs = r.body["blobs"]
        assert [type(x) for x in refs] == [BlobRef, BlobRef]
        assert [x.index for x in refs] == [0, 1] and [x.hash for x in refs] == r.blobs
        assert [reader.blob(h) for h in r.blobs] == [bytes(b) for b in frames[2:]]
        assert refs[1].size == 10 + i
        assert r.blobs[0] == Blob(b"shared-blob").digest()
        assert Path(r.file).name == "log.000000.msglog"


def test_read_log_function_and_single_path(tmp_path: Path) -> None:
    write_log(tmp_path, n=2)
    assert len(list(read_log([tmp_path]))) == 2
    assert len(list(read_log(tmp_path / "log.000000.msglog"))) == 2


def test_counters_and_dedupe(tmp_path: Path) -> None:
    with Recorder(tmp_path, "log") as rec:
        record(rec, echo_frames("x", b"same", b"same"))
        record(rec, echo_frames("y", b"same", b"other"))
    assert (rec.records, rec.blobs_written, rec.blobs_deduplicated) == (2, 2, 2)
    path = tmp_path / "log.000000.msglog"
    assert rec.bytes_written == path.stat().st_size
    kinds = [r["k"] for r in raw_records(path)]
    assert kinds == ["meta", "blob", "msg", "blob", "msg"]
    records = list(read_log([path]))
    assert records[0].blobs[0] == records[0].blobs[1] == records[1].blobs[0]


def test_accepts_buffers_and_zmq_frames(tmp_path: Path) -> None:
    frames = echo_frames("z", b"b0", b"b1", b"b2", b"b3")
    header, body = (zmq.Frame(bytes(f)) for f in frames[:2])
    blobs = [b"b0", bytearray(b"b1"), memoryview(b"b2"), zmq.Frame(b"b3")]
    with Recorder(tmp_path, "log") as rec:
        rec.record("in", "diag", b"\x00\x01", header, body, blobs)
    reader = LogReader([tmp_path])
    (r,) = list(reader)
    assert r.peer == "0001"
    assert [reader.blob(h) for h in r.blobs] == [b"b0", b"b1", b"b2", b"b3"]


def test_directions_filter_and_closed(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, "log", directions=("in",))
    record(rec, echo_frames("out"), direction="out")
    record(rec, echo_frames("in"), direction="in")
    rec.close()
    assert [r.body["text"] for r in read_log([tmp_path])] == ["in"]
    with pytest.raises(ValueError):
        record(rec, echo_frames("late"), direction="in")
    with pytest.raises(ValueError):
        Recorder(tmp_path, "log", directions=("sideways",))


def test_sockets_filter(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, "log", sockets=("mailbox",))
    record(rec, echo_frames("served"), direction="in", sock="mailbox")
    record(rec, echo_frames("asked"), direction="out", sock="broker")
    rec.close()
    assert [(r.sock, r.body["text"]) for r in read_log([tmp_path])] == [("mailbox", "served")]


def test_rotation_segments_are_self_contained(tmp_path: Path) -> None:
    write_log(tmp_path, n=6, rotate_bytes=200)
    segments = sorted(tmp_path.glob("*.msglog"))
    assert len(segments) >= 3
    for seq, seg in enumerate(segments):
        assert seg.name == f"log.{seq:06d}.msglog"
        recs = raw_records(seg)
        assert recs[0]["k"] == "meta" and recs[0]["segment"] == seq and recs[0]["format"] == "guirl-msglog"
    # The last segment alone still resolves every blob it refers to.
    reader = LogReader([segments[-1]])
    last = list(reader)
    assert last and all(reader.blob(h) for r in last for h in r.blobs)
    assert all(ref.size > 0 for r in last for ref in r.body["blobs"])
    assert [r.body["text"] for r in read_log([tmp_path])] == [f"m{i}" for i in range(6)]


def test_new_recorder_never_appends(tmp_path: Path) -> None:
    write_log(tmp_path, n=1)
    (tmp_path / "log.000007.msglog").write_bytes(b"")  # a later segment (even an empty one) is skipped
    with Recorder(tmp_path, "log") as rec:
        record(rec, echo_frames("again"))
    assert rec.paths == [tmp_path / "log.000008.msglog"]
    assert (tmp_path / "log.000000.msglog").stat().st_size > 0


def test_plain_msgpack_reads_a_log(tmp_path: Path) -> None:
    write_log(tmp_path, n=2)
    with open(tmp_path / "log.000000.msglog", "rb") as f:
        items = list(msgpack.Unpacker(f, raw=False))
    assert isinstance(items[0], list) and len(items[0]) == 2
    assert items[1]["k"] == "meta" and items[1]["actor"] == "tester" and items[1]["version"] == 1
    msgs = [x for x in items[1::2] if x["k"] == "msg"]
    assert [m["body"]["text"] for m in msgs] == ["m0", "m1"]
    assert msgs[0]["header"][2] == "a"  # the header frame is embedded, not bin
    assert msgs[0]["body"]["blobs"][0] == msgpack.ExtType(1, b"\x00\x00\x00\x00")


def test_truncated_at_every_offset_of_last_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_log(tmp_path / "src", n=3)
    data = (tmp_path / "src" / "log.000000.msglog").read_bytes()
    last = list(read_log([tmp_path / "src"]))[-1].offset
    cut_path = tmp_path / "cut.msglog"
    for cut in range(last + 1, len(data)):
        cut_path.write_bytes(data[:cut])
        reader = LogReader([cut_path])
        with caplog.at_level(logging.WARNING, logger="guirl.msglog.reader"):
            caplog.clear()
            texts = [r.body["text"] for r in reader]
        assert texts == ["m0", "m1"]
        assert len(reader.warnings) == 1 and f"{cut_path}:{last}: torn" in reader.warnings[0]
        assert len(caplog.records) == 1 and str(cut_path) in caplog.records[0].getMessage()


def test_crc_corruption_ends_file_and_next_file_is_read(tmp_path: Path) -> None:
    write_log(tmp_path, n=6, rotate_bytes=200)
    first = tmp_path / "log.000000.msglog"
    good = list(read_log([first]))
    data = bytearray(first.read_bytes())
    data[good[-1].offset + 20] ^= 0xFF
    first.write_bytes(bytes(data))
    reader = LogReader([tmp_path])
    records = list(reader)
    assert len(reader.warnings) == 1 and "CRC mismatch" in reader.warnings[0]
    assert [r.body["text"] for r in records] == [f"m{i}" for i in range(6) if i != len(good) - 1]
    assert [r.index for r in records] == list(range(5))


def test_decodable_framing_with_undecodable_record_is_skipped(tmp_path: Path) -> None:
    write_log(tmp_path, n=2)
    path = tmp_path / "log.000000.msglog"
    data = path.read_bytes()
    second = list(read_log([path]))[1].offset
    junk = b"\xc1\xc1"  # CRC-valid, but not MessagePack
    path.write_bytes(data[:second] + fmt.encode_prefix(len(junk), zlib.crc32(junk)) + junk + data[second:])
    reader = LogReader([path])
    assert [r.body["text"] for r in reader] == ["m0", "m1"]
    assert len(reader.warnings) == 1 and "undecodable" in reader.warnings[0]


def test_not_a_log(tmp_path: Path) -> None:
    bad = tmp_path / "notes.msglog"
    bad.write_text("hello, this is not a message log\n")
    with pytest.raises(MsgLogError, match="not a guirl message log"):
        list(read_log([bad]))
    other = fmt.pack({"k": "meta", "format": "something-else", "version": 1})
    bad.write_bytes(fmt.encode_prefix(len(other), zlib.crc32(other)) + other)
    with pytest.raises(MsgLogError, match="not a guirl message log"):
        list(read_log([bad]))
    with pytest.raises(MsgLogError):
        list(read_log([tmp_path / "missing.msglog"]))
    empty = tmp_path / "empty" / "x.msglog"
    empty.parent.mkdir()
    empty.write_bytes(b"")  # a recorder killed between open and its first write
    reader = LogReader([empty])
    assert list(reader) == [] and len(reader.warnings) == 1


def test_verbatim_garbage_frames(tmp_path: Path) -> None:
    frames = echo_frames("after")
    with Recorder(tmp_path, "log") as rec:
        rec.record("in", "diag", "evil", frames[0], b"\xc1garbage", [])
        record(rec, frames, direction="in")
    reader = LogReader([tmp_path])
    first, second = list(reader)
    assert reader.warnings == []
    assert first.body == {} and first.type is None and first.header["sender"] == "a"
    assert reader.raw_frames(first) == [bytes(frames[0]), b"\xc1garbage"]
    assert second.body["text"] == "after"


def test_raw_frames_decode_to_the_same_messages(tmp_path: Path) -> None:
    big = bytes(range(256)) * 300  # over 64 KiB: a bin32 blob header
    sent = [echo_frames("small", b"x"), echo_frames("big", big, b"x"), echo_frames("none")]
    with Recorder(tmp_path, "log") as rec:
        for frames in sent:
            record(rec, frames)
    reader = LogReader([tmp_path])
    codec = Codec()
    for r, frames in zip(reader, sent):
        replayed = reader.raw_frames(r)
        assert replayed == [bytes(f) for f in frames]
        assert codec.decode(replayed, ANY) == codec.decode(frames, ANY)
        edited = reader.raw_frames(r, body={**r.body, "text": "edited"})
        _, msg = codec.decode(edited, ANY)
        assert msg.text == "edited" and msg.blobs == codec.decode(frames, ANY)[1].blobs


def test_fuzz_mutations_never_crash(tmp_path: Path) -> None:
    write_log(tmp_path / "src", n=4)
    data = (tmp_path / "src" / "log.000000.msglog").read_bytes()
    rng = random.Random(1234)
    path = tmp_path / "fuzz.msglog"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.choice(("flip", "truncate", "insert", "delete", "overwrite"))
            pos = rng.randrange(max(len(buf), 1))
            if op == "flip" and buf:
                buf[pos] ^= 1 << rng.randrange(8)
            elif op == "truncate":
                del buf[pos:]
            elif op == "insert":
                buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
            elif op == "delete":
                del buf[pos : pos + rng.randint(1, 16)]
            else:
                buf[pos : pos + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", rng.randbytes(4)])
        path.write_bytes(bytes(buf))
        reader = LogReader([path])
        try:
            for r in reader:
                record_to_json(r)
                reader.raw_frames(r)
            outcomes["ok"] += 1
        except MsgLogError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0


def test_fuzz_crc_valid_hostile_records(tmp_path: Path) -> None:
    """Mutated payloads with recomputed CRCs reach the decoder: still nothing but MsgLogError."""
    write_log(tmp_path / "src", n=3)
    data = (tmp_path / "src" / "log.000000.msglog").read_bytes()
    payloads = []
    pos = 0
    while pos < len(data):
        length, _ = fmt.decode_prefix(data[pos : pos + fmt.PREFIX_SIZE])
        payloads.append(data[pos + fmt.PREFIX_SIZE : pos + fmt.PREFIX_SIZE + length])
        pos += fmt.PREFIX_SIZE + length
    rng = random.Random(99)
    path = tmp_path / "fuzz.msglog"
    deep = b"\x81\xa1k" + b"\x91" * 5000 + b"\x00"
    for _ in range(300):
        out = bytearray()
        for i, payload in enumerate(payloads):
            buf = bytearray(payload)
            if i == 0 and rng.random() < 0.8:
                pass  # mostly keep the meta intact so the other records get decoded
            elif rng.random() < 0.05:
                buf = bytearray(deep)
            elif rng.random() < 0.5:
                for _ in range(rng.randint(1, 3)):
                    p = rng.randrange(len(buf))
                    buf[p : p + rng.randint(1, 3)] = rng.randbytes(rng.randint(0, 3))
            out += fmt.encode_prefix(len(buf), zlib.crc32(buf)) + buf
        path.write_bytes(bytes(out))
        reader = LogReader([path])
        try:
            for r in reader:
                record_to_json(r)
                reader.raw_frames(r)  # MsgLogError when a mutated hash names no stored blob
        except MsgLogError:
            pass
