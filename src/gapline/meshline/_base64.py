"""Canonical unpadded base64url (general.md "base64url encoding").

Decoding re-encodes and compares, so every non-canonical spelling (padding,
``+``/``/``, whitespace, a length of 1 mod 4, non-zero tail bits) is refused.
"""

from __future__ import annotations

import base64
import binascii
import re

from gapline.meshline._errors import BadRequest

__all__ = ["b64u_decode", "b64u_encode"]

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")


def b64u_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64u_decode(text: object, *, length: int | None = None, field: str = "value") -> bytes:
    """Decode canonical base64url; ``length`` pins the decoded byte count."""
    if not isinstance(text, str) or _ALPHABET.fullmatch(text) is None or len(text) % 4 == 1:
        raise BadRequest(f"{field}: not canonical base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise BadRequest(f"{field}: not canonical base64url") from None
    if b64u_encode(data) != text:
        raise BadRequest(f"{field}: non-canonical base64url (tail bits)")
    if length is not None and len(data) != length:
        raise BadRequest(f"{field}: expected {length} bytes, got {len(data)}")
    return data
