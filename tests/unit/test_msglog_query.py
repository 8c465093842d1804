"""Message-log queries: record filters, JSON export, screenshot export."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import msgpack
import pytest
from PIL import Image as PILImage

from guirl.messages import Blob, Codec, IdGen, make_header
from guirl.messages.types import EpisodeEnded, Image, PolicyRequest, Tensor
from guirl.msglog import LogReader, Record, Recorder, RecordFilter, export_screenshots, record_to_json

IDS = IdGen()


def picture(color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (8, 6), color).save(out, format=fmt)
    return out.getvalue()


def request(episode: str, *screens: bytes, sender: str = "env0") -> list:
    msg = PolicyRequest(
        episode_id=episode,
        step=0,
        images=[Image(data=Blob(s), width=8, height=6) for s in screens],
        prompt_ids=Tensor.from_list([1, 2, 3]),
    )
    return Codec().encode(make_header(IDS, sender), msg)


@pytest.fixture
def log(tmp_path: Path) -> tuple[LogReader, list[Record]]:
    red, blue, jpeg = picture((255, 0, 0)), picture((0, 0, 255)), picture((0, 255, 0), "JPEG")
    wrapped = msgpack.packb({"type": "batch", "items": [{"episode_id": "e3"}]})
    with Recorder(tmp_path / "log", "env0", actor="env0") as rec:
        for t, (direction, frames) in enumerate(
            [
                ("out", request("e1", red, blue)),
                ("out", request("e2", red, jpeg)),  # red again: exported once
                (
                    "in",
                    Codec().encode(
                        make_header(IDS, "coordinator"), EpisodeEnded(episode_id="e1", status="completed")
                    ),
                ),
                ("in", [Codec().encode_header(make_header(IDS, "broker")), wrapped]),
            ]
        ):
            rec.record(direction, "main", "peer", frames[0], frames[1], frames[2:], t=10.0 + t)
    reader = LogReader([tmp_path / "log"])
    return reader, list(reader)


def kept(records: list[Record], **kw) -> list[int]:
    flt = RecordFilter(**kw)
    return [r.index for r in records if flt.match(r)]


def test_filters(log: tuple[LogReader, list[Record]]) -> None:
    _, records = log
    assert kept(records) == [0, 1, 2, 3]
    assert kept(records, types={"policy_request"}) == [0, 1]
    assert kept(records, types={"episode_ended", "batch"}) == [2, 3]
    assert kept(records, episode="e1") == [0, 2]
    assert kept(records, episode="e3") == [3]  # nested one level into the body
    assert kept(records, actor="env0") == [0, 1, 2, 3]  # the recording actor
    assert kept(records, actor="coordinator") == [2]  # the header's sender
    assert kept(records, actor="nobody") == []
    assert kept(records, direction="in") == [2, 3]
    assert kept(records, since=11.0, until=13.0) == [1, 2]
    assert kept(records, types={"policy_request"}, episode="e2", direction="out") == [1]


def test_record_to_json(log: tuple[LogReader, list[Record]]) -> None:
    reader, records = log
    docs = [record_to_json(r) for r in records]
    text = json.dumps(docs, allow_nan=False)
    first = json.loads(text)[0]
    assert first["type"] == "policy_request" and first["t"] == 10.0 and first["dir"] == "out"
    assert first["header"]["sender"] == "env0"
    red = records[0].body["images"][0]["data"].hash
    assert first["body"]["images"][0]["data"] == {"blob": red, "size": len(reader.blob(red))}
    assert first["body"]["prompt_ids"]["data"]["size"] == 12
    with_bytes = dataclasses.replace(records[0], body={"x": b"abc", 1: float("nan")})
    assert record_to_json(with_bytes)["body"] == {"x": {"bytes": 3}, "1": "nan"}


def test_export_screenshots_once_each(log: tuple[LogReader, list[Record]], tmp_path: Path) -> None:
    reader, records = log
    out = tmp_path / "shots"
    paths = export_screenshots(reader, records, out)
    assert [p.name for p in paths] == [
        "000000_policy_request_1.png",
        "000000_policy_request_2.png",
        "000001_policy_request_2.jpg",
    ]  # frame 0 of each request is the prompt-token tensor
    assert sorted(out.iterdir()) == sorted(paths)  # the token tensor blob is not an image
    colours = []
    for p in paths:
        with PILImage.open(p) as im:
            assert im.size == (8, 6)
            colours.append(im.convert("RGB").getpixel((0, 0)))
    assert colours[0] == (255, 0, 0) and colours[1] == (0, 0, 255)
    assert paths[0].read_bytes() == reader.blob(records[0].body["images"][0]["data"].hash)
    # Only the records given are exported.
    again = export_screenshots(reader, records[1:2], tmp_path / "one")
    assert [p.name for p in again] == ["000001_policy_request_1.png", "000001_policy_request_2.jpg"]
