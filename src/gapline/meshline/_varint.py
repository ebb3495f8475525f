"""Multiformats unsigned-varint length prefixes (general.md "Message length-prefix encoding").

Shortest form only, at most 9 bytes (values up to 2^63 - 1); an incomplete,
over-long or non-minimal prefix is a framing failure (``BadRequest``).
"""

from __future__ import annotations

from gapline.meshline._errors import BadRequest

__all__ = ["decode_uvarint", "encode_uvarint"]

MAX_UVARINT_BYTES = 9


def encode_uvarint(value: int) -> bytes:
    if not 0 <= value < 2**63:
        raise BadRequest("varint value out of range")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_uvarint(data: bytes) -> tuple[int, int]:
    """``(value, bytes consumed)`` of the prefix at the start of ``data``."""
    value = 0
    for index, byte in enumerate(data[:MAX_UVARINT_BYTES]):
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            if byte == 0 and index > 0:
                raise BadRequest("non-minimal varint")
            return value, index + 1
    if len(data) >= MAX_UVARINT_BYTES:
        raise BadRequest("varint longer than 9 bytes")
    raise BadRequest("incomplete varint")
