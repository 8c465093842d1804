"""Encoding and decoding of `[header, body, *blobs]` with explicit limits.

Every limit violation raises a `CodecError` whose `code` is the `ErrorReply` code a server answers
with; nothing a peer sends can make decoding crash, allocate without bound, or recurse without bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from guirl.messages.blob import BLOB_EXT, Blob
from guirl.messages.header import PROTOCOL_VERSION, Header

MAX_HEADER_BYTES = 4096
"""A header is a handful of short fields; anything bigger is hostile."""


class CodecLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds on what a peer may send (defaults match `guirl.config.CodecConfig`)."""

    max_frames: int = 1024
    max_frame_bytes: int = 64 * 2**20
    max_body_bytes: int = 8 * 2**20
    max_depth: int = 32

    @classmethod
    def from_config(cls, cfg: Any) -> CodecLimits:
        return cls(
            max_frames=cfg.max_frames,
            max_frame_bytes=cfg.max_frame_bytes,
            max_body_bytes=cfg.max_body_bytes,
            max_depth=cfg.max_depth,
        )


class CodecError(ValueError):
    """A frame sequence that is not a valid message. `code` is an `ErrorReply` code."""

    def __init__(self, code: str, message: str, header: Header | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.header = header  # set when the header decoded, so the error can be correlated


def _size(frame: Any) -> int:
    return memoryview(frame).nbytes if not hasattr(frame, "buffer") else frame.buffer.nbytes


def _buf(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame


def _type_depth(t: msgspec.inspect.Type, seen: frozenset) -> int | None:
    """How deep containers of type `t` can nest: None when unbounded (`Any`, a recursive struct)."""
    mi = msgspec.inspect
    if isinstance(t, mi.AnyType):
        return None
    if isinstance(t, mi.StructType):
        if t.cls in seen:
            return None
        depths = [_type_depth(f.type, seen | {t.cls}) for f in t.fields]
        return None if None in depths else 1 + max(depths, default=0)
    if isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        inner = _type_depth(t.item_type, seen)
        return None if inner is None else 1 + inner
    if isinstance(t, mi.TupleType):
        depths = [_type_depth(x, seen) for x in t.item_types]
        return None if None in depths else 1 + max(depths, default=0)
    if isinstance(t, mi.DictType):
        inner = _type_depth(t.value_type, seen)
        return None if inner is None else 1 + inner
    if isinstance(t, mi.UnionType):
        depths = [_type_depth(x, seen) for x in t.types]
        return None if None in depths else max(depths, default=0)
    if isinstance(t, mi.Metadata):
        return _type_depth(t.type, seen)
    return 0  # scalars, literals, bytes, Blob


_STATIC_DEPTH: dict[type, int | None] = {}


def static_depth(cls: type) -> int | None:
    """The deepest nesting any instance of message class `cls` can have (None: unbounded, must be walked)."""
    try:
        return _STATIC_DEPTH[cls]
    except KeyError:
        depth = _type_depth(msgspec.inspect.type_info(cls), frozenset())
        _STATIC_DEPTH[cls] = depth
        return depth


def check_depth(obj: Any, max_depth: int) -> None:
    """Raise `CodecError("too_deep")` if containers nest deeper than `max_depth`. Iterative; skipped for
    message types whose schema already bounds their depth within the limit."""
    if isinstance(obj, msgspec.Struct):
        bound = static_depth(type(obj))
        if bound is not None and bound <= max_depth:
            return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple)):
            children = item
        elif isinstance(item, dict):
            children = item.values()
        elif isinstance(item, msgspec.Struct):
            children = [getattr(item, f) for f in item.__struct_fields__]
        else:
            continue
        if depth > max_depth:
            raise CodecError("too_deep", f"message nests deeper than {max_depth} levels")
        for child in children:
            if isinstance(child, (list, tuple, dict, msgspec.Struct)):
                stack.append((child, depth + 1))


