"""`WeightSource`, the tagged union a `WeightsPublished` carries to the broker (and the broker to each
engine): it round-trips through msgspec, and a malformed one is refused on decode, at the broker's
boundary, instead of half-way through an update."""

from __future__ import annotations

import msgspec
import pytest

from guirl.messages import CHANNELS, Codec, IdGen, make_header
from guirl.messages.types import WeightsPublished
from guirl.messages.weights import (
    SGLangBucket,
    WeightGroupSpec,
    WeightsFromBroadcast,
    WeightsFromDisk,
    WeightSource,
)

GROUP = WeightGroupSpec(
    host="10.0.0.1", port=29600, world_size=3, group_name="g", layout="sglang", timeout_s=5, join_timeout_s=2
)
BUCKETS = [
    SGLangBucket(names=["a.weight", "a.bias"], dtypes=["bfloat16", "float32"], shapes=[[4, 2], [4]]),
    SGLangBucket(names=["mask"], dtypes=["bool"], shapes=[[]]),
]
SOURCES: list[WeightSource] = [
    WeightsFromDisk(path="/run/weights/v000003"),
    WeightsFromBroadcast(group=GROUP, buckets=BUCKETS),
    WeightsFromBroadcast(group=msgspec.structs.replace(GROUP, layout="guirl", backend="nccl")),
]


def _decode(doc: object) -> WeightSource:
    return msgspec.json.decode(msgspec.json.encode(doc), type=WeightSource)


def _doc(source: WeightSource) -> dict:
    return msgspec.to_builtins(source)


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: type(s).__name__)
def test_a_source_round_trips(source: WeightSource) -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(source), type=WeightSource) == source
    assert _decode(_doc(source)) == source
    # and inside the message, through the codec, on the broker's channel
    msg = WeightsPublished(version=3, epoch=1, learner_step=3, source=source)
    codec, ids = Codec(), IdGen()
    _, got = codec.decode(codec.encode(make_header(ids, "learner"), msg), CHANNELS["policy"])
    assert got == msg and type(got.source) is type(source)


def test_the_tags_name_the_source() -> None:
    assert _doc(SOURCES[0]) == {"type": "weights_from_disk", "path": "/run/weights/v000003"}
    assert _doc(SOURCES[1])["type"] == "weights_from_broadcast"
    assert WeightsPublished(version=1).source is None  # the coordinator's copy names none


def _broadcast(**bucket: object) -> dict:
    doc = _doc(SOURCES[1])
    doc["buckets"][0].update(bucket)
    return doc


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({"type": "weights_from_s3", "path": "x"}, "Invalid value 'weights_from_s3'"),
        ({"path": "x"}, "missing required field `type`"),
        (_broadcast(dtypes=["bfloat16"]), "2 names, 1 dtypes, 2 shapes"),
        (_broadcast(shapes=[[4, 2]]), "2 names, 2 dtypes, 1 shapes"),
        (_broadcast(names=[], dtypes=[], shapes=[]), r"length >= 1 - at `\$.buckets\[0\].names`"),
        (_broadcast(names="a.weight"), r"Expected `array`, got `str`"),
        (_broadcast(shapes=[[4, -2], [4]]), r"Expected `int` >= 0 - at `\$.buckets\[0\].shapes\[0\]\[1\]`"),
        (_broadcast(shapes=[[1] * 9, [4]]), r"length <= 8"),
        (
            _broadcast(dtypes=["torch.bfloat16", "float32"]),
            r"matching regex .* - at `\$.buckets\[0\].dtypes\[0\]`",
        ),
        ({**_doc(SOURCES[1]), "buckets": []}, "needs its bucket plan"),
        ({**_doc(SOURCES[2]), "buckets": _doc(SOURCES[1])["buckets"]}, "carries no bucket plan"),
        ({**_doc(SOURCES[1]), "group": {**_doc(GROUP), "port": 70000}}, r"<= 65535 - at `\$.group.port`"),
        ({**_doc(SOURCES[1]), "group": {**_doc(GROUP), "world_size": 1}}, r">= 2 - at `\$.group.world_size`"),
        ({**_doc(SOURCES[1]), "group": {**_doc(GROUP), "backend": "mpi"}}, "Invalid enum value 'mpi'"),
        ({**_doc(SOURCES[1]), "group": {**_doc(GROUP), "timeout_s": 0}}, r"> 0.0 - at `\$.group.timeout_s`"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_a_malformed_source_is_refused_on_decode(doc: dict, error: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=error):
        _decode(doc)


def test_a_malformed_message_is_refused_at_the_boundary() -> None:
    """The broker's mailbox decodes with its channel's union: a bad plan never reaches a handler."""
    msg = msgspec.to_builtins(WeightsPublished(version=2, source=SOURCES[1]))
    msg["source"]["buckets"][0]["dtypes"] = ["bfloat16"]
    with pytest.raises(msgspec.ValidationError, match="2 names, 1 dtypes, 2 shapes"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=CHANNELS["policy"])


def test_construction_is_checked_too() -> None:
    with pytest.raises(ValueError, match="1 names, 2 dtypes, 1 shapes"):
        SGLangBucket(names=["a"], dtypes=["float32", "float32"], shapes=[[1]])
    with pytest.raises(ValueError, match="world_size"):
        WeightGroupSpec("h", 1, world_size=1)
    with pytest.raises(ValueError, match="bucket plan"):
        WeightsFromBroadcast(group=GROUP)
