"""Canonical unpadded base64url (general.md "base64url encoding").

Every non-canonical spelling (padding, ``+``/``/``, whitespace, non-ASCII, a
length of 1 mod 4, non-zero tail bits) is refused. Decoding runs on every
envelope, key box and certificate field, so it checks the alphabet with one
``bytes.translate`` and the tail bits with a table look-up instead of a regex
and a re-encode; tests/meshline/test_fastpaths.py holds it equal to the
re-encode-and-compare definition.
"""

from __future__ import annotations

import binascii

from gapline.meshline._errors import BadRequest

__all__ = ["b64u_decode", "b64u_encode"]

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")
_TO_URL = bytes.maketrans(b"+/", b"-_")
# Sextet value of each alphabet byte; the bits a final partial group leaves unused
# (4 when len % 4 == 2, 2 when len % 4 == 3) must be zero in canonical text.
_SEXTET = bytes(_ALPHABET.find(bytes([b])) % 64 for b in range(256))
_TAIL_MASK = (0, 0, 0x0F, 0x03)


def b64u_encode(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).rstrip(b"=").translate(_TO_URL).decode("ascii")


def b64u_decode(text: object, *, length: int | None = None, field: str = "value") -> bytes:
    """Decode canonical base64url; ``length`` pins the decoded byte count."""
    if not isinstance(text, str) or not text.isascii():
        raise BadRequest(f"{field}: not canonical base64url")
    raw = text.encode("ascii")
    rest = len(raw) % 4
    if rest == 1 or raw.translate(None, _ALPHABET):
        raise BadRequest(f"{field}: not canonical base64url")
    if rest:
        if _SEXTET[raw[-1]] & _TAIL_MASK[rest]:
            raise BadRequest(f"{field}: non-canonical base64url (tail bits)")
        raw += b"=="[: 4 - rest]
    try:
        data = binascii.a2b_base64(raw.translate(_TO_STANDARD))
    except binascii.Error:  # unreachable after the checks above; kept as a guard
        raise BadRequest(f"{field}: not canonical base64url") from None
    if length is not None and len(data) != length:
        raise BadRequest(f"{field}: expected {length} bytes, got {len(data)}")
    return data
