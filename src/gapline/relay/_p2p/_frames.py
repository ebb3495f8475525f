"""Relay RPC and DHT stream frames: an unsigned-varint length, then that many bytes.

A frame over the receiver's limit, a bad prefix, a stream that ends mid-frame, or (for
relay RPC) bytes that are not UTF-8 are framing failures: the stream is reset, and no
JSON-RPC response is built.
"""

from __future__ import annotations

from gapline.meshline import BadRequest, decode_uvarint, encode_uvarint
from gapline.relay._p2p._channel import Buffered

__all__ = ["FRAME_LIMIT", "FramingError", "encode_frame", "read_frame"]

FRAME_LIMIT = 1024 * 1024  # the least a receiver must accept, and what this one accepts


class FramingError(Exception):
    """The stream broke framing: reset it."""


def encode_frame(payload: bytes) -> bytes:
    return encode_uvarint(len(payload)) + payload


async def read_frame(incoming: Buffered, *, limit: int = FRAME_LIMIT, utf8: bool = True) -> bytes:
    while True:
        try:
            length, used = decode_uvarint(bytes(incoming.buffer[:9]))
            break
        except BadRequest as exc:
            if "incomplete" not in str(exc):
                raise FramingError(str(exc)) from exc
            if not await incoming.fill():
                raise FramingError("stream ended inside a length prefix") from None
    if length > limit:
        raise FramingError(f"frame of {length} bytes over the {limit}-byte limit")
    while len(incoming.buffer) < used + length:
        if not await incoming.fill():
            raise FramingError("stream ended inside a frame")
    payload = bytes(incoming.buffer[used : used + length])
    del incoming.buffer[: used + length]
    if utf8:
        try:
            payload.decode()
        except UnicodeDecodeError as exc:
            raise FramingError("frame is not UTF-8") from exc
    return payload
