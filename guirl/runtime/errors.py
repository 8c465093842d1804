"""Typed errors of the actor runtime: transient ones may be retried (idempotent calls only)."""

from __future__ import annotations


class ActorError(Exception):
    """Base of runtime errors."""

    transient = False


class TransientError(ActorError):
    """The call may succeed if retried later (peer restarting, queue full, slow peer)."""

    transient = True


class RequestTimeout(TransientError):
    """No reply within the per-call timeout."""


class PeerDead(TransientError):
    """The peer missed `liveness` heartbeats; requests in flight to it are failed with this."""


class Overloaded(TransientError):
    """A bounded queue was full (ours or the peer's); the message was not sent or not accepted."""


class RemoteError(ActorError):
    """The peer answered with an `ErrorReply`."""

    def __init__(self, code: str, message: str, retryable: bool = False, peer: str = "") -> None:
        super().__init__(f"{peer or 'peer'} answered {code}: {message}")
        self.code = code
        self.remote_message = message
        self.transient = retryable


class FatalError(ActorError):
    """Cannot succeed by retrying (bad configuration, protocol mismatch)."""
