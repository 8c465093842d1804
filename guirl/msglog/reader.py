"""Read message logs written by `Recorder` (format in `format.py`), tolerating torn and corrupt tails.

Damage never raises: a torn or corrupt record (short, bad prefix, CRC mismatch) ends the reading of its
file with a warning, and the records before it are all returned; a record whose CRC holds but whose
content does not decode is skipped with a warning, since the framing after it is still sound. Only a file
that is not a message log at all raises `MsgLogError`.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from guirl.messages.blob import BLOB_EXT
from guirl.messages.header import Header
from guirl.msglog import format as fmt
from guirl.msglog.format import MsgLogError

log = logging.getLogger(__name__)

_HEADER_FIELDS: tuple[str, ...] = Header.__struct_fields__


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A blob reference in a recorded body: frame `index` of the message, whose bytes hash to `hash`.

    `hash` is "" and `size` -1 when the record does not resolve the reference (a damaged log).
    """

    index: int
    hash: str
    size: int


@dataclass(frozen=True, slots=True)
class Record:
    """One recorded message."""

    file: str
    """Segment file it was read from."""
    offset: int
    """Byte offset of its record in that file."""
    index: int
    """Running index over the whole read (all files)."""
    t: float
    """Time it was recorded (seconds since the epoch)."""
    direction: str
    """"in" (received) or "out" (sent)."""
    sock: str
    """Socket or mailbox it crossed."""
    peer: str
    """The peer's routing id (hex) or name."""
    actor: str
    """The recording actor (from the segment's meta record)."""
    header: dict[str, Any]
    """Header fields by name (`guirl.messages.Header`)."""
    body: dict[str, Any]
    """Decoded body, blob references as `BlobRef`s."""
    blobs: list[str]
    """Hashes of the blob frames, in frame order."""
    type: str | None
    """The body's `type` tag, when it has one."""
    raw_header: bytes = field(default=b"", repr=False, compare=False)
    """The header frame exactly as on the wire."""
    raw_body: bytes = field(default=b"", repr=False, compare=False)
    """The body frame exactly as on the wire."""


class _Damaged(Exception):
    """Damage that ends the reading of one file: `torn` (cut short, as a kill leaves it) or corrupt."""

    def __init__(self, what: str, torn: bool = False, framed: bool = False) -> None:
        super().__init__(what)
        self.torn = torn
        self.framed = framed  # the record's prefix was valid: this is a log, damaged


def _unpack(data: bytes, ext_hook: Any = msgpack.ExtType) -> Any:
    # strict_map_key=False: bodies may carry int keys; surrogateescape: a peer's invalid UTF-8 must not
    # make a whole record unreadable, and it packs back to the same bytes.
    return msgpack.unpackb(
        data, raw=False, strict_map_key=False, unicode_errors="surrogateescape", ext_hook=ext_hook
    )


def _scan_map(payload: bytes) -> dict[str, tuple[int, int]]:
    """Byte spans of the values of a record map, by key, without building the values."""
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=False, unicode_errors="surrogateescape", max_buffer_size=len(payload)
    )
    unpacker.feed(payload)
    spans = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        start = unpacker.tell()
        unpacker.skip()
        if isinstance(key, str):
            spans[key] = (start, unpacker.tell())
    if unpacker.tell() != len(payload):
        raise ValueError("trailing bytes after the record map")
    return spans


def _header_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, (list, tuple)):
        # array_like Header: positional; extra trailing fields (a newer sender) are dropped by zip.
        return dict(zip(_HEADER_FIELDS, value))
    return {}


