"""``MessageKeyBox``: X25519 + HKDF-SHA256 + AES-256-GCM wrapping of a content key.

KDF info and the box's AAD are the same bytes: network-bound
``meshline.message.key_box.aad`` naming the message header, the account
allowed to decrypt (recipient account for recipient boxes, sender account for
sender boxes), the device and the ephemeral key. An all-zero X25519 result
aborts the operation on both sides.

Backends, chosen per primitive by ``bench/crypto_primitives.py`` (docs/meshline.md
"Benchmark and performance"): sealing makes its one-time key pair and its exchange
with libsodium (PyNaCl), about twice as fast for the key generation; opening's
exchange stays on ``cryptography`` (no measurable difference, and the caller's key is
a ``cryptography`` object).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from nacl import bindings as _sodium
from nacl.exceptions import RuntimeError as _SodiumError

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import (
    MAX_SAFE_INTEGER,
    NetworkContext,
    canonical_json,
    json_string,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._errors import BadRequest, DecryptionFailed
from gapline.meshline._fields import b64_field, extensions, object_of
from gapline.meshline._ids import check_device_id

__all__ = [
    "KEYBOX_ALG",
    "KEYBOX_SALT",
    "MAX_BOXES",
    "BoxHeader",
    "MessageHeader",
    "MessageKeyBox",
    "check_box_set",
    "key_box_info",
    "seal_boxes",
    "unwrap_content_key",
    "wrap_content_key",
    "x25519_shared_secret",
]

KEYBOX_ALG = "X25519-HKDF-SHA256-AES256GCM"
KEYBOX_SALT = hashlib.sha256(b"Meshline/keybox-salt/v1").digest()
MAX_BOXES = 8
_ZERO32 = bytes(32)
_BOX_FIELDS = frozenset({"device_id", "alg", "enc", "sealed_key"})


class BoxHeader(Protocol):
    """What a key box is bound to: a ``MessageHeader``, or the ``MessageEnvelope`` itself
    (sealing and opening pass the envelope and skip building a header per box)."""

    @property
    def message_id(self) -> str: ...
    @property
    def created_at(self) -> int: ...
    @property
    def from_(self) -> str: ...
    @property
    def from_device_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class MessageHeader:
    """The envelope fields a key box is bound to."""

    message_id: str
    created_at: int
    from_: str
    from_device_id: str

    @classmethod
    def of(cls, envelope: Any) -> MessageHeader:
        return cls(
            envelope.message_id, envelope.created_at, envelope.from_, envelope.from_device_id
        )


@dataclass(frozen=True, slots=True)
class MessageKeyBox:
    device_id: str
    enc: str
    sealed_key: str
    alg: str = KEYBOX_ALG
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "device_id": self.device_id,
            "alg": self.alg,
            "enc": self.enc,
            "sealed_key": self.sealed_key,
        }

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @classmethod
    def from_wire(cls, value: object) -> MessageKeyBox:
        obj = object_of(value, "MessageKeyBox")
        if obj.get("alg") != KEYBOX_ALG:
            raise BadRequest(f"key box alg must be {KEYBOX_ALG}")
        return cls(
            device_id=check_device_id(obj.get("device_id")),
            enc=b64_field(obj, "enc", 32),
            sealed_key=b64_field(obj, "sealed_key", 60),
            extensions=extensions(obj, _BOX_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> MessageKeyBox:
        return cls.from_wire(parse_json(data))


def check_box_set(value: object, what: str) -> tuple[MessageKeyBox, ...]:
    """1..8 boxes with distinct device IDs."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_BOXES:
        raise BadRequest(f"{what}: expected 1 to {MAX_BOXES} key boxes")
    boxes = tuple(MessageKeyBox.from_wire(v) for v in value)
    if len({b.device_id for b in boxes}) != len(boxes):
        raise BadRequest(f"{what}: device IDs must be distinct")
    return boxes


