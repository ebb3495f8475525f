"""Canonical JSON, unpadded base64 and Ed25519 signatures over signed JSON objects.

The Matrix spec signs the *canonical* form of an object (keys sorted, no
whitespace, UTF-8, integers only) with its ``signatures`` and ``unsigned``
members removed. A signature covers every other member, including ones this
code does not know, so objects are verified exactly as they were received.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any

import vodozemac

__all__ = [
    "SignatureInvalid",
    "b64decode",
    "b64encode",
    "canonical_json",
    "signed",
    "signing_bytes",
    "verify_signature",
]


class SignatureInvalid(ValueError):
    """A signature is missing, unreadable or does not verify."""


def _no_floats(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError("canonical JSON has no floating-point numbers")
    if isinstance(value, dict):
        for item in value.values():
            _no_floats(item)
    elif isinstance(value, list):
        for item in value:
            _no_floats(item)
    return value


def canonical_json(value: Any) -> bytes:
    """The spec's canonical encoding: sorted keys, compact, UTF-8 (no ``\\u`` escapes
    beyond the ones JSON requires), and no floats."""
    _no_floats(value)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def signing_bytes(obj: Mapping[str, Any]) -> bytes:
    """What a signature of ``obj`` covers: its canonical form without ``signatures``/``unsigned``."""
    return canonical_json({k: v for k, v in obj.items() if k not in ("signatures", "unsigned")})


def b64encode(data: bytes) -> str:
    """Unpadded standard base64, the encoding of every Matrix key and ciphertext."""
    return base64.b64encode(data).decode("ascii").rstrip("=")


def b64decode(text: str) -> bytes:
    """Decode unpadded (or padded) standard base64; anything else is a ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError("base64 value is not a string")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not valid base64: {exc}") from None


def signed(
    obj: Mapping[str, Any], user_id: str, key_id: str, sign: Callable[[bytes], str]
) -> dict[str, Any]:
    """A copy of ``obj`` carrying one more signature, ``sign`` returning base64."""
    signature = sign(signing_bytes(obj))
    out = dict(obj)
    signatures = {u: dict(s) for u, s in dict(obj.get("signatures", {})).items()}
    signatures.setdefault(user_id, {})[key_id] = signature
    out["signatures"] = signatures
    return out


def verify_signature(obj: Mapping[str, Any], user_id: str, key_id: str, ed25519: str) -> None:
    """Check ``obj``'s signature by ``user_id``'s ``key_id`` (``ed25519:...``) against the
    base64 public key ``ed25519``; raise `SignatureInvalid` with the reason otherwise."""
    signatures = obj.get("signatures")
    if not isinstance(signatures, dict):
        raise SignatureInvalid("the object carries no signatures")
    by_user = signatures.get(user_id)
    if not isinstance(by_user, dict) or not isinstance(by_user.get(key_id), str):
        raise SignatureInvalid(f"no signature by {user_id} {key_id}")
    try:
        message = signing_bytes(obj)
        key = vodozemac.Ed25519PublicKey.from_base64(ed25519)
        signature = vodozemac.Ed25519Signature.from_base64(by_user[key_id])
        key.verify_signature(message, signature)
    except (vodozemac.KeyException, vodozemac.SignatureException, ValueError) as exc:
        raise SignatureInvalid(f"signature by {user_id} {key_id} does not verify: {exc}") from None
