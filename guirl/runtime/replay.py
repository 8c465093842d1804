"""Re-sending recorded messages to a live actor (`guirl replay send --to ENDPOINT`).

Each selected record's body and blobs go out exactly as recorded, under a fresh header (new message id,
sender `replay`, send time now, the recorded policy version), so the actor treats them as new requests.
Timing follows the recording (gaps divided by `speed`), or as fast as possible with `speed=0`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import zmq

from guirl.messages import ANY, Codec, CodecError, IdGen, make_header
from guirl.msglog.reader import LogReader, Record


@dataclass
class ReplayReport:
    """What a replay sent and what came back."""

    sent: int = 0
    replies: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    undecodable: int = 0
    unanswered: int = 0

    def as_dict(self) -> dict:
        return {
            "sent": self.sent,
            "replies": dict(self.replies),
            "errors": dict(self.errors),
            "undecodable": self.undecodable,
            "unanswered": self.unanswered,
        }


def replay_to(
    reader: LogReader,
    records: Iterable[Record],
    endpoint: str,
    *,
    speed: float = 1.0,
    wait_s: float = 5.0,
    identity: bytes | None = None,
    keys_dir: str = "",
) -> ReplayReport:
    """Send `records` to the mailbox at `endpoint`; collect replies until `wait_s` after the last send.
    `keys_dir`: the cluster's CURVE keys (`runtime.curve_keys_dir`), for an actor that only admits them."""
    codec, ids, report = Codec(), IdGen(), ReplayReport()
    keys = None
    if keys_dir:
        from guirl.runtime.security import curve_client, load_keys

        keys = load_keys(keys_dir)  # a bad directory is a clear error before anything is sent
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:  # a CURVE client with the cluster's identity, as every actor's connections are
        curve_client(sock, keys)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(endpoint)
    outstanding: set[str] = set()

    def drain(timeout_ms: int) -> None:
        while sock.poll(timeout_ms, zmq.POLLIN):
            timeout_ms = 0
            frames = sock.recv_multipart(copy=False)
            try:
                header, msg = codec.decode(frames[1:], ANY)
            except (CodecError, IndexError):
                report.undecodable += 1
                continue
            if header.reply_to in outstanding:
                outstanding.discard(header.reply_to)
            name = type(msg).__name__
            if name == "Heartbeat":
                continue
            report.replies[name] += 1
            if name == "ErrorReply":
                report.errors[msg.code] += 1

    records = list(records)
    try:
        first_t = start = None
        for n, rec in enumerate(records):
            if first_t is None:
                first_t, start = rec.t, time.monotonic()
            elif speed > 0:
                due = start + (rec.t - first_t) / speed
                # reproduce the recorded pacing; replies are read while we wait
                while (delay := due - time.monotonic()) > 0:
                    drain(int(delay * 1000) + 1)
            frames = reader.raw_frames(rec)
            old = msgspec.msgpack.decode(frames[0])
            header = make_header(ids, "replay", policy_version=old[4] if len(old) > 4 else -1)
            message = [b"", codec.encode_header(header), *frames[1:]]
            # never block on an actor that is down or not reading: wait for room up to `wait_s`
            sent_at = time.monotonic()
            while True:
                try:
                    sock.send_multipart(message, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    left = wait_s - (time.monotonic() - sent_at)
                    if left <= 0 or not sock.poll(int(left * 1000) + 1, zmq.POLLOUT):
                        report.unsent = len(records) - n
                        report.unanswered = len(outstanding)
                        return report
            outstanding.add(header.msg_id)
            report.sent += 1
            drain(0)
        deadline = time.monotonic() + wait_s
        while outstanding and (remaining := deadline - time.monotonic()) > 0:
            drain(int(remaining * 1000) + 1)
        report.unanswered = len(outstanding)
    finally:
        sock.close(linger=0)
        ctx.term()
    return report
