"""Grounding rows: JSONL and Parquet loaders (ours and GUI-R1's layout), every RowError, skip_bad, limit."""

from __future__ import annotations

import base64
import io
import json
import math
import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from guirl.data.rows import (
    GroundingRow,
    RowError,
    gui_r1_answer,
    load_rows,
    write_rows_jsonl,
    write_rows_parquet,
)


def png(width: int = 40, height: int = 30, color: tuple[int, int, int] = (10, 200, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


def jpeg(width: int = 48, height: int = 32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buf, "JPEG")
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height`, with no pixel data (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def make_rows() -> list[GroundingRow]:
    return [
        GroundingRow(
            id="a",
            image=png(),
            width=40,
            height=30,
            instruction="Click the 'Save' button",
            task_type="low",
            gt_action="click",
            gt_bbox=(0.25, 0.5, 0.75, 1.0),
            domain="desktop",
            response="<think> x </think> <answer>[]</answer>",
        ),
        GroundingRow(
            id="b",
            image=jpeg(),
            width=48,
            height=32,
            instruction="Type 'it's me' in the Name field",
            history="Step 1: clicked Name",
            gt_action="type",
            gt_bbox=(0.1, 0.2),
            gt_input_text="it's me",
        ),
        GroundingRow(id="c", image=png(), width=40, height=30, instruction="Go back", gt_action="press_back"),
    ]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def good(**overrides) -> dict:
    record = {
        "image": {"bytes": base64.b64encode(png()).decode()},
        "instruction": "Click OK",
        "gt_action": "click",
        "gt_bbox": [0.1, 0.1, 0.2, 0.2],
    }
    record.update(overrides)
    return {k: v for k, v in record.items() if v is not ...}


# --- round trips -----------------------------------------------------------------------------------


def test_jsonl_round_trip_with_image_files(tmp_path):
    rows = make_rows()
    write_rows_jsonl(rows, tmp_path / "rows.jsonl")
    assert load_rows(tmp_path / "rows.jsonl") == rows
    lines = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [line["image"].split("/")[0] for line in lines] == ["images"] * 3
    assert lines[1]["image"].endswith(".jpg") and lines[0]["image"].endswith(".png")
    assert lines[0]["image"] == lines[2]["image"]  # same screenshot, one file
    assert lines[2]["gt_bbox"] == [-100, -100] and lines[2]["gt_input_text"] == "no input text"
    assert len(list((tmp_path / "images").iterdir())) == 2
    assert not list(tmp_path.glob(".*.tmp"))


def test_parquet_round_trip(tmp_path):
    rows = make_rows()
    write_rows_parquet(rows, tmp_path / "rows.parquet", row_group_rows=2)
    assert load_rows(tmp_path / "rows.parquet") == rows
    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.schema.field("image").type == pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def test_jsonl_image_forms_and_defaults(tmp_path):
    (tmp_path / "shots").mkdir()
    (tmp_path / "shots" / "one.png").write_bytes(png(64, 48))
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"image": "shots/one.png", "instruction": "a", "gt_action": " CLICK ", "gt_bbox": [0.5, 0.5]},
            "",  # a blank line is no row
            {"image": {"bytes": base64.b64encode(jpeg()).decode()}, "instruction": "b", "gt_action": "enter"},
            {
                "image": {"path": "shots/one.png"},
                "instruction": "c",
                "gt_action": "scroll",
                "gt_input_text": "down",
                "task_type": "High",
                "gt_bbox": None,
            },
        ],
    )
    rows = load_rows(path)
    assert [r.id for r in rows] == ["mixed:0", "mixed:1", "mixed:2"]
    assert [(r.width, r.height) for r in rows] == [(64, 48), (48, 32), (64, 48)]
    assert rows[0].gt_action == "click" and rows[0].gt_bbox == (0.5, 0.5) and rows[0].task_type == "high"
    assert rows[1].gt_bbox == () and rows[1].gt_input_text == "" and rows[1].history == ""
    assert rows[2].gt_input_text == "down" and rows[2].task_type == "high"


def test_image_root(tmp_path):
    root = tmp_path / "pics"
    root.mkdir()
    (root / "x.png").write_bytes(png())
    data = tmp_path / "data"
    data.mkdir()
    path = write_jsonl(data / "r.jsonl", [good(image="x.png"), good(image=str(root / "x.png"))])
    assert len(load_rows(path, image_root=root)) == 2
    with pytest.raises(RowError, match="row 0.*cannot be read"):
        load_rows(path)  # relative to the file's directory without image_root


def test_gui_r1_parquet_layout(tmp_path):
    """A file as GUI-R1 publishes it: `image` a {bytes, path} struct, no id, extra columns, more rows than a
    batch, a path-only image, GUI-R1's [-100, -100] and 'no input text'."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "p.png").write_bytes(png(20, 10))
    n = 70
    images = [{"bytes": png(32, 24), "path": f"orig_{i}.png"} for i in range(n - 1)]
    images.append({"bytes": None, "path": "img/p.png"})
    table = pa.table(
        {
            "image": pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "instruction": [f"do {i}" for i in range(n)],
            "history": ["None"] * n,
            "task_type": ["high", "low"] * (n // 2),
            "gt_action": ["click"] * (n - 2) + ["press_back", "type"],
            "gt_bbox": [[0.1, 0.2, 0.3, 0.4]] * (n - 3) + [[0.5, 0.5], [-100.0, -100.0], [-100.0, -100.0]],
            "gt_input_text": ["no input text"] * (n - 1) + ["hello"],
            "verify_bbox": [True] * n,
            "success_rate": [0.5] * n,
            "scale": [[1.0, 1.0]] * n,
            "group": ["mobile"] * n,
        }
    )
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=30)
    rows = load_rows(tmp_path / "train.parquet")
    assert len(rows) == n and rows[0].id == "train:0" and rows[-1].id == f"train:{n - 1}"
    assert (
        rows[0].gt_bbox == (0.1, 0.2, 0.3, 0.4) and rows[0].domain == "mobile" and rows[1].task_type == "low"
    )
    assert rows[n - 3].gt_bbox == (0.5, 0.5)
    assert rows[n - 2].gt_action == "press_back" and rows[n - 2].gt_bbox == ()
    assert rows[-1].gt_input_text == "hello" and (rows[-1].width, rows[-1].height) == (20, 10)
    assert rows[0].gt_input_text == "" and rows[0].history == "None"
    assert [r.id for r in load_rows(tmp_path / "train.parquet", limit=5)] == [f"train:{i}" for i in range(5)]


def test_parquet_path_string_images_and_ids(tmp_path):
    (tmp_path / "a.png").write_bytes(png())
    table = pa.table(
        {
            "id": [7, 8],
            "image": ["a.png", "../a.png"],
            "instruction": ["x", "y"],
            "gt_action": ["click", "click"],
            "gt_bbox": [[0.0, 0.0, 1.0, 1.0]] * 2,
        }
    )
    pq.write_table(table, tmp_path / "ids.parquet")
    with pytest.raises(RowError, match=r"ids\.parquet row 1 \(id '8'\): image path '\.\./a\.png' leaves"):
        load_rows(tmp_path / "ids.parquet")
    assert [r.id for r in load_rows(tmp_path / "ids.parquet", limit=1)] == ["7"]


# --- errors ----------------------------------------------------------------------------------------

BAD_ROWS = {
    "no instruction": (good(instruction=...), "missing or empty instruction"),
    "empty instruction": (good(instruction="  "), "missing or empty instruction"),
    "no gt_action": (good(gt_action=...), "missing or empty gt_action"),
    "bbox of 3": (good(gt_bbox=[0.1, 0.2, 0.3]), "2 numbers .* or 4"),
    "bbox of 1": (good(gt_bbox=[0.1]), "2 numbers .* or 4"),
    "bbox text": (good(gt_bbox="0.1,0.2"), "2 numbers .* or 4"),
    "bbox strings": (good(gt_bbox=["a", "b"]), "must hold numbers"),
    "bbox NaN": (good(gt_bbox=[math.nan, 0.1]), "non-finite"),
    "bbox inf": (good(gt_bbox=[0.1, 0.1, math.inf, 0.2]), "non-finite"),
    "bbox above 1": (good(gt_bbox=[0.5, 1.2]), r"outside \[0, 1\]"),
    "bbox in pixels": (good(gt_bbox=[100, 200, 300, 400]), r"outside \[0, 1\].*not pixels"),
    "bbox negative": (good(gt_bbox=[-0.01, 0.5]), r"outside \[0, 1\]"),
    "x2 < x1": (good(gt_bbox=[0.5, 0.1, 0.2, 0.3]), "x1 <= x2"),
    "y2 < y1": (good(gt_bbox=[0.1, 0.5, 0.2, 0.3]), "y1 <= y2"),
    "click without bbox": (good(gt_bbox=[-100, -100]), "needs a gt_bbox"),
    "bad task_type": (good(task_type="medium"), "task_type must be one of high, low"),
    "no image": (good(image=...), "missing image"),
    "image number": (good(image=5), "image must be a path"),
    "image empty dict": (good(image={}), "neither bytes nor a path"),
    "image bad base64": (good(image={"bytes": "%%%"}), "not valid base64"),
    "image garbage": (good(image={"bytes": base64.b64encode(b"not an image").decode()}), "cannot be decoded"),
    "image truncated": (good(image={"bytes": base64.b64encode(png()[:-20]).decode()}), "cannot be decoded"),
    "image too wide": (
        good(image={"bytes": base64.b64encode(png(8193, 2)).decode()}),
        "larger than 8192x8192",
    ),
    "decompression bomb": (
        good(image={"bytes": base64.b64encode(png_header_only(20000, 20000)).decode()}),
        "too large",
    ),
    "image file missing": (good(image="nope.png"), "'nope.png' cannot be read"),
    "dot-dot path": (good(image="images/../../secret.png"), "leaves the dataset directory"),
    "absolute path": (good(image="/etc/hostname"), "absolute"),
    "size mismatch": (good(width=41, height=30), "width/height say 41x30 but the image is 40x30"),
    "history number": (good(history=3), "history must be text"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_broken_row_is_named(tmp_path, case):
    record, message = BAD_ROWS[case]
    path = write_jsonl(tmp_path / "set.jsonl", [good(id="ok"), {**record, "id": "bad-one"}, good(id="ok2")])
    with pytest.raises(RowError, match=message) as info:
        load_rows(path)
    text = str(info.value)
    assert text.startswith(f"{path} row 1 (line 2, id 'bad-one'): "), text
    assert info.value.index == 1 and info.value.row_id == "bad-one"


def test_jsonl_line_not_an_object_or_not_json(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [good(), "[1, 2]", "{not json"])
    with pytest.raises(RowError, match=r"x\.jsonl row 1 \(line 2\): not a JSON object \(a list\)"):
        load_rows(path)
    errors: list[RowError] = []
    assert len(load_rows(path, skip_bad=True, errors=errors)) == 1
    assert [e.line for e in errors] == [2, 3] and "not valid JSON" in str(errors[1])


def test_duplicate_ids(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [good(id="same"), good(id="other"), good(id="same")])
    with pytest.raises(RowError, match=r"row 2 \(line 3, id 'same'\): duplicate id \(first at row 0\)"):
        load_rows(path)


def test_skip_bad_collects_errors_and_limit_counts_loaded_rows(tmp_path):
    records = [
        good(id="r0"),
        good(id="r1", gt_bbox=[2, 2]),
        good(id="r2"),
        good(id="r3", instruction=""),
        good(id="r4"),
    ]
    path = write_jsonl(tmp_path / "s.jsonl", records)
    errors: list[RowError] = []
    rows = load_rows(path, skip_bad=True, errors=errors)
    assert [r.id for r in rows] == ["r0", "r2", "r4"]
    assert [(e.index, e.row_id) for e in errors] == [(1, "r1"), (3, "r3")]
    assert [r.id for r in load_rows(path, skip_bad=True, limit=2)] == ["r0", "r2"]
    assert [r.id for r in load_rows(path, limit=1)] == ["r0"]  # stops before the broken row


def test_bbox_tolerance_clamps(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [good(gt_bbox=[-0.0005, 0.2, 1.0009, 0.3])])
    assert load_rows(path)[0].gt_bbox == (0.0, 0.2, 1.0, 0.3)


def test_file_level_errors(tmp_path):
    with pytest.raises(RowError, match="expected a .parquet or .jsonl"):
        load_rows(tmp_path / "rows.csv")
    with pytest.raises(RowError, match="cannot read"):
        load_rows(tmp_path / "missing.jsonl", skip_bad=True)
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(RowError, match="not a readable Parquet file"):
        load_rows(tmp_path / "fake.parquet", skip_bad=True)
    pq.write_table(pa.table({"image": [b"x"], "instruction": ["y"]}), tmp_path / "cols.parquet")
    with pytest.raises(RowError, match=r"missing column\(s\) gt_action"):
        load_rows(tmp_path / "cols.parquet")
    with pytest.raises(ValueError, match="limit"):
        load_rows(tmp_path / "rows.jsonl", limit=-1)


# --- the answer text -------------------------------------------------------------------------------


def test_gui_r1_answer():
    click, typed, back = make_rows()
    assert gui_r1_answer(click) == "[{'action': 'click', 'point': [20, 22], 'input_text': 'no input text'}]"
    assert gui_r1_answer(click, size=(400, 300)) == (
        "[{'action': 'click', 'point': [200, 225], 'input_text': 'no input text'}]"
    )
    assert gui_r1_answer(typed) == """[{'action': 'type', 'point': [-100, -100], 'input_text': "it's me"}]"""
    assert (
        gui_r1_answer(back)
        == "[{'action': 'press_back', 'point': [-100, -100], 'input_text': 'no input text'}]"
    )