def x25519_shared_secret(private_key: x25519.X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519 with the mandatory all-zero check (general.md)."""
    try:
        secret = private_key.exchange(x25519.X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        # cryptography refuses an all-zero result itself on some builds.
        raise DecryptionFailed("X25519 shared secret is all zero") from None
    if secret == _ZERO32:
        raise DecryptionFailed("X25519 shared secret is all zero")
    return secret


def _ephemeral_shared_secret(ephemeral_secret: bytes, peer_public: bytes) -> bytes:
    """``x25519_shared_secret`` for a raw one-time scalar, computed by libsodium.

    libsodium's ``crypto_scalarmult`` fails (PyNaCl raises its RuntimeError) when the
    result is all zero; it refuses the small-order peer points up front, and those
    are exactly the inputs whose clamped-scalar product is zero, so accepting and
    refusing match RFC 7748 + the zero check (the ``common`` x25519 vectors are run
    through this function as well). PyNaCl does not check lengths before handing
    pointers to C, so they are checked here (the same error ``cryptography``'s
    refusal of a malformed key gave before).
    """
    if len(ephemeral_secret) != 32 or len(peer_public) != 32:
        raise DecryptionFailed("X25519 keys must be 32 bytes")
    try:
        secret = _sodium.crypto_scalarmult(bytes(ephemeral_secret), bytes(peer_public))
    except _SodiumError:
        raise DecryptionFailed("X25519 shared secret is all zero") from None
    if secret == _ZERO32:
        raise DecryptionFailed("X25519 shared secret is all zero")
    return secret


def key_box_info(
    header: BoxHeader, *, account: str, device_id: str, enc: str, context: NetworkContext
) -> bytes:
    parts = _info_parts(header, context)
    if parts is not None:
        info = _info_from_parts(parts, account, device_id, enc)
        if info is not None:
            return info
    return network_bound_bytes(
        {
            "$type": "meshline.message.key_box.aad",
            "alg": KEYBOX_ALG,
            "payload_alg": "AES-256-GCM",
            "message_id": header.message_id,
            "created_at": header.created_at,
            "from": header.from_,
            "from_device_id": header.from_device_id,
            "account": account,
            "device_id": device_id,
            "enc": enc,
        },
        context,
    )


# The fixed-shape fast path (see ``_canonical.json_string``). Key order (RFC 8785):
# $context, $type, account, alg, created_at, device_id, enc, from, from_device_id,
# message_id, payload_alg. Only the account, device and ephemeral key differ between
# the boxes of one message, so the rest is built once per message. Exact str / safe int
# values and ASCII output only; anything else takes the generic ``network_bound_bytes``.
_InfoParts = tuple[str, str, str]


def _info_parts(header: BoxHeader, context: object) -> _InfoParts | None:
    message_id, created_at = header.message_id, header.created_at
    from_, from_device_id = header.from_, header.from_device_id
    if (
        type(message_id) is not str
        or type(from_) is not str
        or type(from_device_id) is not str
        or not isinstance(context, str)
        or type(created_at) is not int
        or not -MAX_SAFE_INTEGER <= created_at <= MAX_SAFE_INTEGER
    ):
        return None
    return (
        f'{{"$context":{json_string(context)},"$type":"meshline.message.key_box.aad","account":',
        f',"alg":"{KEYBOX_ALG}","created_at":{created_at},"device_id":',
        f',"from":{json_string(from_)},"from_device_id":{json_string(from_device_id)},'
        f'"message_id":{json_string(message_id)},"payload_alg":"AES-256-GCM"}}',
    )


def _info_from_parts(
    parts: _InfoParts, account: object, device_id: object, enc: object
) -> bytes | None:
    if type(account) is not str or type(device_id) is not str or type(enc) is not str:
        return None
    head, middle, tail = parts
    text = (
        f"{head}{json_string(account)}{middle}{json_string(device_id)}"
        f',"enc":{json_string(enc)}{tail}'
    )
    return text.encode("ascii") if text.isascii() else None


_SHA256 = hashes.SHA256()


def _wrap_key(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=_SHA256, length=32, salt=KEYBOX_SALT, info=info).derive(secret)


def wrap_content_key(
    content_key: bytes,
    header: BoxHeader,
    *,
    account: str,
    device_id: str,
    encryption_public_key: bytes,
    context: NetworkContext,
    ephemeral: x25519.X25519PrivateKey | None = None,
    nonce: bytes | None = None,
) -> MessageKeyBox:
    """Seal ``content_key`` for one device of ``account`` (fresh ephemeral key per box)."""
    return _wrap(
        content_key,
        header,
        _info_parts(header, context),
        account,
        device_id,
        encryption_public_key,
        context,
        os.urandom(32) if ephemeral is None else ephemeral.private_bytes_raw(),
        os.urandom(12) if nonce is None else nonce,
    )


def _wrap(
    content_key: bytes,
    header: BoxHeader,
    parts: _InfoParts | None,
    account: str,
    device_id: str,
    encryption_public_key: bytes,
    context: NetworkContext,
    ephemeral_secret: bytes,
    nonce: bytes,
) -> MessageKeyBox:
    """``wrap_content_key`` with the message's info parts built by the caller (once).

    ``ephemeral_secret`` is the one-time X25519 scalar (32 random bytes; X25519
    clamps it), so the key pair costs one libsodium base-point multiplication.
    """
    secret = _ephemeral_shared_secret(ephemeral_secret, encryption_public_key)
    enc = b64u_encode(_sodium.crypto_scalarmult_base(ephemeral_secret))
    info = None if parts is None else _info_from_parts(parts, account, device_id, enc)
    if info is None:
        info = key_box_info(header, account=account, device_id=device_id, enc=enc, context=context)
    sealed = AESGCM(_wrap_key(secret, info)).encrypt(nonce, content_key, info)
    return MessageKeyBox(device_id=device_id, enc=enc, sealed_key=b64u_encode(nonce + sealed))


def seal_boxes(
    content_key: bytes,
    header: BoxHeader,
    targets: Iterable[tuple[str, str, bytes, bytes]],
    context: NetworkContext,
) -> tuple[MessageKeyBox, ...]:
    """One box per ``(account, device_id, encryption_public_key, nonce)``, fresh ephemeral each.

    ``seal_message``'s path: the info text shared by the boxes is built once, and the
    one-time scalars of all boxes come from one OS random draw (disjoint slices).
    """
    parts = _info_parts(header, context)
    targets = tuple(targets)
    scalars = os.urandom(32 * len(targets))
    return tuple(
        _wrap(
            content_key,
            header,
            parts,
            account,
            device_id,
            public,
            context,
            scalars[at : at + 32],
            nonce,
        )
        for at, (account, device_id, public, nonce) in zip(
            range(0, len(scalars), 32), targets, strict=True
        )
    )


def unwrap_content_key(
    box: MessageKeyBox,
    header: BoxHeader,
    *,
    account: str,
    encryption_key: x25519.X25519PrivateKey,
    context: NetworkContext,
) -> bytes:
    """Recover the content key; DecryptionFailed on any mismatch."""
    secret = x25519_shared_secret(encryption_key, b64u_decode(box.enc, length=32))
    info = key_box_info(
        header, account=account, device_id=box.device_id, enc=box.enc, context=context
    )
    sealed = b64u_decode(box.sealed_key, length=60)
    try:
        key = AESGCM(_wrap_key(secret, info)).decrypt(sealed[:12], sealed[12:], info)
    except InvalidTag:
        raise DecryptionFailed("key box does not authenticate") from None
    return key
