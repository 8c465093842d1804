"""Wire messages: round trips per channel, tags, immutability, blobs as frames, tensors, schema
evolution, and the header."""

from __future__ import annotations

import inspect
import struct
import time
import typing
import zlib

import msgpack
import msgspec
import pytest

from guirl.messages import (
    ANY,
    BLOB_EXT,
    CHANNELS,
    PROTOCOL_VERSION,
    Blob,
    Codec,
    CodecError,
    Control,
    Header,
    IdGen,
    make_header,
)
from guirl.messages import types as mt
from guirl.messages.codec import MAX_HEADER_BYTES
from guirl.messages.types import (
    Ack,
    ChatMessage,
    Echo,
    EchoReply,
    EpisodeAssignment,
    EpisodeDelivered,
    EpisodeEnded,
    EpisodeRejected,
    ErrorReply,
    GroupsRetired,
    Heartbeat,
    HoldGil,
    Image,
    ImagePart,
    LearnerResumed,
    Message,
    NoWork,
    PolicyRequest,
    PolicyResponse,
    Register,
    SamplingParams,
    Shutdown,
    StatsReply,
    StatsRequest,
    StepSample,
    StepScore,
    Tensor,
    TextPart,
    Trajectory,
    Transition,
    WeightsPublished,
    WorkRequest,
)
from guirl.messages.weights import WeightsFromDisk

IDS = IdGen()


