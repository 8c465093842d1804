"""Codec limits and hostile input: every bound is enforced with the right `ErrorReply` code, and no body
a peer sends can crash decoding."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from guirl.messages import (
    ANY,
    BLOB_EXT,
    Blob,
    Codec,
    CodecError,
    CodecLimits,
    IdGen,
    check_depth,
    make_header,
)
from guirl.messages.types import Echo, EpisodeAssignment, Heartbeat

IDS = IdGen()
HEADER = make_header(IDS, "peer")


def ref(index: int) -> msgpack.ExtType:
    return msgpack.ExtType(BLOB_EXT, index.to_bytes(4, "big"))


def raw(body: Any, *blobs: Any) -> list[Any]:
    """Frames with a valid header and a hand-packed body (what a hostile or buggy peer could send)."""
    return [Codec().encode_header(HEADER), body if isinstance(body, bytes) else msgpack.packb(body), *blobs]


def decode_error(frames: list[Any], limits: CodecLimits | None = None) -> CodecError:
    with pytest.raises(CodecError) as info:
        Codec(limits).decode(frames, ANY)
    return info.value


def encode_error(body: Any, limits: CodecLimits) -> CodecError:
    with pytest.raises(CodecError) as info:
        Codec(limits).encode(HEADER, body)
    return info.value


def nested(levels: int, leaf: Any = 0) -> Any:
    for _ in range(levels):
        leaf = [leaf]
    return leaf


def assignment(task: dict[str, Any]) -> EpisodeAssignment:
    return EpisodeAssignment(episode_id="e", task_id="t", task=task, group_id="g")


# --- max_frames -----------------------------------------------------------------------------------


def test_max_frames_on_encode_and_decode() -> None:
    lim = CodecLimits(max_frames=4)
    at_limit = Echo(blobs=[Blob(b"a"), Blob(b"b")])
    frames = Codec(lim).encode(HEADER, at_limit)
    assert len(frames) == 4
    assert Codec(lim).decode(frames, ANY)[1] == at_limit

    over = Echo(blobs=[Blob(b"a"), Blob(b"b"), Blob(b"c")])
    assert encode_error(over, lim).code == "frames"
    err = decode_error(Codec().encode(HEADER, over), lim)
    assert err.code == "frames"


@pytest.mark.parametrize("frames", [[], [b"\x94\x01\xa1i\xa1s\x00"]])
def test_fewer_than_two_frames(frames: list[bytes]) -> None:
    assert decode_error(frames).code == "frames"


# --- max_frame_bytes ------------------------------------------------------------------------------


def test_max_frame_bytes_on_encode_and_decode() -> None:
    lim = CodecLimits(max_frame_bytes=16)
    ok = Echo(blobs=[Blob(bytes(16))])
    assert Codec(lim).decode(Codec(lim).encode(HEADER, ok), ANY)[1] == ok

    big = Echo(blobs=[Blob(b"x"), Blob(bytes(17))])
    assert encode_error(big, lim).code == "too_large"
    err = decode_error(Codec().encode(HEADER, big), lim)
    assert err.code == "too_large" and err.header == HEADER


# --- max_body_bytes -------------------------------------------------------------------------------


def test_max_body_bytes_on_encode_and_decode() -> None:
    msg = Echo(text="x" * 1000)
    size = len(Codec().encode(HEADER, msg)[1])
    at_limit = CodecLimits(max_body_bytes=size)
    assert Codec(at_limit).decode(Codec(at_limit).encode(HEADER, msg), ANY)[1] == msg

    lim = CodecLimits(max_body_bytes=size - 1)
    assert encode_error(msg, lim).code == "too_large"
    err = decode_error(Codec().encode(HEADER, msg), lim)
    assert err.code == "too_large" and err.header == HEADER


def test_body_limit_does_not_count_blobs() -> None:
    lim = CodecLimits(max_body_bytes=64)
    msg = Echo(blobs=[Blob(bytes(10_000))])
    assert Codec(lim).decode(Codec(lim).encode(HEADER, msg), ANY)[1] == msg


# --- max_depth ------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_depth", [3, 5, 32])
def test_check_depth_exactly_at_limit_passes_one_deeper_fails(max_depth: int) -> None:
    # The message is level 1, `task` level 2, so `max_depth - 2` lists inside it reach the limit exactly.
    check_depth(assignment({"k": nested(max_depth - 2)}), max_depth)
    with pytest.raises(CodecError) as info:
        check_depth(assignment({"k": nested(max_depth - 1)}), max_depth)
    assert info.value.code == "too_deep"


def test_check_depth_counts_every_container_kind() -> None:
    check_depth([{"a": (1, 2)}], 3)
    with pytest.raises(CodecError):
        check_depth([{"a": (1, [2])}], 3)
    check_depth("scalar", 0)  # a scalar has no depth


@pytest.mark.parametrize("max_depth", [4, 32])
def test_max_depth_on_decode(max_depth: int) -> None:
    lim = CodecLimits(max_depth=max_depth)
    ok = assignment({"k": nested(max_depth - 2)})
    assert Codec(lim).decode(Codec().encode(HEADER, ok), ANY)[1] == ok
    deep_msg = assignment({"k": nested(max_depth - 1)})
    # the sender's own codec refuses to send it (same limits) ...
    with pytest.raises(CodecError) as sent:
        Codec(lim).encode(HEADER, deep_msg)
    assert sent.value.code == "too_deep"
    # ... and a sender with laxer limits gets it rejected at the receiver
    deep = Codec(CodecLimits(max_depth=max_depth + 10)).encode(HEADER, deep_msg)
    err = decode_error(deep, lim)
    assert err.code == "too_deep" and err.header == HEADER


PREFIX = msgpack.packb({"type": "episode_assignment", "episode_id": "e", "task_id": "t", "group_id": "g"})


def task_body(task_value: bytes) -> bytes:
    """An `episode_assignment` body whose `task` is `{"x": <task_value>}` (raw MessagePack)."""
    assert PREFIX[0] == 0x84  # fixmap of 4 entries; make it 5 and append the `task` key
    return b"\x85" + PREFIX[1:] + msgpack.packb("task") + b"\x81" + msgpack.packb("x") + task_value


def test_task_body_helper_builds_a_valid_body() -> None:
    _, msg = Codec().decode(raw(task_body(msgpack.packb([1, 2]))), ANY)
    assert msg.task == {"x": [1, 2]}


@pytest.mark.parametrize(
    "body",
    [
        task_body(b"\x91" * 100_000 + b"\x00"),  # arrays inside a dict[str, Any]
        task_body(b"\x81\xa1k" * 100_000 + b"\x00"),  # maps inside a dict[str, Any]
        b"\x91" * 100_000 + b"\x00",  # the whole body
        b"\x81\xa4type" * 100_000 + b"\x00",
    ],
    ids=["arrays-in-task", "maps-in-task", "top-level-arrays", "top-level-maps"],
)
def test_hundred_thousand_deep_body_is_codec_error(body: bytes) -> None:
    err = decode_error(raw(body))
    assert err.code in {"too_deep", "schema", "unknown_type"}  # top level: not a message at all
    assert err.header == HEADER


def test_hundred_thousand_deep_task_is_too_deep() -> None:
    assert decode_error(raw(task_body(b"\x91" * 100_000 + b"\x00"))).code == "too_deep"


# --- malformed bodies -----------------------------------------------------------------------------


def test_non_utf8_string_is_decode() -> None:
    body = b"\x82" + msgpack.packb("type") + msgpack.packb("echo") + msgpack.packb("text") + b"\xa2\xff\xfe"
    assert decode_error(raw(body)).code == "decode"


def test_truncated_body_is_decode() -> None:
    frames = Codec().encode(HEADER, Echo(text="hello world"))
    for cut in (1, 5, len(frames[1]) - 1):
        assert decode_error([frames[0], frames[1][:cut]]).code == "decode", cut


def test_trailing_bytes_after_body_is_decode() -> None:
    frames = Codec().encode(HEADER, Heartbeat())
    assert decode_error([frames[0], frames[1] + b"\x00"]).code == "decode"


def test_blob_ref_beyond_frames_is_frames() -> None:
    err = decode_error(raw({"type": "echo", "blobs": [ref(0), ref(1)]}, b"only one"))
    assert err.code == "frames" and err.header == HEADER
    assert decode_error(raw({"type": "echo", "blobs": [ref(0)]})).code == "frames"


def test_unreferenced_blob_frame_is_frames() -> None:
    frames = Codec().encode(HEADER, Echo(blobs=[Blob(b"a")]))
    err = decode_error([*frames, b"extra"])
    assert err.code == "frames" and err.header == HEADER
    assert decode_error([*Codec().encode(HEADER, Heartbeat()), b"extra"]).code == "frames"


def test_repeated_ref_does_not_hide_an_unreferenced_frame() -> None:
    err = decode_error(raw({"type": "echo", "blobs": [ref(0), ref(0)]}, b"a", b"never referenced"))
    assert err.code == "frames"


@pytest.mark.parametrize(
    "ext",
    [msgpack.ExtType(2, b"\0\0\0\0"), msgpack.ExtType(BLOB_EXT, b"\0\0"), msgpack.ExtType(127, b"")],
    ids=["other-code", "short-ref", "code-127"],
)
def test_unknown_or_malformed_ext_is_decode(ext: msgpack.ExtType) -> None:
    for body in (
        {"type": "echo", "blobs": [ext]},
        {
            "type": "episode_assignment",
            "episode_id": "e",
            "task_id": "t",
            "group_id": "g",
            "task": {"x": ext},
        },
    ):
        err = decode_error(raw(body, b"blob"))
        assert err.code == "decode" and err.header == HEADER


@pytest.mark.parametrize("inline", [b"inline bytes", "a string", 7, None])
def test_inline_value_in_blob_field_is_schema(inline: Any) -> None:
    err = decode_error(raw({"type": "echo", "blobs": [inline]}))
    assert err.code == "schema" and err.header == HEADER


def test_errors_after_a_valid_header_carry_it() -> None:
    bad_bodies = [
        b"\xc1",  # never-used MessagePack byte
        msgpack.packb({"type": "no_such_message"}),
        msgpack.packb({"type": "echo", "text": 5}),
        msgpack.packb({"type": "echo", "blobs": [ref(3)]}),
    ]
    for body in bad_bodies:
        err = decode_error(raw(body))
        assert err.header == HEADER, body


# --- codec state and frame kinds ------------------------------------------------------------------


def test_codec_recovers_after_errors() -> None:
    codec = Codec()
    with pytest.raises(CodecError) as err:  # an unencodable value is a clear CodecError, not a crash
        codec.encode(HEADER, assignment({"x": object(), "blob": Blob(b"zz")}))
    assert err.value.code == "encode"
    with pytest.raises(CodecError) as err:
        codec.encode(HEADER, assignment({"x": 2**70}))
    assert err.value.code == "encode"
    frames = codec.encode(HEADER, Echo(blobs=[Blob(b"a")]))
    assert len(frames) == 3 and msgpack.unpackb(frames[1])["blobs"] == [ref(0)]
    with pytest.raises(CodecError):
        codec.decode(raw({"type": "echo", "blobs": [ref(0), ref(1)]}, b"p", b"q", b"r"), ANY)
    assert codec.decode(frames, ANY)[1] == Echo(blobs=[Blob(b"a")])


class FakeFrame:
    """Quacks like a `zmq.Frame`: its bytes are at `.buffer`."""

    def __init__(self, data: bytes) -> None:
        self.buffer = memoryview(data)


@pytest.mark.parametrize("kind", [bytes, memoryview, FakeFrame], ids=["bytes", "memoryview", "buffer"])
def test_decode_accepts_frame_kinds(kind: type) -> None:
    msg = Echo(text="hi", blobs=[Blob(b"payload")])
    frames = [kind(bytes(f)) for f in Codec().encode(HEADER, msg)]
    header, got = Codec().decode(frames, ANY)
    assert header == HEADER and got == msg
    blob_buffer = frames[2].buffer if kind is FakeFrame else frames[2]
    assert got.blobs[0].data is blob_buffer  # a view of the received frame, not a copy


def test_limits_apply_to_buffer_frames() -> None:
    frames = [FakeFrame(bytes(f)) for f in Codec().encode(HEADER, Echo(blobs=[Blob(bytes(17))]))]
    assert decode_error(frames, CodecLimits(max_frame_bytes=16)).code == "too_large"
    big_header = FakeFrame(bytes(5000))
    assert decode_error([big_header, frames[1]]).code == "too_large"


def test_static_depth_skips_the_walk_only_where_the_schema_bounds_it() -> None:
    from guirl.messages.codec import static_depth
    from guirl.messages.types import PolicyRequest, Trajectory

    assert static_depth(Echo) == 2 and static_depth(Heartbeat) == 1
    assert static_depth(PolicyRequest) == 5 and static_depth(Trajectory) == 5
    assert static_depth(EpisodeAssignment) is None  # `task` is free-form: always walked
    check_depth(Echo(text="x" * 1000, blobs=[Blob(b"a")] * 10), 2)  # within its static bound
    with pytest.raises(CodecError):  # a limit below the static bound still walks, and catches it
        check_depth(
            Trajectory(
                episode_id="e",
                task_id="t",
                group_id="g",
                sample_index=0,
                status="completed",
                reward=1.0,
                steps=[],
            ),
            0,
        )
