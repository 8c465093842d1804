"""The header frame every message carries, and message-id generation."""

from __future__ import annotations

import itertools
import os
import time

import msgspec

PROTOCOL_VERSION = 1
"""Wire protocol version; a peer speaking another version gets an `ErrorReply(code="version")`."""


class Header(msgspec.Struct, frozen=True, array_like=True):
    """Per-message metadata, encoded as a compact MessagePack array in its own frame."""

    v: int
    """Protocol version of the sender."""
    msg_id: str
    """Unique id of this message (sender prefix + counter)."""
    sender: str
    """Name of the sending actor."""
    sent_at: float
    """Wall-clock send time (seconds since the epoch)."""
    policy_version: int = -1
    """Policy version the sender holds (-1 when it has none)."""
    reply_to: str = ""
    """For a reply: the `msg_id` of the request it answers (the correlation id)."""


class IdGen:
    """Message ids unique across processes: a random per-instance prefix and a counter."""

    def __init__(self) -> None:
        self.prefix = os.urandom(6).hex()
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}-{next(self._count)}"

    def sequence(self, msg_id: str) -> int | None:
        """The counter of an id this generator made (ids are made in increasing order), else None."""
        prefix, _, count = msg_id.rpartition("-")
        return int(count) if prefix == self.prefix and count.isdigit() else None


def make_header(
    ids: IdGen, sender: str, *, policy_version: int = -1, reply_to: str = "", now: float | None = None
) -> Header:
    """A header for a message sent now."""
    return Header(
        PROTOCOL_VERSION, ids(), sender, time.time() if now is None else now, policy_version, reply_to
    )