def png(width: int, height: int) -> bytes:
    """A real (tiny, grey) PNG file."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + payload))
        return struct.pack(">I", len(payload)) + kind + payload + crc

    rows = b"".join(b"\x00" + bytes([128]) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(rows))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + idat + chunk(b"IEND", b"")


SCREEN = png(8, 6)


def image() -> Image:
    return Image(data=Blob(SCREEN), width=8, height=6)


def step_sample(step: int) -> StepSample:
    return StepSample(
        step=step,
        prompt_ids=Tensor.from_list([101, 2023, 2003, step]),
        response_ids=Tensor.from_list([7, 8, 9]),
        logprobs=Tensor.from_list([-0.5, -1.25, -0.125], "float32"),
        images=[image()],
        policy_version=3,
        response_text="click(10, 20)",
        action="click",
        prm_score=0.75 if step else None,
    )


EXAMPLES: dict[type, Message] = {
    Heartbeat: Heartbeat(inflight=3, incarnation="a1b2"),
    Shutdown: Shutdown(reason="operator"),
    ErrorReply: ErrorReply(code="overloaded", message="queue full", retryable=True),
    StatsRequest: StatsRequest(),
    HoldGil: HoldGil(seconds=2.5),
    StatsReply: StatsReply(actor="broker", counters={"received": 10, "dropped.decode": 1}, peers=["w0"]),
    Echo: Echo(text="ping", blobs=[Blob(b"\x00\x01" * 100), Blob(SCREEN)], delay_s=0.01),
    EchoReply: EchoReply(text="ping", blobs=[Blob(b"\xff" * 33)], sizes=[33]),
    Register: Register(role="env_worker", name="w0", capacity=4, host="vm-1", pid=1234),
    Ack: Ack(ok=False, note="duplicate"),
    WorkRequest: WorkRequest(worker="w0", free_slots=2),
    EpisodeAssignment: EpisodeAssignment(
        episode_id="ep-1",
        task_id="chrome-42",
        task={"instruction": "Open settings", "config": [{"type": "launch", "args": ["chrome"]}], "n": 1},
        group_id="g-7",
        sample_index=2,
        max_steps=10,
        min_policy_version=4,
        seed=99,
        mode="eval",
        domain="chrome",
    ),
    NoWork: NoWork(retry_after_s=0.5, reason="staleness"),
    EpisodeEnded: EpisodeEnded(episode_id="ep-1", status="completed", reward=1.0, steps=7),
    PolicyRequest: PolicyRequest(
        episode_id="ep-1",
        step=3,
        messages=[
            ChatMessage(role="system", parts=[TextPart("You operate a desktop.")]),
            ChatMessage(role="user", parts=[TextPart("Open settings"), ImagePart(0), ImagePart(1)]),
        ],
        prompt_ids=Tensor.from_list([1, 2, 3, 4, 5]),
        images=[image(), Image(data=Blob(png(2, 2)), width=2, height=2)],
        sampling=SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=64, seed=5, stop=["</s>"]),
    ),
    PolicyResponse: PolicyResponse(
        text="click(10, 20)",
        prompt_ids=Tensor.from_list([1, 2, 3]),
        response_ids=Tensor.from_list([7, 8]),
        logprobs=Tensor.from_list([-0.25, -2.0], "float32"),
        finish_reason="length",
        policy_version=5,
        engine="sglang-0",
        latency_s=0.2,
    ),
    Transition: Transition(
        episode_id="ep-1",
        step=2,
        instruction="Open settings",
        previous_actions=["click(1, 2)"],
        response="click(10, 20)",
        before=image(),
        after=Image(data=Blob(png(3, 3)), width=3, height=3),
        history=[image()],
    ),
    StepScore: StepScore(episode_id="ep-1", step=2, score=None, votes=3, invalid=3),
    Trajectory: Trajectory(
        episode_id="ep-1",
        task_id="chrome-42",
        group_id="g-7",
        sample_index=2,
        status="completed",
        reward=1.0,
        steps=[step_sample(0), step_sample(1)],
        domain="chrome",
    ),
    WeightsPublished: WeightsPublished(
        version=6, learner_step=60, n_tensors=3, nbytes=1024, source=WeightsFromDisk(path="/ckpt/6")
    ),
    LearnerResumed: LearnerResumed(version=4, trained_groups=["t@0", "t@1"]),
    EpisodeRejected: EpisodeRejected(
        episode_id="e9", group_id="t@2", sample_index=1, task_id="t", reason="version 3 of epoch 0"
    ),
    GroupsRetired: GroupsRetired(groups=["t@1"]),
    EpisodeDelivered: EpisodeDelivered(episode_id="e9"),
}

ANY_TYPES = typing.get_args(ANY)
CONTROL_TYPES = typing.get_args(Control)
NAMED_CHANNELS = {name: ch for name, ch in CHANNELS.items() if name != "any"}


def channels_of(cls: type) -> list[str]:
    return [name for name, ch in NAMED_CHANNELS.items() if cls in typing.get_args(ch)]


def snake(name: str) -> str:
    # Written independently of types._snake, so a wrong tag function makes this test fail.
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


# --- round trips ----------------------------------------------------------------------------------


def test_examples_cover_every_message_in_any() -> None:
    assert set(EXAMPLES) == set(ANY_TYPES)


def test_every_message_class_is_reachable_from_any() -> None:
    defined = {
        obj
        for obj in vars(mt).values()
        if inspect.isclass(obj) and issubclass(obj, Message) and obj is not Message
    }
    assert len(defined) >= 19
    assert defined == set(ANY_TYPES)


@pytest.mark.parametrize("cls", ANY_TYPES, ids=lambda c: c.__name__)
def test_round_trip_on_its_channels(cls: type) -> None:
    msg = EXAMPLES[cls]
    names = channels_of(cls)
    assert names, f"{cls.__name__} is in no channel but 'any'"
    codec = Codec()
    header = make_header(IDS, "sender", policy_version=2)
    frames = codec.encode(header, msg)
    for name in [*names, "any"]:
        got_header, got = codec.decode(frames, CHANNELS[name])
        assert got_header == header
        assert type(got) is cls
        assert got == msg


def test_round_trip_preserves_nested_payloads() -> None:
    frames = Codec().encode(make_header(IDS, "w"), EXAMPLES[Trajectory])
    _, traj = Codec().decode(frames, CHANNELS["learner"])
    assert [s.step for s in traj.steps] == [0, 1]
    assert traj.steps[1].prompt_ids.tolist() == [101, 2023, 2003, 1]
    assert traj.steps[0].logprobs.tolist() == [-0.5, -1.25, -0.125]
    assert bytes(traj.steps[0].images[0].data) == SCREEN
    assert traj.steps[0].prm_score is None and traj.steps[1].prm_score == 0.75

    frames = Codec().encode(make_header(IDS, "w"), EXAMPLES[PolicyRequest])
    _, req = Codec().decode(frames, CHANNELS["policy"])
    assert req.messages[1].parts == [TextPart("Open settings"), ImagePart(0), ImagePart(1)]
    assert bytes(req.images[0].data).startswith(b"\x89PNG")


# --- tags, immutability, channels -----------------------------------------------------------------


def test_tags_are_snake_case_of_class_name_and_unique() -> None:
    tags = [cls.__struct_config__.tag for cls in ANY_TYPES]
    assert tags == [snake(cls.__name__) for cls in ANY_TYPES]
    assert len(set(tags)) == len(tags)
    assert EpisodeAssignment.__struct_config__.tag == "episode_assignment"
    assert StatsRequest.__struct_config__.tag == "stats_request"
    assert all(cls.__struct_config__.tag_field == "type" for cls in ANY_TYPES)


@pytest.mark.parametrize("cls", ANY_TYPES, ids=lambda c: c.__name__)
def test_messages_are_frozen(cls: type) -> None:
    msg = EXAMPLES[cls]
    field = msg.__struct_fields__[0] if msg.__struct_fields__ else "anything"
    with pytest.raises(AttributeError):
        setattr(msg, field, None)


@pytest.mark.parametrize("part", [image(), step_sample(0), TextPart("x"), ImagePart(0), SamplingParams()])
def test_payload_parts_are_frozen(part: msgspec.Struct) -> None:
    with pytest.raises(AttributeError):
        setattr(part, part.__struct_fields__[0], None)


def test_tensor_is_frozen() -> None:
    t = Tensor.from_list([1, 2])
    with pytest.raises(AttributeError):
        t.shape = [1]  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(CHANNELS))
def test_each_channel_includes_the_control_messages(name: str) -> None:
    members = set(typing.get_args(CHANNELS[name]))
    assert {Heartbeat, Shutdown, ErrorReply, StatsRequest, StatsReply} <= members
    assert set(CONTROL_TYPES) <= members


@pytest.mark.parametrize("name", sorted(NAMED_CHANNELS))
def test_message_of_another_channel_is_unknown_type(name: str) -> None:
    members = set(typing.get_args(CHANNELS[name]))
    foreign = [cls for cls in ANY_TYPES if cls not in members]
    assert foreign
    codec = Codec()
    header = make_header(IDS, "x")
    for cls in foreign:
        with pytest.raises(CodecError) as info:
            codec.decode(codec.encode(header, EXAMPLES[cls]), CHANNELS[name])
        assert info.value.code == "unknown_type", cls
        assert info.value.header == header


def test_body_without_type_is_unknown_type() -> None:
    codec = Codec()
    frames = [codec.encode_header(make_header(IDS, "x")), msgpack.packb({"text": "hi"})]
    with pytest.raises(CodecError) as info:
        codec.decode(frames, ANY)
    assert info.value.code == "unknown_type"


def test_bad_tag_of_nested_union_is_schema_not_unknown_type() -> None:
    codec = Codec()
    hdr = codec.encode_header(make_header(IDS, "x"))
    for part in ({"text": "no tag"}, {"type": "video", "index": 0}):
        body = {
            "type": "policy_request",
            "episode_id": "e",
            "step": 0,
            "messages": [{"role": "user", "parts": [part]}],
        }
        with pytest.raises(CodecError) as info:
            codec.decode([hdr, msgpack.packb(body)], ANY)
        assert info.value.code == "schema", part


# --- blobs ----------------------------------------------------------------------------------------


def test_blobs_travel_as_trailing_frames_zero_copy() -> None:
    big = bytes(range(256)) * 4096  # 1 MiB
    small = b"tiny"
    frames = Codec().encode(make_header(IDS, "a"), Echo(text="hi", blobs=[Blob(big), Blob(small)]))
    assert len(frames) == 4
    assert len(frames[1]) < 100  # the body holds only references
    assert big not in frames[1] and small not in frames[1]
    assert frames[2] is big and frames[3] is small  # not copied

    _, echo = Codec().decode(frames, ANY)
    assert echo.blobs[0].data is big  # decoding does not copy either
    assert echo.blobs[1] == Blob(small)


def test_image_and_tensor_blobs_are_frames() -> None:
    req = EXAMPLES[PolicyRequest]
    frames = Codec().encode(make_header(IDS, "a"), req)
    assert len(frames) == 2 + 1 + len(req.images)  # prompt_ids and two screenshots
    blob_frames = frames[2:]
    assert any(f is req.images[0].data.data for f in blob_frames)
    assert any(f is SCREEN for f in blob_frames)
    assert any(f is req.prompt_ids.data.data for f in blob_frames)
    assert SCREEN not in frames[1]


def test_plain_msgpack_reads_a_body() -> None:
    frames = Codec().encode(make_header(IDS, "a"), Echo(text="hi", blobs=[Blob(b"abc"), Blob(b"de")]))
    body = msgpack.unpackb(frames[1])
    assert body == {
        "type": "echo",
        "text": "hi",
        "blobs": [msgpack.ExtType(BLOB_EXT, (0).to_bytes(4, "big")), msgpack.ExtType(BLOB_EXT, b"\0\0\0\1")],
        "delay_s": 0.0,
        "return_blobs": True,
    }
    assert BLOB_EXT == 1
    header = msgpack.unpackb(frames[0])
    assert header[0] == PROTOCOL_VERSION and header[2] == "a"


def test_blob_equality_and_digest() -> None:
    a = Blob(b"screen")
    assert a == Blob(memoryview(b"screen")) and a != Blob(b"other")
    assert len(a) == 6 and bytes(a) == b"screen"
    assert a.digest() == Blob(bytearray(b"screen")).digest() != Blob(b"other").digest()
    assert hash(a) == hash(Blob(b"screen"))


# --- tensors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "dtype"),
    [([0, 1, -2, 2**31 - 1, -(2**31)], "int32"), ([0.5, -1.25, 3.0, 1e-3], "float32"), ([], "int32")],
)
def test_tensor_tolist_round_trips(values: list, dtype: str) -> None:
    t = Tensor.from_list(values, dtype)
    assert t.shape == [len(values)] and len(t.data) == 4 * len(values)
    as_f32 = [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]
    expected = as_f32 if dtype == "float32" else values
    assert t.tolist() == expected
    frames = Codec().encode(make_header(IDS, "a"), PolicyResponse(text="", logprobs=t))
    _, got = Codec().decode(frames, ANY)
    assert got.logprobs.tolist() == expected and got.logprobs.dtype == dtype


def test_tensor_multi_dimensional_size() -> None:
    t = Tensor(dtype="int64", shape=[2, 3], data=Blob(bytes(48)))
    assert t.tolist() == [0] * 6
    assert Tensor(dtype="uint8", shape=[0, 5], data=Blob(b"")).tolist() == []


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("int32", [3], 8), ("float32", [2, 2], 12), ("bfloat16", [4], 4), ("uint8", [2], 3), ("int32", [-1], 0)],
)
def test_tensor_size_mismatch_raises_on_construction(dtype: str, shape: list[int], nbytes: int) -> None:
    with pytest.raises(ValueError):
        Tensor(dtype=dtype, shape=shape, data=Blob(bytes(nbytes)))


def test_tensor_size_mismatch_on_decode_is_schema() -> None:
    codec = Codec()
    body = msgpack.packb(
        {
            "type": "policy_response",
            "text": "x",
            "logprobs": {"dtype": "float32", "shape": [3], "data": msgpack.ExtType(BLOB_EXT, b"\0\0\0\0")},
        }
    )
    header = make_header(IDS, "a")
    with pytest.raises(CodecError) as info:
        codec.decode([codec.encode_header(header), body, bytes(8)], ANY)
    assert info.value.code == "schema"
    assert info.value.header == header
    # The same body with the right blob size decodes.
    _, msg = codec.decode([codec.encode_header(header), body, bytes(12)], ANY)
    assert msg.logprobs.tolist() == [0.0, 0.0, 0.0]


def test_bfloat16_has_no_python_view() -> None:
    with pytest.raises(TypeError):
        Tensor(dtype="bfloat16", shape=[2], data=Blob(bytes(4))).tolist()


# --- schema evolution -----------------------------------------------------------------------------


class HeartbeatV2(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="heartbeat"):
    """A `Heartbeat` as a newer sender defines it: one more field at the end."""

    inflight: int = 0
    incarnation: str = ""
    load: float = 0.0


class EpisodeAssignmentV2(msgspec.Struct, kw_only=True, tag_field="type", tag="episode_assignment"):
    episode_id: str
    task_id: str
    task: dict
    group_id: str
    priority: list[int] = []


def test_newer_sender_with_extra_field_still_decodes() -> None:
    codec = Codec()
    hdr = codec.encode_header(make_header(IDS, "new"))
    body = msgspec.msgpack.encode(HeartbeatV2(inflight=4, incarnation="abc", load=0.9))
    assert "load" in msgpack.unpackb(body)
    _, msg = codec.decode([hdr, body], CHANNELS["diag"])
    assert msg == Heartbeat(inflight=4, incarnation="abc")

    body = msgspec.msgpack.encode(
        EpisodeAssignmentV2(episode_id="e", task_id="t", task={}, group_id="g", priority=[1, 2])
    )
    _, msg = codec.decode([hdr, body], CHANNELS["coordinator"])
    assert msg == EpisodeAssignment(episode_id="e", task_id="t", task={}, group_id="g")


def test_body_missing_defaulted_fields_decodes_with_defaults() -> None:
    codec = Codec()
    hdr = codec.encode_header(make_header(IDS, "old"))
    body = msgpack.packb(
        {"type": "episode_assignment", "episode_id": "e", "task_id": "t", "task": {"k": 1}, "group_id": "g"}
    )
    _, msg = codec.decode([hdr, body], CHANNELS["coordinator"])
    assert msg.max_steps == 15 and msg.mode == "train" and msg.sample_index == 0 and msg.domain == ""
    assert msg.task == {"k": 1}


def test_body_missing_required_field_is_schema() -> None:
    codec = Codec()
    hdr = codec.encode_header(make_header(IDS, "old"))
    body = msgpack.packb({"type": "episode_assignment", "episode_id": "e", "task_id": "t", "task": {}})
    with pytest.raises(CodecError) as info:
        codec.decode([hdr, body], CHANNELS["coordinator"])
    assert info.value.code == "schema"


class ChatMessageV1(msgspec.Struct, frozen=True, kw_only=True):
    """A `ChatMessage` as guirl defined it before `tools`."""

    role: str
    parts: list[TextPart | ImagePart]


def test_chat_message_tools_travel_and_stay_off_the_wire_when_empty() -> None:
    """`ChatMessage.tools` (GUI-RL's prompt style) crosses the policy channel whole; a message without
    tools encodes byte for byte as before the field existed, and an older peer reads one with tools."""
    plain = ChatMessage(role="system", parts=[TextPart("sys")])
    assert msgspec.msgpack.encode(plain) == msgspec.msgpack.encode(
        ChatMessageV1(role="system", parts=[TextPart("sys")])
    )
    spec = '{"type": "function", "function": {"name": "computer_use"}}'
    req = PolicyRequest(
        episode_id="e", step=0, messages=[ChatMessage(role="system", parts=[TextPart("sys")], tools=[spec])]
    )
    _, got = Codec().decode(Codec().encode(make_header(IDS, "w"), req), CHANNELS["policy"])
    assert got.messages[0].tools == [spec] and got == req
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(req.messages[0]), type=ChatMessageV1)
    assert old == ChatMessageV1(role="system", parts=[TextPart("sys")])
    with pytest.raises(msgspec.ValidationError):  # bounded on decode
        msgspec.msgpack.decode(
            msgspec.msgpack.encode({"role": "system", "parts": [], "tools": ["{}"] * 17}), type=ChatMessage
        )


# --- header ---------------------------------------------------------------------------------------


def test_make_header_fills_version_ids_and_time() -> None:
    ids = IdGen()
    h = make_header(ids, "learner", policy_version=7, reply_to="abc-1", now=123.5)
    assert h == Header(PROTOCOL_VERSION, h.msg_id, "learner", 123.5, 7, "abc-1")
    assert h.msg_id
    before = time.time()
    h2 = make_header(ids, "learner")
    assert before <= h2.sent_at <= time.time()
    assert h2.policy_version == -1 and h2.reply_to == "" and h2.v == PROTOCOL_VERSION
    assert h2.msg_id != h.msg_id


def test_ids_unique_within_and_across_generators() -> None:
    a, b = IdGen(), IdGen()
    first = [a() for _ in range(10_000)]
    second = [b() for _ in range(10_000)]
    assert len(set(first)) == 10_000
    assert len(set(first) | set(second)) == 20_000


def test_header_round_trips() -> None:
    codec = Codec()
    h = make_header(IDS, "w0", policy_version=3, reply_to="x-9")
    assert codec.decode_header(codec.encode_header(h)) == h


def test_other_protocol_version_is_version_error_with_header() -> None:
    codec = Codec()
    h = Header(PROTOCOL_VERSION + 1, "id-1", "future", 1.0)
    for call in (
        lambda: codec.decode_header(codec.encode_header(h)),
        lambda: codec.decode([codec.encode_header(h), codec.encode(h, Heartbeat())[1]], ANY),
    ):
        with pytest.raises(CodecError) as info:
            call()
        assert info.value.code == "version"
        assert info.value.header == h


def test_oversized_header_is_too_large() -> None:
    codec = Codec()
    oversized = Header(PROTOCOL_VERSION, "id", "s" * MAX_HEADER_BYTES, 1.0)
    with pytest.raises(CodecError) as refused:  # never sent by guirl ...
        codec.encode_header(oversized)
    assert refused.value.code == "too_large"
    big = msgspec.msgpack.encode(oversized)  # ... but a hostile peer can
    assert len(big) > MAX_HEADER_BYTES == 4096
    body = codec.encode(make_header(IDS, "a"), Heartbeat())[1]
    with pytest.raises(CodecError) as info:
        codec.decode([big, body], ANY)
    assert info.value.code == "too_large"
    assert info.value.header is None
    fits = codec.encode_header(Header(PROTOCOL_VERSION, "id", "s" * (MAX_HEADER_BYTES - 100), 1.0))
    assert len(fits) <= MAX_HEADER_BYTES
    assert codec.decode([fits, body], ANY)[0].sender == "s" * (MAX_HEADER_BYTES - 100)


def test_garbage_header_is_decode_error_without_header() -> None:
    codec = Codec()
    body = codec.encode(make_header(IDS, "a"), Heartbeat())[1]
    for bad in (b"", b"\xc1", msgpack.packb({"v": 1}), msgpack.packb([1, "id"])):
        with pytest.raises(CodecError) as info:
            codec.decode([bad, body], ANY)
        assert info.value.code == "decode" and info.value.header is None
