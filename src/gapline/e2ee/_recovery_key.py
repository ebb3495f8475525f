"""The recovery key as Element shows it: Base58 of 0x8B 0x01, the 32-byte key, a parity byte.

The parity byte is the XOR of every byte before it, so a mistyped key is
told apart from a wrong one before any MAC is tried. The text is shown in
groups of four characters; spaces (and any other whitespace) are ignored when
it is read back.
"""

from __future__ import annotations

from functools import reduce

from ._errors import E2eeError

__all__ = ["RecoveryKeyInvalid", "decode_recovery_key", "encode_recovery_key"]

_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # Bitcoin's
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
_PREFIX = b"\x8b\x01"


class RecoveryKeyInvalid(E2eeError):
    """The text is not a recovery key (bad character, length, prefix or parity)."""


def _b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = []
    while number:
        number, digit = divmod(number, 58)
        out.append(_ALPHABET[digit])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(out))


def _b58decode(text: str) -> bytes:
    number = 0
    for c in text:
        if c not in _INDEX:
            raise RecoveryKeyInvalid(f"{c!r} is not a Base58 character")
        number = number * 58 + _INDEX[c]
    zeros = len(text) - len(text.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * zeros + body


def _parity(data: bytes) -> int:
    return reduce(lambda a, b: a ^ b, data, 0)


def encode_recovery_key(key: bytes) -> str:
    """The 32-byte secret-storage key as the recovery key text (groups of four)."""
    if len(key) != 32:
        raise ValueError("a recovery key holds 32 bytes")
    raw = _PREFIX + key
    text = _b58encode(raw + bytes([_parity(raw)]))
    return " ".join(text[i : i + 4] for i in range(0, len(text), 4))


def decode_recovery_key(text: str) -> bytes:
    """The 32-byte key in a recovery key text; raises `RecoveryKeyInvalid`."""
    raw = _b58decode("".join(text.split()))
    if len(raw) != len(_PREFIX) + 32 + 1:
        raise RecoveryKeyInvalid(f"{len(raw)} bytes, not the 35 of a recovery key")
    if raw[:2] != _PREFIX:
        raise RecoveryKeyInvalid("the recovery key prefix is wrong")
    if _parity(raw[:-1]) != raw[-1]:
        raise RecoveryKeyInvalid("the parity check fails: a character is mistyped")
    return raw[2:-1]
