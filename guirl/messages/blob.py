"""Raw binary payloads (screenshots, tensors) that travel as trailing frames, never inside the body.

A `Blob` field in a message is encoded as a MessagePack extension (code `BLOB_EXT`, 4-byte big-endian
frame index) and its bytes go out as frame `index` after the body, zero-copy where the transport allows.
"""

from __future__ import annotations

import hashlib
from typing import Any

BLOB_EXT = 1
"""MessagePack extension code of a blob reference inside a message body."""


class Blob:
    """A read-only view of bytes carried out of band. Holds bytes, a memoryview or a zmq.Frame."""

    __slots__ = ("_data",)

    def __init__(self, data: Any) -> None:
        buf = getattr(data, "buffer", None)  # zmq.Frame exposes its bytes as .buffer
        self._data = buf if buf is not None else data

    @property
    def data(self) -> Any:
        """The payload as a buffer (bytes or memoryview); no copy."""
        return self._data

    def __bytes__(self) -> bytes:
        return bytes(self._data)

    def __len__(self) -> int:
        return memoryview(self._data).nbytes

    def digest(self) -> str:
        """Content hash (BLAKE2b-128, hex): how message logs store a blob once."""
        return hashlib.blake2b(self._data, digest_size=16).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Blob):
            return NotImplemented
        return memoryview(self._data).cast("B") == memoryview(other._data).cast("B")

    def __hash__(self) -> int:
        return hash(bytes(self._data))

    def __repr__(self) -> str:
        return f"Blob({len(self)} bytes)"
