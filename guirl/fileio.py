"""Small file helpers shared by the run's writers and readers."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """Write `data` as JSON to a temporary sibling, then rename it into place: a reader (or a kill) never
    sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, path)


def write_dir_atomic(final: Path, fill: Callable[[Path], None], *, keep: int = 0, family: str = "v*") -> Path:
    """Build the directory `final` whole: `fill` writes into a temporary sibling (`.<name>.tmp`), which is
    then renamed into place, replacing a `final` already there. A write that fails (or a kill) leaves
    whatever `final` was, and every other sibling, as it was (moolib's checkpoints). With `keep`, the
    siblings matching `family` that sort before `final` are pruned until `keep` remain, `final` included
    (newer ones, if any, are kept). Returns `final`."""
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a previous attempt cut short
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)  # os.replace renames a directory only onto an empty one
    os.replace(tmp, final)
    if keep > 0:
        older = sorted(p for p in final.parent.glob(family) if p.name < final.name)
        for old in older[: max(0, len(older) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def append_jsonl(path: Path, *lines: dict[str, Any]) -> None:
    """`lines` at the end of the JSON-lines file `path`, one object per line (created if missing)."""
    with open(path, "a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


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


def cache_dir(name: str) -> Path:
    """Where guirl keeps what it builds once and reuses (the tiny model, generated rows): `GUIRL_CACHE_DIR`,
    else `$XDG_CACHE_HOME/guirl` (`~/.cache/guirl`), never the working directory."""
    root = os.environ.get("GUIRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "guirl"
    )
    return Path(root) / name


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file's complete lines (`_json_objects`); a missing file is empty."""
    try:
        return _json_objects(Path(path).read_bytes())
    except OSError:
        return []
