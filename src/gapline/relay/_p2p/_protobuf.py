"""The few protobuf messages libp2p needs here, read and written by hand.

Reading follows protobuf's rules: unknown fields are skipped, a repeated singular
``bytes`` field keeps its last value, a repeated embedded message merges (the caller
concatenates the occurrences and reads once). Invalid wire data raises ``ProtoError``.
"""

from __future__ import annotations

from collections.abc import Iterator

from gapline.meshline import BadRequest, decode_uvarint, encode_uvarint

__all__ = ["ProtoError", "as_bytes", "as_int", "bytes_field", "fields", "varint_field"]


class ProtoError(Exception):
    """Wire data that is not a valid protobuf message."""


def bytes_field(number: int, value: bytes) -> bytes:
    return encode_uvarint(number << 3 | 2) + encode_uvarint(len(value)) + value


def varint_field(number: int, value: int) -> bytes:
    return encode_uvarint(number << 3) + encode_uvarint(value)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    try:
        value, used = decode_uvarint(data[at : at + 10])
    except BadRequest as exc:
        # protobuf writers may emit 10-byte varints for negative int32; none occur here.
        raise ProtoError(str(exc)) from exc
    return value, at + used


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)``: varints as int, length-delimited as bytes."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtoError("field number 0")
        if wire == 0:
            value, at = _varint(data, at)
            yield number, wire, value
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ProtoError("length-delimited field runs past the message")
            yield number, wire, data[at : at + length]
            at += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > len(data):
                raise ProtoError("fixed field runs past the message")
            at += width
        else:
            raise ProtoError(f"unsupported wire type {wire}")


def as_bytes(value: int | bytes) -> bytes:
    """A length-delimited field's value; a varint where bytes belong is invalid."""
    if not isinstance(value, bytes):
        raise ProtoError("a bytes field has the wrong wire type")
    return value


def as_int(value: int | bytes) -> int:
    if not isinstance(value, int):
        raise ProtoError("a varint field has the wrong wire type")
    return value
