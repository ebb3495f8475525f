"""multistream-select 1.0: agree on a protocol for a connection or a stream, sans-I/O.

Each message is an unsigned-varint length, the UTF-8 protocol ID and ``\\n``. The dialer
proposes optimistically (header and protocol in one write, its first frame may follow
at once); the listener answers with the header and the protocol, or ``na``.
"""

from __future__ import annotations

from gapline.meshline import BadRequest, decode_uvarint, encode_uvarint

__all__ = ["HEADER", "MultistreamError", "encode_line", "read_line"]

HEADER = "/multistream/1.0.0"
NA = "na"
_MAX_LINE = 1024


class MultistreamError(Exception):
    """A malformed or refused negotiation: the stream or connection is reset."""


def encode_line(protocol: str) -> bytes:
    data = protocol.encode() + b"\n"
    return encode_uvarint(len(data)) + data


def read_line(buffer: bytes) -> tuple[str, int] | None:
    """The first complete line in ``buffer`` and the bytes it took, or None if incomplete."""
    if not buffer:
        return None
    try:
        length, used = decode_uvarint(buffer[:10])
    except BadRequest as exc:
        if "incomplete" in str(exc):
            return None
        raise MultistreamError(str(exc)) from exc
    if length > _MAX_LINE or length == 0:
        raise MultistreamError("multistream line too long or empty")
    if len(buffer) < used + length:
        return None
    raw = buffer[used : used + length]
    if not raw.endswith(b"\n"):
        raise MultistreamError("multistream line without newline")
    try:
        return raw[:-1].decode(), used + length
    except UnicodeDecodeError as exc:
        raise MultistreamError("multistream line is not UTF-8") from exc
