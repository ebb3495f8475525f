"""Identifier formats: Neo N3 account IDs, relay IDs, device IDs, message IDs.

Account ID (accounts-and-devices.md): ``neo:<magic>:<address>`` where the
address is Base58Check(0x35 || hash160(verification script)) and the script
is the Neo N3 single-signature script for the compressed P-256 key. The relay
ID is ``0x`` + hash160 in Neo's display order (byte-reversed).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from typing import Any

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import NetworkContext, network_bound_bytes
from gapline.meshline._errors import BadRequest
from gapline.meshline._ripemd160 import ripemd160

__all__ = [
    "DEVICE_ID_RE",
    "MESSAGE_ID_RE",
    "RELAY_ID_RE",
    "b58decode",
    "b58encode",
    "check_account_id",
    "check_device_id",
    "check_message_id",
    "check_relay_id",
    "decode_prefixed",
    "derive_device_id",
    "neo_account_id",
    "neo_script_hash",
    "new_message_id",
    "relay_id_from_public_key",
]

DEVICE_ID_RE = re.compile(r"dev_[A-Za-z0-9_-]{22}")
MESSAGE_ID_RE = re.compile(r"msg_[A-Za-z0-9_-]{22}")
RELAY_ID_RE = re.compile(r"0x[0-9a-f]{40}")
_ACCOUNT_RE = re.compile(r"neo:(0|[1-9][0-9]{0,9}):[1-9A-HJ-NP-Za-km-z]{34}")
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_NEO_ADDRESS_VERSION = 0x35
# PUSHDATA1 33 <key> SYSCALL System.Crypto.CheckSig (interop hash 0x56e7b327, little-endian id).
_CHECKSIG = bytes.fromhex("4156e7b327")


def _hash160(data: bytes) -> bytes:
    return ripemd160(hashlib.sha256(data).digest())


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58[r])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Base58 (Bitcoin alphabet) text to bytes; leading ``1``s are zero bytes."""
    n = 0
    for ch in text:
        digit = _B58.find(ch)
        if digit < 0:
            raise BadRequest(f"not base58: {ch!r}")
        n = n * 58 + digit
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def neo_script_hash(public_key: bytes) -> bytes:
    """hash160 of the single-signature verification script (little-endian UInt160 bytes)."""
    if len(public_key) != 33 or public_key[0] not in (2, 3):
        raise BadRequest("account public key must be a 33-byte compressed P-256 point")
    return _hash160(b"\x0c\x21" + public_key + _CHECKSIG)


def neo_account_id(public_key: bytes, context: NetworkContext) -> str:
    """``neo:<magic>:<address>`` for a compressed P-256 public key."""
    payload = bytes([_NEO_ADDRESS_VERSION]) + neo_script_hash(public_key)
    checksum = hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    return f"neo:{context.magic}:{b58encode(payload + checksum)}"


def relay_id_from_public_key(public_key: bytes) -> str:
    """``0x`` + the script hash in Neo display order (reversed bytes)."""
    return "0x" + neo_script_hash(public_key)[::-1].hex()


def check_account_id(value: object, context: NetworkContext, *, field: str = "account") -> str:
    """Format check plus the rule that the magic equals the trusted context's."""
    if not isinstance(value, str) or _ACCOUNT_RE.fullmatch(value) is None:
        raise BadRequest(f"{field}: invalid account ID")
    if int(value.split(":")[1]) != context.magic:
        raise BadRequest(f"{field}: account belongs to another network")
    return value


def check_device_id(value: object, *, field: str = "device_id") -> str:
    if not isinstance(value, str) or DEVICE_ID_RE.fullmatch(value) is None:
        raise BadRequest(f"{field}: invalid device ID")
    return value


def check_message_id(value: object, *, field: str = "message_id") -> str:
    if not isinstance(value, str) or MESSAGE_ID_RE.fullmatch(value) is None:
        raise BadRequest(f"{field}: invalid message ID")
    return value


def check_relay_id(value: object, *, field: str = "relay_id") -> str:
    """``0x`` + 40 lowercase hex digits, exactly (registry/core-objects.md: no case folding)."""
    if not isinstance(value, str) or RELAY_ID_RE.fullmatch(value) is None:
        raise BadRequest(f"{field}: invalid relay ID")
    return value


def new_message_id() -> str:
    return "msg_" + b64u_encode(os.urandom(16))


def device_identity_input(
    account: str, signing_public_key: str, encryption_public_key: str
) -> Mapping[str, Any]:
    return {
        "$type": "meshline.device.identity",
        "account": account,
        "signing_public_key": signing_public_key,
        "encryption_public_key": encryption_public_key,
    }


def derive_device_id(
    account: str, signing_public_key: str, encryption_public_key: str, context: NetworkContext
) -> str:
    """``dev_`` + b64u(first 16 bytes of SHA-256(network-bound identity input))."""
    data = network_bound_bytes(
        device_identity_input(account, signing_public_key, encryption_public_key), context
    )
    return "dev_" + b64u_encode(hashlib.sha256(data).digest()[:16])


def decode_prefixed(value: object, prefix: str, length: int) -> bytes:
    """Bytes of a ``<prefix><canonical base64url>`` identifier (case-sensitive prefix)."""
    if not isinstance(value, str) or not value.startswith(prefix):
        raise BadRequest(f"identifier must start with {prefix!r}")
    return b64u_decode(value[len(prefix) :], length=length, field=prefix)