class LogReader:
    """Iterates over the records of message-log segments and serves the blobs they stored.

    `paths` are segment files or directories (every `*.msglog` inside, sorted by name). Blobs are
    indexed by location as they are read, not held in memory: `blob()` reads them back from disk.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = list(paths)
        self.warnings: list[str] = []
        """One line per damaged file or record: `<file>:<offset>: <what>`."""
        self._blobs: dict[str, tuple[str, int, int]] = {}  # hash -> (file, offset, size)

    # -- public ----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        index = 0
        named = {Path(p) for p in self.paths}
        for path in self.files():
            try:
                for rec in self._read_file(path, index):
                    index += 1
                    yield rec
            except MsgLogError as exc:
                if path in named:  # a file asked for by name must be a log
                    raise
                self._warn(path, 0, f"skipped: {exc}")  # one stray file must not hide a directory

    def files(self) -> list[Path]:
        """The segment files `paths` name, in reading order."""
        out: list[Path] = []
        for p in map(Path, self.paths):
            if p.is_dir():
                out += sorted(q for q in p.glob(f"*{fmt.SUFFIX}") if q.is_file())
            elif p.is_file():
                out.append(p)
            else:
                raise MsgLogError(f"{p}: no such file or directory")
        return out

    def blob(self, digest: str, limit: int | None = None) -> bytes:
        """The bytes of a blob read so far (the first `limit` of them, if given).

        KeyError when no blob record with that hash has been read.
        """
        path, offset, size = self._blobs[digest]
        size = size if limit is None else min(size, limit)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(size)
        if len(data) != size:
            raise MsgLogError(f"{path}: blob {digest} at {offset} is gone (file truncated since read)")
        return data

    def has_blob(self, digest: str) -> bool:
        return digest in self._blobs

    def raw_frames(self, record: Record, body: dict[str, Any] | None = None) -> list[bytes]:
        """`[header, body, *blobs]` as they went over the wire, for replay.

        With `body`, that (possibly edited) body is packed instead of the recorded bytes; its `BlobRef`s
        become blob extensions again. MsgLogError when a blob it needs was not read (a damaged log).
        """
        missing = [h for h in record.blobs if h not in self._blobs]
        if missing:
            raise MsgLogError(f"{record.file}:{record.offset}: blob {missing[0]} was never stored")
        body_frame = record.raw_body if body is None else encode_body(body)
        return [record.raw_header, body_frame, *(self.blob(h) for h in record.blobs)]

    # -- reading ---------------------------------------------------------------------------------

    def _warn(self, path: Path, offset: int, what: str) -> None:
        line = f"{path}:{offset}: {what}"
        self.warnings.append(line)
        log.warning("message log %s", line)

    def _read_file(self, path: Path, first_index: int) -> Iterator[Record]:
        try:
            f = open(path, "rb")  # noqa: SIM115  (a generator holds it across yields)
        except OSError as exc:
            raise MsgLogError(f"{path}: cannot open: {exc}") from None
        with f:
            offset = 0
            meta: dict[str, Any] | None = None
            index = first_index
            while True:
                try:
                    item = self._next_record(f, offset, first=meta is None)
                except _Damaged as exc:
                    if meta is None and not exc.torn and not exc.framed:
                        # No valid record frame before a meta record: nothing says this is a log at all.
                        raise MsgLogError(f"{path}: not a guirl message log") from None
                    self._warn(path, offset, str(exc))
                    return
                if item is None:
                    return
                payload, size = item
                try:
                    spans = _scan_map(payload)
                    kind = _unpack(payload[slice(*spans["k"])]) if "k" in spans else None
                except Exception as exc:  # noqa: BLE001  (any decoder failure on stored bytes is damage)
                    spans, kind = {}, None
                    if meta is None:
                        raise MsgLogError(f"{path}: not a guirl message log") from None
                    self._warn(path, offset, f"undecodable record skipped ({type(exc).__name__})")
                if meta is None:
                    meta = self._meta(path, payload, spans, kind)
                elif kind == fmt.KIND_BLOB:
                    self._blob_record(path, offset, payload, spans)
                elif kind == fmt.KIND_MSG:
                    rec = self._msg_record(path, offset, index, meta, payload, spans)
                    if rec is not None:
                        index += 1
                        yield rec
                # Other kinds (a later version's) are skipped: the format promises readers ignore them.
                offset += size

    def _next_record(self, f: BinaryIO, offset: int, first: bool) -> tuple[bytes, int] | None:
        """`(payload, bytes consumed)` of the record at `offset`, None at a clean end of file."""
        prefix = f.read(fmt.PREFIX_SIZE)
        if not prefix:
            if first:
                raise _Damaged("torn log: empty file", torn=True)
            return None
        if len(prefix) < fmt.PREFIX_SIZE:
            if fmt.is_prefix_start(prefix):
                raise _Damaged(f"torn record: {len(prefix)}-byte prefix", torn=True)
            raise _Damaged("bad record prefix")
        decoded = fmt.decode_prefix(prefix)
        if decoded is None:
            raise _Damaged("bad record prefix")
        length, crc = decoded
        # Compare with what the file holds before reading, so a hostile length allocates nothing.
        available = os.fstat(f.fileno()).st_size - offset - fmt.PREFIX_SIZE
        if length > available:
            raise _Damaged(f"torn record: {max(available, 0)} of {length} bytes", torn=True)
        payload = f.read(length)
        if len(payload) < length:
            raise _Damaged(f"torn record: {len(payload)} of {length} bytes", torn=True)
        if zlib.crc32(payload) != crc:
            raise _Damaged("CRC mismatch", framed=True)  # a log's framing, damaged contents
        return payload, fmt.PREFIX_SIZE + length

    def _meta(self, path: Path, payload: bytes, spans: dict, kind: Any) -> dict[str, Any]:
        try:
            meta = _unpack(payload) if kind == fmt.KIND_META else None
        except Exception:  # noqa: BLE001
            meta = None
        if not isinstance(meta, dict) or meta.get("format") != fmt.FORMAT:
            raise MsgLogError(f"{path}: not a guirl message log")
        if meta.get("version") != fmt.VERSION:
            raise MsgLogError(f"{path}: message log version {meta.get('version')!r}, expected {fmt.VERSION}")
        if not isinstance(meta.get("actor", ""), str):
            meta["actor"] = str(meta["actor"])
        return meta

    def _blob_record(self, path: Path, offset: int, payload: bytes, spans: dict) -> None:
        try:
            digest = _unpack(payload[slice(*spans["h"])])
            start, end = spans["d"]
        except Exception:  # noqa: BLE001
            digest, start, end = None, 0, 0
        head = fmt.bin_header_size(payload[start]) if end > start else None
        if not isinstance(digest, str) or head is None:
            self._warn(path, offset, "malformed blob record skipped")
            return
        data_offset = offset + fmt.PREFIX_SIZE + start + head
        self._blobs.setdefault(digest, (str(path), data_offset, end - start - head))

    def _msg_record(
        self, path: Path, offset: int, index: int, meta: dict, payload: bytes, spans: dict
    ) -> Record | None:
        try:
            fields = {k: _unpack(payload[slice(*spans[k])]) for k in ("t", "dir", "sock", "peer", "blobs")}
            hashes = fields["blobs"]
            if not (
                isinstance(fields["t"], (int, float))
                and isinstance(hashes, list)
                and all(isinstance(x, str) for x in (fields["dir"], fields["sock"], fields["peer"], *hashes))
            ):
                raise TypeError("field of the wrong type")
            verbatim = _unpack(payload[slice(*spans["verbatim"])]) if "verbatim" in spans else []
            raw = {}
            for key in ("header", "body"):
                span = payload[slice(*spans[key])]
                raw[key] = _unpack(span) if key in verbatim else span
            header = _header_dict(_unpack(raw["header"])) if "header" not in verbatim else {}
            body = _unpack(raw["body"], self._ext_hook(hashes)) if "body" not in verbatim else {}
        except Exception as exc:  # noqa: BLE001  (stored bytes may be anything; damage is skipped)
            self._warn(path, offset, f"malformed message record skipped ({type(exc).__name__}: {exc})")
            return None
        if not isinstance(body, dict):
            body = {"value": body}
        if not isinstance(raw["header"], bytes) or not isinstance(raw["body"], bytes):
            self._warn(path, offset, "malformed message record skipped (verbatim frame is not bin)")
            return None
        kind = body.get("type")
        return Record(
            file=str(path),
            offset=offset,
            index=index,
            t=float(fields["t"]),
            direction=fields["dir"],
            sock=fields["sock"],
            peer=fields["peer"],
            actor=meta.get("actor", ""),
            header=header,
            body=body,
            blobs=hashes,
            type=kind if isinstance(kind, str) else None,
            raw_header=raw["header"],
            raw_body=raw["body"],
        )

    def _ext_hook(self, hashes: list[str]) -> Any:
        def hook(code: int, data: bytes) -> Any:
            if code != BLOB_EXT or len(data) != 4:
                return msgpack.ExtType(code, data)
            i = int.from_bytes(data, "big")
            digest = hashes[i] if i < len(hashes) else ""
            loc = self._blobs.get(digest)
            return BlobRef(i, digest, loc[2] if loc else -1)

        return hook


def encode_body(body: dict[str, Any]) -> bytes:
    """Pack a body dict as a wire body frame: `BlobRef`s become blob extensions again."""

    def default(obj: Any) -> Any:
        if isinstance(obj, BlobRef):
            return msgpack.ExtType(BLOB_EXT, obj.index.to_bytes(4, "big"))
        raise TypeError(f"cannot encode {type(obj).__name__} in a message body")

    return msgpack.packb(body, use_bin_type=True, unicode_errors="surrogateescape", default=default)


def read_log(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> Iterator[Record]:
    """The message records of the given segment files and directories, in order (see `LogReader`)."""
    return iter(LogReader(paths))
