"""Selecting, printing and exporting recorded messages: the pieces behind `guirl replay`."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from guirl.msglog.reader import BlobRef, LogReader, Record

_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"\xff\xd8\xff", ".jpg"))


@dataclass(frozen=True)
class RecordFilter:
    """Which records to keep; a field left None keeps everything. Times are half-open: since <= t < until."""

    types: Collection[str] | None = None
    """Body `type` tags to keep."""
    episode: str | None = None
    """Keep messages about this episode (`episode_id` of the body or of a message nested one level in)."""
    actor: str | None = None
    """Keep messages recorded by this actor or sent by it (the header's `sender`)."""
    direction: str | None = None
    """"in" or "out"."""
    since: float | None = None
    until: float | None = None

    def match(self, record: Record) -> bool:
        """Whether `record` passes every condition set."""
        if self.types is not None and record.type not in self.types:
            return False
        if self.direction is not None and record.direction != self.direction:
            return False
        if self.since is not None and record.t < self.since:
            return False
        if self.until is not None and record.t >= self.until:
            return False
        if self.actor is not None and self.actor not in (record.actor, record.header.get("sender")):
            return False
        return self.episode is None or self.episode in _episode_ids(record.body)


def _episode_ids(body: dict[str, Any]) -> set[Any]:
    """`episode_id`s of the body and of the messages (dicts, or lists of dicts) directly inside it."""
    ids = {body.get("episode_id")}
    for value in body.values():
        nested = value if isinstance(value, list) else [value]
        ids.update(v.get("episode_id") for v in nested if isinstance(v, dict))
    return {i for i in ids if isinstance(i, str)}  # a hostile body may hold anything there


def record_to_json(record: Record) -> dict[str, Any]:
    """A JSON-safe dict of the record: bytes become `{"bytes": n}`, blob refs `{"blob": hash, "size": n}`."""
    return {
        "index": record.index,
        "file": record.file,
        "offset": record.offset,
        "t": record.t,
        "dir": record.direction,
        "sock": record.sock,
        "peer": record.peer,
        "actor": record.actor,
        "type": record.type,
        "header": _jsonable(record.header),
        "body": _jsonable(record.body),
        "blobs": list(record.blobs),
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, BlobRef):
        return {"blob": obj.hash, "size": obj.size}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"bytes": len(obj)}
    if isinstance(obj, msgpack.ExtType):
        return {"ext": obj.code, "bytes": len(obj.data)}
    if isinstance(obj, msgpack.Timestamp):
        return obj.to_unix()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # strict JSON has no NaN/Infinity
    if isinstance(obj, str):
        # Lone surrogates stand for a peer's invalid UTF-8 (the reader's surrogateescape): show them.
        try:
            return obj.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # other lone surrogates (built in Python, not read from a log)
            return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    return obj


def export_screenshots(
    reader: LogReader, records: Iterable[Record], out_dir: str | os.PathLike[str]
) -> list[Path]:
    """Write every PNG/JPEG blob the records refer to as `<index:06d>_<type>_<k>.png|.jpg`.

    `k` is the blob's frame index within its message; each distinct image is written once per call,
    named after the first record that carried it. Returns the files written, in order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: set[str] = set()
    paths: list[Path] = []
    for record in records:
        for k, digest in enumerate(record.blobs):
            if digest in written or not reader.has_blob(digest):
                continue
            written.add(digest)
            head = reader.blob(digest, limit=8)
            suffix = next((ext for magic, ext in _IMAGE_MAGIC if head.startswith(magic)), None)
            if suffix is None:
                continue
            kind = re.sub(r"[^A-Za-z0-9_.-]", "_", record.type or "unknown")  # types come from peers
            path = out / f"{record.index:06d}_{kind}_{k}{suffix}"
            path.write_bytes(reader.blob(digest))
            paths.append(path)
    return paths
