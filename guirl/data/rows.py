"""Single-step GUI grounding rows (GUI-R1's data): load them from Parquet or JSONL, write them back.

A row is one screenshot, one instruction and the ground-truth action: GUI-R1's public release
(NOTES.md, "GUI-R1") in Parquet, or our JSONL with images as files beside it. Loading checks every
row and stops at the first broken one with a `RowError` naming the file and the row; `skip_bad=True`
skips broken rows instead and collects their errors. A data error that silently became a zero
reward would look like a model that cannot learn.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import json
import logging
import math
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from PIL import Image

from guirl.agent.unified import NO_INPUT_TEXT, NO_POINT  # GUI-R1's "no text" and "no location" (one home)
from guirl.errors import InputError

log = logging.getLogger(__name__)

MAX_SIDE = 8192
"""Images wider or taller than this are refused (a decompression bomb, or not a screenshot)."""
BBOX_TOLERANCE = 1e-3
"""How far outside [0, 1] a relative coordinate may stray (rounding in the source) before it is an error."""
POINT_ACTIONS = frozenset({"click", "long_press"})
"""Actions whose answer is a point: they need a `gt_bbox`; every other action answers `NO_POINT`."""
TASK_TYPES = ("high", "low")
REQUIRED_COLUMNS = ("image", "instruction", "gt_action")
_BATCH_ROWS = 64  # Parquet rows decoded to Python at a time: a few screenshots, never the whole file


@dataclass(frozen=True, kw_only=True)
class GroundingRow:
    """One screenshot, one instruction, the ground-truth action (coordinates relative, 0-1)."""

    id: str
    """Unique within its dataset: the file's `id` column, else `<file stem>:<row index>`."""
    image: bytes
    """The encoded image (PNG or JPEG) as stored."""
    width: int
    """Decoded image width in pixels."""
    height: int
    """Decoded image height in pixels."""
    instruction: str
    history: str = ""
    """Text of the earlier actions (GUI-R1's `history`)."""
    task_type: str = "high"
    """`high`: the full action set is allowed; `low`: click only."""
    gt_action: str
    """GUI-R1's action name as given, lower-cased and stripped (click, type, scroll, press_back, ...)."""
    gt_bbox: tuple[float, ...] = ()
    """A point (x, y) or a box (x1, y1, x2, y2), relative to the image; () when the action has none."""
    gt_input_text: str = ""
    """Text to type/select, or the scroll direction; "" for GUI-R1's 'no input text'."""
    domain: str = ""
    """Platform or source (desktop, mobile, web, synth-button, ...), for per-domain reporting."""
    response: str = ""
    """A ground-truth response text when the row carries one (for SFT); see `gui_r1_answer`."""


class RowError(InputError):
    """A dataset file or one of its rows is unusable; the message names the file, the row and the problem."""

    def __init__(
        self,
        path: str | Path,
        problem: str,
        *,
        index: int | None = None,
        row_id: str | None = None,
        line: int | None = None,
    ) -> None:
        self.path, self.problem, self.index, self.row_id, self.line = str(path), problem, index, row_id, line
        where = self.path
        if index is not None:
            where += f" row {index}"
            details = [f"line {line}"] if line is not None else []
            if row_id:
                details.append(f"id {row_id!r}")
            if details:
                where += f" ({', '.join(details)})"
        super().__init__(f"{where}: {problem}")


def load_rows(
    path: str | Path,
    *,
    limit: int = 0,
    image_root: str | Path | None = None,
    skip_bad: bool = False,
    errors: list[RowError] | None = None,
) -> list[GroundingRow]:
    """The rows of a `.parquet` (GUI-R1's layout) or `.jsonl` file, checked; the first `limit` (0 = all).

    Image paths are relative to the file's directory, or to `image_root` when given (which also admits
    absolute paths under it). A broken row raises `RowError`; with `skip_bad` it is skipped and its
    error appended to `errors` (when given). A file that cannot be read at all always raises.
    """
    path = Path(path)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        records = _parquet_records(path)
    elif suffix == ".jsonl":
        records = _jsonl_records(path)
    else:
        raise RowError(path, "unknown format: expected a .parquet or .jsonl file")
    base = Path(image_root) if image_root is not None else path.parent
    rows: list[GroundingRow] = []
    first_seen: dict[str, int] = {}
    skipped = 0
    with contextlib.closing(records):  # a limit stops early: close the file now
        for index, line, record in records:
            try:
                if isinstance(record, RowError):
                    raise record
                row = _to_row(record, path=path, index=index, line=line, base=base, image_root=image_root)
                if row.id in first_seen:
                    raise RowError(
                        path,
                        f"duplicate id (first at row {first_seen[row.id]})",
                        index=index,
                        line=line,
                        row_id=row.id,
                    )
            except RowError as exc:
                if not skip_bad:
                    raise
                skipped += 1
                if errors is not None:
                    errors.append(exc)
                continue
            first_seen[row.id] = index
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    if skipped:
        log.warning("%s: skipped %d broken rows, loaded %d", path, skipped, len(rows))
    return rows


