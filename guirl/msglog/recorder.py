"""Append messages to a segmented log on disk, as cheaply as the hot path allows (format in `format.py`).

The header and body frames are spliced into each record verbatim and blob bytes go to the kernel
straight from the caller's buffers through one `os.writev` per record, so a message costs one hash per
blob, one CRC pass, and one system call.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec

from guirl.msglog import format as fmt

_O_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


def _buffer(frame: Any) -> memoryview:
    """A flat byte view of bytes, bytearray, memoryview or a zmq.Frame (its `.buffer`), no copy."""
    buf = getattr(frame, "buffer", None)
    view = memoryview(buf if buf is not None else frame)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")  # raises on non-contiguous buffers, which writev could not take anyway
    return view


def _is_msgpack_object(view: memoryview) -> bool:
    """Whether `view` is exactly one well-formed MessagePack object (skipped, not built: cheap)."""
    try:
        msgspec.msgpack.decode(view, type=msgspec.Raw)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


class Recorder:
    """Writes the messages an actor sends and receives to `<directory>/<name>.<seq:06d>.msglog`.

    Not thread-safe: one recorder per mailbox (or per thread). Writes are unbuffered, so a record is in
    the kernel once `record()` returns and a killed process loses nothing but a torn last record.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        name: str,
        *,
        actor: str = "",
        rotate_bytes: int = 256 * 2**20,
        directions: Sequence[str] = fmt.DIRECTIONS,
        sockets: Sequence[str] = (),
    ) -> None:
        if not name or "/" in name or os.sep in name:
            raise ValueError(f"bad log name {name!r}")
        unknown = set(directions) - set(fmt.DIRECTIONS)
        if unknown:
            raise ValueError(f"unknown directions {sorted(unknown)}, expected a subset of {fmt.DIRECTIONS}")
        if rotate_bytes <= 0:
            raise ValueError("rotate_bytes must be positive")
        self.directory = Path(directory)
        self.name = name
        self.actor = actor
        self.rotate_bytes = rotate_bytes
        self.directions = frozenset(directions)
        self.sockets = frozenset(sockets)  # empty: every socket
        self.directory.mkdir(parents=True, exist_ok=True)
        self.records = 0
        """Message records written."""
        self.blobs_written = 0
        """Blob records written (distinct contents per segment)."""
        self.blobs_deduplicated = 0
        """Blob references that reused a blob already in the segment."""
        self.bytes_written = 0
        """Bytes written to all segments, meta and blob records included."""
        self.paths: list[Path] = []
        """Segments this recorder created, in order."""
        self._packer = fmt.new_packer()
        self._fd = -1
        self._segment_bytes = 0
        self._seen: set[str] = set()  # blob hashes already in the current segment
        self._closed = False
        existing = [fmt.segment_seq(name, p.name) for p in self.directory.iterdir()]
        # Never append to an old segment: its writer may have left a torn record at its end.
        self._next_seq = max((s for s in existing if s is not None), default=-1) + 1

    # -- public ----------------------------------------------------------------------------------

    def record(
        self,
        direction: str,
        sock: str,
        peer: str | bytes,
        header: Any,
        body: Any,
        blobs: Sequence[Any] = (),
        t: float | None = None,
    ) -> None:
        """Append one message: its wire frames `header`, `body` and `blobs` (bytes-like or zmq.Frame).

        `peer` is the peer's name, or its routing id (bytes, written as hex). Directions and sockets this
        recorder was not asked to keep are ignored.
        """
        if direction not in self.directions or (self.sockets and sock not in self.sockets):
            return
        if self._closed:
            raise ValueError("record() on a closed Recorder")
        if self._fd < 0:
            self._open_segment()
        views = [_buffer(b) for b in blobs]
        hashes = [fmt.blob_hash(v) for v in views]
        for digest, view in zip(hashes, views):
            if digest in self._seen:
                self.blobs_deduplicated += 1
                continue
            self._write_record(
                [
                    fmt.map_header(3),
                    fmt.KEY["k"],
                    self._packer.pack(fmt.KIND_BLOB),
                    fmt.KEY["h"],
                    self._packer.pack(digest),
                    fmt.KEY["d"],
                    fmt.bin_header(view.nbytes),
                    view,
                ]
            )
            self._seen.add(digest)
            self.blobs_written += 1
        pack = self._packer.pack
        pieces: list[Any] = [
            b"",
            fmt.KEY["k"],
            pack(fmt.KIND_MSG),
            fmt.KEY["t"],
            pack(float(time.time() if t is None else t)),
            fmt.KEY["dir"],
            pack(direction),
            fmt.KEY["sock"],
            pack(sock),
            fmt.KEY["peer"],
            pack(peer.hex() if isinstance(peer, (bytes, bytearray)) else peer),
        ]
        verbatim = []
        for key, frame in (("header", header), ("body", body)):
            view = _buffer(frame)
            if _is_msgpack_object(view):
                pieces += [fmt.KEY[key], view]
            else:
                pieces += [fmt.KEY[key], fmt.bin_header(view.nbytes), view]
                verbatim.append(key)
        pieces += [fmt.KEY["blobs"], pack(hashes)]
        if verbatim:
            pieces += [fmt.KEY["verbatim"], pack(verbatim)]
        pieces[0] = fmt.map_header(8 + bool(verbatim))
        self._write_record(pieces)
        self.records += 1
        if self._segment_bytes >= self.rotate_bytes:
            self._close_segment()  # the next record opens the next segment

    def close(self) -> None:
        """Close the current segment. Idempotent."""
        self._close_segment()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def path(self) -> Path | None:
        """The segment being written, if one is open."""
        return self.paths[-1] if self._fd >= 0 else None

    # -- segments --------------------------------------------------------------------------------

    def _open_segment(self) -> None:
        while True:
            seq = self._next_seq
            self._next_seq += 1
            path = self.directory / fmt.segment_name(self.name, seq)
            try:
                self._fd = os.open(path, _O_FLAGS, 0o644)
                break
            except FileExistsError:
                continue  # another recorder of the same name took this number first
        self.paths.append(path)
        self._segment_bytes = 0
        self._seen = set()
        meta = {
            "k": fmt.KIND_META,
            "format": fmt.FORMAT,
            "version": fmt.VERSION,
            "actor": self.actor,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created": time.time(),
            "segment": seq,
        }
        self._write_record([self._packer.pack(meta)])

    def _close_segment(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _write_record(self, pieces: list[Any]) -> None:
        crc = 0
        length = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
            length += len(piece) if isinstance(piece, bytes) else piece.nbytes
        if length >= 2**32:
            raise ValueError(f"record of {length} bytes does not fit the 32-bit length prefix")
        iov = [fmt.encode_prefix(length, crc), *pieces]
        total = fmt.PREFIX_SIZE + length
        done = 0
        try:
            # One writev per record: a kill tears at most this record. Writes to a regular file are
            # only short on ENOSPC or beyond ~2 GiB per call, hence the loop.
            while done < total:
                n = os.writev(self._fd, iov)
                done += n
                iov = _advance(iov, n)
        except BaseException:
            # A torn record must end its segment: the reader stops at it, so continue in a fresh one.
            self._close_segment()
            self.bytes_written += done
            raise
        self.bytes_written += total
        self._segment_bytes += total


def _advance(iov: list[Any], n: int) -> list[Any]:
    """The pieces of `iov` not yet written after `n` bytes went out."""
    out = []
    for piece in iov:
        size = len(piece) if isinstance(piece, bytes) else piece.nbytes
        if n >= size:
            n -= size
            continue
        out.append(memoryview(piece)[n:] if n else piece)
        n = 0
    return out
