"""Small file helpers shared by the run's writers and readers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """Write `data` as JSON to a temporary sibling, then rename it into place: a reader (or a kill) never
    sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, path)


def last_json_line(path: Path, *, block: int = 1 << 16) -> dict[str, Any]:
    """The last complete line of a JSON-lines file that is an object ({} if there is none), reading only
    its tail: a progress display polls it every second while the file grows for days."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - block))
            data = f.read()
    except OSError:
        return {}
    objects = _json_objects(data)
    return objects[-1] if objects else {}


def _json_objects(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects on the complete lines of `data` (a line still being written, after the last
    newline, is not one yet); a line that is not a JSON object is skipped."""
    out = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


class JsonlTail:
    """The JSON lines appended to a file since the last `read` (a follower of `metrics.jsonl`): only
    complete lines, each once; a line that is not a JSON object is skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += data.rfind(b"\n") + 1  # a line still being written waits for the next read
        return _json_objects(data)