class Codec:
    """Encoder/decoder for one process (or one thread): not safe to share across threads."""

    def __init__(self, limits: CodecLimits | None = None) -> None:
        self.limits = limits or CodecLimits()
        self._out: list[Any] = []
        self._in: Sequence[Any] = ()
        self._used: set[int] = set()  # blob frames the body refers to (a set: refs may repeat)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._header_decoder = msgspec.msgpack.Decoder(Header)
        self._decoders: dict[Any, msgspec.msgpack.Decoder] = {}

    # -- encoding --------------------------------------------------------------------------------

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, Blob):
            self._out.append(obj.data)
            return msgspec.msgpack.Ext(BLOB_EXT, (len(self._out) - 1).to_bytes(4, "big"))
        raise TypeError(f"cannot encode {type(obj).__name__} in a message")

    def encode(self, header: Header, body: msgspec.Struct) -> list[Any]:
        """`[header, body, *blobs]` frames for one message; blobs are not copied.

        The receiver's limits are checked here too, so we never send what a peer must reject."""
        check_depth(body, self.limits.max_depth)
        self._out = []
        try:
            body_bytes = self._encoder.encode(body)
            blobs = self._out
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            # e.g. an int beyond 64 bits, a value of a type MessagePack cannot carry
            raise CodecError("encode", f"cannot encode {type(body).__name__}: {exc}") from None
        finally:
            self._out = []
        lim = self.limits
        if len(blobs) + 2 > lim.max_frames:
            raise CodecError("frames", f"message has {len(blobs) + 2} frames, limit {lim.max_frames}")
        if len(body_bytes) > lim.max_body_bytes:
            raise CodecError("too_large", f"body of {len(body_bytes)} bytes, limit {lim.max_body_bytes}")
        for b in blobs:
            if _size(b) > lim.max_frame_bytes:
                raise CodecError("too_large", f"blob of {_size(b)} bytes, limit {lim.max_frame_bytes}")
        return [self.encode_header(header), body_bytes, *blobs]

    def encode_header(self, header: Header) -> bytes:
        data = self._encoder.encode(header)
        if len(data) > MAX_HEADER_BYTES:
            raise CodecError("too_large", f"header of {len(data)} bytes, limit {MAX_HEADER_BYTES}")
        return data

    # -- decoding --------------------------------------------------------------------------------

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code != BLOB_EXT or len(data) != 4:
            raise CodecError("decode", f"unknown extension type {code}")
        index = int.from_bytes(data, "big")
        if index >= len(self._in):
            raise CodecError("frames", f"body refers to blob {index}, message has {len(self._in)}")
        self._used.add(index)
        return Blob(self._in[index])

    @staticmethod
    def _dec_hook(typ: type, obj: Any) -> Any:
        if isinstance(obj, typ):
            return obj
        # TypeError becomes a msgspec.ValidationError ("schema"); NotImplementedError would escape decode.
        raise TypeError(f"expected {typ.__name__} (a blob reference), got {type(obj).__name__}")

    def decoder(self, channel: Any) -> msgspec.msgpack.Decoder:
        dec = self._decoders.get(channel)
        if dec is None:
            dec = msgspec.msgpack.Decoder(channel, ext_hook=self._ext_hook, dec_hook=self._dec_hook)
            self._decoders[channel] = dec
        return dec

    def decode_header(self, frame: Any) -> Header:
        if _size(frame) > MAX_HEADER_BYTES:
            raise CodecError("too_large", f"header frame over {MAX_HEADER_BYTES} bytes")
        try:
            header = self._header_decoder.decode(_buf(frame))
        except (msgspec.DecodeError, RecursionError) as exc:
            # deep nesting in skipped trailing elements is too_deep, as it is in a body
            reason = "too_deep" if isinstance(exc, RecursionError) else "decode"
            raise CodecError(reason, f"bad header: {exc}") from None
        if header.v != PROTOCOL_VERSION:
            raise CodecError("version", f"protocol version {header.v}, expected {PROTOCOL_VERSION}", header)
        return header

    def decode(self, frames: Sequence[Any], channel: Any) -> tuple[Header, Any]:
        """Decode `[header, body, *blobs]` with the channel's union type."""
        lim = self.limits
        if len(frames) < 2:
            raise CodecError("frames", f"message has {len(frames)} frames, needs header and body")
        if len(frames) > lim.max_frames:
            raise CodecError("frames", f"message has {len(frames)} frames, limit {lim.max_frames}")
        header = self.decode_header(frames[0])
        body = frames[1]
        if _size(body) > lim.max_body_bytes:
            raise CodecError("too_large", f"body of {_size(body)} bytes, limit {lim.max_body_bytes}", header)
        blobs = frames[2:]
        for b in blobs:
            if _size(b) > lim.max_frame_bytes:
                detail = f"frame of {_size(b)} bytes, limit {lim.max_frame_bytes}"
                raise CodecError("too_large", detail, header)
        self._in, self._used = blobs, set()
        try:
            msg = self.decoder(channel).decode(_buf(body))
        except CodecError as exc:
            exc.header = header
            raise
        except msgspec.ValidationError as exc:
            text = str(exc)
            # Only the top-level tag is the message type; a bad tag of a nested union is a schema error.
            unknown = "`$.type`" in text or text == "Object missing required field `type`"
            code = "unknown_type" if unknown else "schema"
            raise CodecError(code, text, header) from None
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
            reason = "too_deep" if isinstance(exc, RecursionError) else "decode"
            raise CodecError(reason, f"bad body: {exc}", header) from None
        finally:
            self._in = ()
        if len(self._used) != len(blobs):
            raise CodecError(
                "frames", f"message has {len(blobs)} blob frames, body refers to {len(self._used)}", header
            )
        try:
            check_depth(msg, lim.max_depth)
        except CodecError as exc:
            exc.header = header
            raise
        return header, msg