Record = dict[str, Any] | RowError
"""A row as read (or the RowError for a line that is not one)."""
Bad = Callable[[str], RowError]
"""Makes the RowError naming the row being read."""


def _jsonl_records(path: Path) -> Iterator[tuple[int, int | None, Record]]:
    try:
        f = open(path, "rb")  # closed by the `with` below; an open error gets its own message
    except OSError as exc:
        raise RowError(path, f"cannot read: {exc.strerror or exc}") from None
    with f:
        index = 0
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # blank lines (a trailing one, say) are not rows
            try:
                record: Record = json.loads(raw)
            except (UnicodeDecodeError, ValueError) as exc:
                record = RowError(path, f"not valid JSON: {exc}", index=index, line=number)
            if not isinstance(record, dict | RowError):
                record = RowError(
                    path, f"not a JSON object (a {type(record).__name__})", index=index, line=number
                )
            yield index, number, record
            index += 1


def _parquet_records(path: Path) -> Iterator[tuple[int, int | None, Record]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise RowError(path, f"not a readable Parquet file: {exc}") from None
    names = parquet.schema_arrow.names
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise RowError(path, f"missing column(s) {', '.join(missing)} (has {', '.join(names)})")
    # only the columns a row uses: GUI-R1's files carry others (verify_bbox, success_rate, scale, ...)
    columns = [c for c in names if c in _ROW_COLUMNS]
    index = 0
    try:
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
            for record in batch.to_pylist():
                yield index, None, record
                index += 1
    except (OSError, pa.ArrowException) as exc:
        raise RowError(path, f"cannot read row {index} on: {exc}") from None


_ROW_COLUMNS = frozenset(
    {
        "id",
        "image",
        "width",
        "height",
        "instruction",
        "history",
        "task_type",
        "gt_action",
        "gt_bbox",
        "gt_input_text",
        "domain",
        "group",
        "platform",
        "response",
    }
)


def _to_row(
    record: dict[str, Any],
    *,
    path: Path,
    index: int,
    line: int | None,
    base: Path,
    image_root: str | Path | None,
) -> GroundingRow:
    raw_id = record.get("id")
    row_id = f"{path.stem}:{index}" if raw_id is None or raw_id == "" else str(raw_id)

    def bad(problem: str) -> RowError:
        return RowError(path, problem, index=index, line=line, row_id=row_id)

    instruction = record.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise bad("missing or empty instruction")
    gt_action = record.get("gt_action")
    if not isinstance(gt_action, str) or not gt_action.strip():
        raise bad("missing or empty gt_action")
    gt_action = gt_action.strip().lower()
    task_type = _text(record.get("task_type"), "task_type", bad).strip().lower() or "high"
    if task_type not in TASK_TYPES:
        raise bad(f"task_type must be one of {', '.join(TASK_TYPES)}, got {task_type!r}")
    history = record.get("history")
    if isinstance(history, list):  # some converted sets keep the steps as a list
        history = " | ".join(str(step) for step in history)
    input_text = _text(record.get("gt_input_text"), "gt_input_text", bad)
    if input_text.strip().lower() == NO_INPUT_TEXT:
        input_text = ""
    gt_bbox = _bbox(record.get("gt_bbox"), bad)
    if gt_action in POINT_ACTIONS and not gt_bbox:
        raise bad(
            f"gt_action {gt_action!r} needs a gt_bbox (a point or a box), got {record.get('gt_bbox')!r}"
        )
    image = _image_bytes(record.get("image"), base=base, image_root=image_root, bad=bad)
    width, height = _image_size(image, bad)
    declared = (record.get("width"), record.get("height"))
    if declared != (None, None) and declared != (width, height):
        raise bad(f"width/height say {declared[0]}x{declared[1]} but the image is {width}x{height}")
    # GUI-R1's ScreenSpot files name the platform `group`; ours write `domain`
    domain = record.get("domain") or record.get("group") or record.get("platform") or ""
    return GroundingRow(
        id=row_id,
        image=image,
        width=width,
        height=height,
        instruction=instruction,
        history=_text(history, "history", bad),
        task_type=task_type,
        gt_action=gt_action,
        gt_bbox=gt_bbox,
        gt_input_text=input_text,
        domain=str(domain),
        response=_text(record.get("response"), "response", bad),
    )


def _text(value: Any, name: str, bad: Bad) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad(f"{name} must be text, got {type(value).__name__}")
    return value


def _bbox(value: Any, bad: Bad) -> tuple[float, ...]:
    if value is None or (isinstance(value, list | tuple) and not value):
        return ()
    if not isinstance(value, list | tuple) or len(value) not in (2, 4):
        raise bad(f"gt_bbox must be 2 numbers (a point) or 4 (a box), got {value!r}")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise bad(f"gt_bbox must hold numbers, got {value!r}")
    coords = tuple(float(v) for v in value)
    if not all(math.isfinite(v) for v in coords):
        raise bad(f"gt_bbox has a non-finite value: {value!r}")
    if all(v == NO_POINT[0] for v in coords):
        return ()
    if not all(-BBOX_TOLERANCE <= v <= 1 + BBOX_TOLERANCE for v in coords):
        raise bad(
            f"gt_bbox {value!r} is outside [0, 1]: coordinates must be relative to the image, not pixels"
        )
    if len(coords) == 4 and (coords[2] < coords[0] or coords[3] < coords[1]):
        raise bad(f"gt_bbox {value!r} is not (x1, y1, x2, y2) with x1 <= x2 and y1 <= y2")
    return tuple(min(max(v, 0.0), 1.0) for v in coords)


def _image_bytes(value: Any, *, base: Path, image_root: str | Path | None, bad: Bad) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return _read_image_file(value, base=base, image_root=image_root, bad=bad)
    if isinstance(value, dict):
        data = value.get("bytes")
        if isinstance(data, bytes | bytearray) and data:
            return bytes(data)
        if isinstance(data, str) and data:
            try:
                return base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise bad("image bytes are not valid base64") from None
        if data not in (None, b"", ""):
            raise bad(f"image bytes must be binary or base64 text, got {type(data).__name__}")
        if isinstance(value.get("path"), str) and value["path"]:
            return _read_image_file(value["path"], base=base, image_root=image_root, bad=bad)
        raise bad("image has neither bytes nor a path")
    if value is None:
        raise bad("missing image")
    raise bad(f"image must be a path, {{'bytes': ...}} or {{'path': ...}}, got {type(value).__name__}")


def _read_image_file(name: str, *, base: Path, image_root: str | Path | None, bad: Bad) -> bytes:
    # Only files under the dataset's directory: a row must not make us read (and ship to a model or a
    # log) an arbitrary file of this machine.
    rel = PurePath(name)
    if rel.is_absolute():
        root = os.path.normpath(image_root) if image_root is not None else None
        if root is None or not PurePath(os.path.normpath(name)).is_relative_to(root):
            raise bad(f"image path {name!r} is absolute (allowed only under image_root)")
        full = Path(name)
    elif ".." in rel.parts:
        raise bad(f"image path {name!r} leaves the dataset directory")
    else:
        full = base / rel
    try:
        return full.read_bytes()
    except OSError as exc:
        raise bad(f"image {name!r} cannot be read: {exc.strerror or exc}") from None


def _image_size(data: bytes, bad: Bad) -> tuple[int, int]:
    """The decoded size, from the header; `verify` also checks a PNG's chunks (a JPEG only superficially)
    without decoding pixels, which would cost more than the rest of loading."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width <= MAX_SIDE and height <= MAX_SIDE:
                    img.verify()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise bad(f"image is too large (more than {MAX_SIDE}x{MAX_SIDE})") from None
    except Exception as exc:  # PIL raises many types for bad data (OSError, SyntaxError, struct.error, ...)
        raise bad(f"image cannot be decoded: {type(exc).__name__}: {exc}") from None
    if width > MAX_SIDE or height > MAX_SIDE:
        raise bad(f"image is {width}x{height}, larger than {MAX_SIDE}x{MAX_SIDE}")
    return width, height


def gui_r1_answer(row: GroundingRow, *, size: tuple[int, int] | None = None) -> str:
    """GUI-R1's answer list for the row's ground truth, e.g.
    `[{'action': 'click', 'point': [412, 230], 'input_text': 'no input text'}]`.

    The point is the centre of `gt_bbox` in pixels of an image of `size` (width, height; default the
    row's own), so a caller that resizes the screenshot for the policy passes the resized size.
    Actions other than click answer GUI-R1's `[-100, -100]`."""
    width, height = size or (row.width, row.height)
    point = list(NO_POINT)
    if row.gt_action in POINT_ACTIONS and row.gt_bbox:
        box = row.gt_bbox
        cx, cy = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2) if len(box) == 4 else box
        point = [min(round(cx * width), width - 1), min(round(cy * height), height - 1)]
    return repr([{"action": row.gt_action, "point": point, "input_text": row.gt_input_text or NO_INPUT_TEXT}])


def _record(row: GroundingRow) -> dict[str, Any]:
    """A row in GUI-R1's field names and conventions ('no input text', [-100, -100]), plus ours."""
    return {
        "id": row.id,
        "width": row.width,
        "height": row.height,
        "instruction": row.instruction,
        "history": row.history,
        "task_type": row.task_type,
        "gt_action": row.gt_action,
        "gt_bbox": [float(v) for v in row.gt_bbox] if row.gt_bbox else [float(v) for v in NO_POINT],
        "gt_input_text": row.gt_input_text or NO_INPUT_TEXT,
        "domain": row.domain,
        "response": row.response,
    }


def _image_suffix(data: bytes) -> str:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return ".png"
    if data.startswith(b"\xff\xd8\xff"):
        return ".jpg"
    with Image.open(io.BytesIO(data)) as img:
        return f".{(img.format or 'img').lower()}"


def write_rows_jsonl(rows: Iterable[GroundingRow], path: str | Path, *, images_dir: str = "images") -> None:
    """Write `rows` as JSONL with each image a file under `images_dir` beside it, named by its content's
    hash (rows sharing a screenshot share the file; an earlier file's images stay valid). The JSONL is
    written to a temporary name and renamed into place."""
    path = Path(path)
    if PurePath(images_dir).is_absolute() or ".." in PurePath(images_dir).parts:
        raise ValueError(
            f"images_dir must be a relative folder inside the output directory, got {images_dir!r}"
        )
    folder = path.parent / images_dir
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                name = hashlib.sha256(row.image).hexdigest()[:24] + _image_suffix(row.image)
                target = folder / name
                if not target.exists():
                    part = folder / f".{name}.tmp"
                    part.write_bytes(row.image)
                    os.replace(part, target)
                record = {"image": PurePath(images_dir, name).as_posix(), **_record(row)}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_rows_parquet(rows: Iterable[GroundingRow], path: str | Path, *, row_group_rows: int = 256) -> None:
    """Write `rows` as Parquet in GUI-R1's layout (`image` a {"bytes", "path"} struct with the bytes
    embedded), plus our `id`, `width`, `height`, `domain` and `response`; atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("instruction", pa.string()),
            ("history", pa.string()),
            ("task_type", pa.string()),
            ("gt_action", pa.string()),
            ("gt_bbox", pa.list_(pa.float64())),
            ("gt_input_text", pa.string()),
            ("id", pa.string()),
            ("width", pa.int32()),
            ("height", pa.int32()),
            ("domain", pa.string()),
            ("response", pa.string()),
        ]
    )
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")

    def flush(batch: list[dict[str, Any]]) -> None:
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        batch.clear()

    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append({"image": {"bytes": row.image, "path": None}, **_record(row)})
                if len(batch) >= row_group_rows:
                    flush(batch)
            if batch:
                flush(batch)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
