"""The wire protocol: typed messages, the header, channels, the envelope codec and its limits.

Envelope on a socket: `[routing ids…, b"", header, body, *blobs]`. The header and body are MessagePack
(the body a tagged `msgspec.Struct`); blobs (screenshots, tensors) are raw trailing frames.
"""

from guirl.messages.blob import BLOB_EXT, Blob
from guirl.messages.channels import (
    ANY,
    CHANNELS,
    Control,
    CoordinatorChannel,
    DiagChannel,
    LearnerChannel,
    PolicyChannel,
    PRMChannel,
)
from guirl.messages.codec import Codec, CodecError, CodecLimits, check_depth
from guirl.messages.header import PROTOCOL_VERSION, Header, IdGen, make_header
from guirl.messages.types import *  # noqa: F403  (the message classes are this package's API)
from guirl.messages.types import Message

__all__ = [
    "ANY",
    "BLOB_EXT",
    "CHANNELS",
    "PROTOCOL_VERSION",
    "Blob",
    "Codec",
    "CodecError",
    "CodecLimits",
    "Control",
    "CoordinatorChannel",
    "DiagChannel",
    "Header",
    "IdGen",
    "LearnerChannel",
    "Message",
    "PRMChannel",
    "PolicyChannel",
    "check_depth",
    "make_header",
]
