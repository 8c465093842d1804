"""On-disk format of guirl message logs: the contract between `Recorder` and `LogReader`.

A log is a directory of *segment* files named `<name>.<seq:06d>.msglog`. A segment is a sequence of
records; each record is an 11-byte prefix followed by `len` bytes of payload::

    0x92 0xce <len: u32 big-endian> 0xce <crc: u32 big-endian>   <payload: len bytes>

The prefix is itself the MessagePack array `[len, crc]` (a fixarray of two uint32s), so the plain
`msgpack` package reads a log as a stream: `msgpack.Unpacker(f, raw=False)` yields `[len, crc]`, a
record, `[len, crc]`, a record, ... `crc` is `zlib.crc32(payload)`. The payload is one MessagePack map
whose key `"k"` says the record kind:

`meta`  -- first record of every segment::

    {"k": "meta", "format": "guirl-msglog", "version": 1, "actor": str, "host": str, "pid": int,
     "created": float, "segment": int}

`blob`  -- the bytes of one blob (screenshot, tensor), stored once per segment per distinct content::

    {"k": "blob", "h": <BLAKE2b-128 hex digest of the bytes>, "d": <bin>}

    A blob record always precedes the first `msg` record of its segment that refers to it, so every
    segment can be read alone.

`msg`   -- one message as it crossed a socket::

    {"k": "msg", "t": float, "dir": "in" | "out", "sock": str, "peer": str,
     "header": <the header frame>, "body": <the body frame>, "blobs": [hash, ...]}

    `header` and `body` are the wire frames spliced in verbatim as embedded MessagePack objects (not
    as bin), so recording never re-encodes a message. Blob references in the body stay what they are on
    the wire: extension `BLOB_EXT` whose 4-byte big-endian data is an index into `blobs` (frame order).
    A frame that was not one well-formed MessagePack object (a hostile or broken peer) is stored as bin
    instead, and its key ("header" or "body") is listed in an extra `"verbatim": [...]` entry.

Readers ignore unknown keys and unknown record kinds, so fields can be added without a version bump.
A process killed mid-write leaves at most one torn record at the end of a segment; readers stop there.
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import Any

import msgpack

FORMAT = "guirl-msglog"
"""Value of the meta record's `format` key."""
VERSION = 1
"""Format version this code writes and reads."""
SUFFIX = ".msglog"

PREFIX = struct.Struct(">BBIBI")
PREFIX_SIZE = PREFIX.size  # 11
_ARRAY2, _UINT32 = 0x92, 0xCE

KIND_META, KIND_BLOB, KIND_MSG = "meta", "blob", "msg"
DIRECTIONS = ("in", "out")


class MsgLogError(Exception):
    """A file that is not a guirl message log (or one this version cannot read)."""


def encode_prefix(length: int, crc: int) -> bytes:
    """The 11-byte record prefix: MessagePack `[length, crc]` with both as uint32."""
    return PREFIX.pack(_ARRAY2, _UINT32, length, _UINT32, crc)


def decode_prefix(prefix: bytes) -> tuple[int, int] | None:
    """`(length, crc)` from an 11-byte prefix, or None when its markers are wrong."""
    a, b, length, c, crc = PREFIX.unpack(prefix)
    if a != _ARRAY2 or b != _UINT32 or c != _UINT32:
        return None
    return length, crc


def is_prefix_start(data: bytes) -> bool:
    """Whether `data` (shorter than a prefix) could be the start of one: a torn write, not garbage."""
    template = (_ARRAY2, _UINT32, None, None, None, None, _UINT32)
    return all(want is None or got == want for got, want in zip(data, template))


def map_header(n: int) -> bytes:
    """MessagePack header of a map with `n` entries."""
    if n < 16:
        return bytes((0x80 | n,))
    return struct.pack(">BH", 0xDE, n)


def bin_header(n: int) -> bytes:
    """MessagePack header of a bin object of `n` bytes (what `msgpack.packb(bytes)` would emit)."""
    if n < 2**8:
        return struct.pack(">BB", 0xC4, n)
    if n < 2**16:
        return struct.pack(">BH", 0xC5, n)
    return struct.pack(">BI", 0xC6, n)


def bin_header_size(first_byte: int) -> int | None:
    """Length of the bin header starting with `first_byte`, or None when it is not a bin object."""
    return {0xC4: 2, 0xC5: 3, 0xC6: 5}.get(first_byte)


def blob_hash(data: Any) -> str:
    """Content hash of a blob: BLAKE2b-128, hex (the same as `guirl.messages.Blob.digest`)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def new_packer() -> msgpack.Packer:
    """A packer matching the reader: strings as str, bytes as bin, lone surrogates round-trip.

    A Packer keeps an internal buffer, so each user owns one rather than sharing a module global.
    """
    return msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape")


def pack(obj: Any) -> bytes:
    """Pack one object the way `new_packer()` does."""
    return msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogateescape")


KEY = {k: pack(k) for k in ("k", "t", "dir", "sock", "peer", "header", "body", "blobs", "verbatim", "h", "d")}
"""Pre-packed record keys: the recorder splices them instead of packing a dict per record."""


def segment_name(name: str, seq: int) -> str:
    """File name of segment `seq` of the log called `name`."""
    return f"{name}.{seq:06d}{SUFFIX}"


def segment_seq(name: str, filename: str) -> int | None:
    """The sequence number of `filename` if it is a segment of the log called `name`."""
    m = re.fullmatch(re.escape(name) + r"\.(\d{6,})" + re.escape(SUFFIX), filename)
    return int(m.group(1)) if m else None
