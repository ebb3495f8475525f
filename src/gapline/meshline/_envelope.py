"""``MessageEnvelope`` and ``EncryptedPayload``: signing, AAD, payload encryption.

The envelope's device signature covers every field but itself (``$type``
included). The payload is AES-256-GCM over the UTF-8 JSON business object with
AAD = network-bound ``meshline.message.aad`` built from the envelope header.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import (
    MAX_SAFE_INTEGER,
    NetworkContext,
    canonical_json,
    json_string,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._errors import BadRequest, DecryptionFailed, InvalidSignature, RequestTooLarge
from gapline.meshline._fields import (
    b64_field,
    extensions,
    int_field,
    object_of,
    str_field,
    type_field,
)
from gapline.meshline._identity import device_verify
from gapline.meshline._ids import check_account_id, check_device_id, check_message_id

__all__ = [
    "ENVELOPE_MAX_BYTES",
    "EncryptedPayload",
    "MessageEnvelope",
    "decrypt_payload",
    "encrypt_payload",
    "envelope_signing_input",
    "message_aad",
    "sign_envelope",
    "verify_envelope",
]

ENVELOPE_TYPE = "meshline.message.envelope"
PAYLOAD_ALG = "AES-256-GCM"
ENVELOPE_MAX_BYTES = 262144

_PAYLOAD_FIELDS = frozenset({"alg", "nonce", "ciphertext"})
_ENVELOPE_FIELDS = frozenset(
    {
        "$type",
        "message_id",
        "created_at",
        "from",
        "from_device_id",
        "to",
        "payload",
        "device_signature",
    }
)


@dataclass(frozen=True, slots=True)
class EncryptedPayload:
    nonce: str
    ciphertext: str
    alg: str = PAYLOAD_ALG
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "alg": self.alg,
            "nonce": self.nonce,
            "ciphertext": self.ciphertext,
        }

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @classmethod
    def from_wire(cls, value: object) -> EncryptedPayload:
        obj = object_of(value, "EncryptedPayload")
        if obj.get("alg") != PAYLOAD_ALG:
            raise BadRequest(f"payload alg must be {PAYLOAD_ALG}")
        ciphertext = obj.get("ciphertext")
        # One decode serves both the canonical-base64url check and the tag-length check.
        if len(b64u_decode(ciphertext, field="ciphertext")) < 16:
            raise BadRequest("payload ciphertext shorter than the GCM tag")
        assert isinstance(ciphertext, str)
        return cls(
            nonce=b64_field(obj, "nonce", 12),
            ciphertext=ciphertext,
            extensions=extensions(obj, _PAYLOAD_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> EncryptedPayload:
        return cls.from_wire(parse_json(data))


@dataclass(frozen=True, slots=True)
class MessageEnvelope:
    """An immutable signed envelope. ``from_``/``to`` are the wire's ``from``/``to``."""

    message_id: str
    created_at: int
    from_: str
    from_device_id: str
    to: str
    payload: EncryptedPayload
    device_signature: str
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "$type": ENVELOPE_TYPE,
            "message_id": self.message_id,
            "created_at": self.created_at,
            "from": self.from_,
            "from_device_id": self.from_device_id,
            "to": self.to,
            "payload": self.payload.to_wire(),
            "device_signature": self.device_signature,
        }

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @property
    def key(self) -> tuple[str, str]:
        """The cross-relay deduplication key ``(from, message_id)``."""
        return (self.from_, self.message_id)

    @classmethod
    def from_wire(cls, value: object) -> MessageEnvelope:
        obj = object_of(value, "MessageEnvelope")
        type_field(obj, ENVELOPE_TYPE)
        from_ = str_field(obj, "from")
        to = str_field(obj, "to")
        for name, account in (("from", from_), ("to", to)):
            if not account.startswith("neo:"):
                raise BadRequest(f"{name}: invalid account ID")
        return cls(
            message_id=check_message_id(obj.get("message_id")),
            created_at=int_field(obj, "created_at", minimum=0),
            from_=from_,
            from_device_id=check_device_id(obj.get("from_device_id"), field="from_device_id"),
            to=to,
            payload=EncryptedPayload.from_wire(obj.get("payload")),
            device_signature=b64_field(obj, "device_signature", 64),
            extensions=extensions(obj, _ENVELOPE_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> MessageEnvelope:
        """Parse, refusing anything over 256 KiB before any other work."""
        if len(data) > 4 * ENVELOPE_MAX_BYTES:
            raise RequestTooLarge("message envelope exceeds 256 KiB")
        envelope = cls.from_wire(parse_json(data))
        check_envelope_size(envelope)
        return envelope


def check_envelope_size(envelope: MessageEnvelope) -> None:
    if len(envelope.to_json()) > ENVELOPE_MAX_BYTES:
        raise RequestTooLarge("message envelope exceeds 256 KiB")


def message_aad(
    *,
    message_id: str,
    created_at: int,
    from_: str,
    from_device_id: str,
    to: str,
    context: NetworkContext,
) -> bytes:
    """The payload AAD: network-bound ``meshline.message.aad``."""
    fast = _bound_header(
        '"meshline.message.aad"', message_id, created_at, from_, from_device_id, to, context, ""
    )
    if fast is not None:
        return fast
    return network_bound_bytes(
        {
            "$type": "meshline.message.aad",
            "message_id": message_id,
            "created_at": created_at,
            "from": from_,
            "from_device_id": from_device_id,
            "to": to,
        },
        context,
    )


def envelope_aad(envelope: MessageEnvelope, context: NetworkContext) -> bytes:
    return message_aad(
        message_id=envelope.message_id,
        created_at=envelope.created_at,
        from_=envelope.from_,
        from_device_id=envelope.from_device_id,
        to=envelope.to,
        context=context,
    )


def encrypt_payload(
    plaintext: bytes, content_key: bytes, aad: bytes, *, nonce: bytes | None = None
) -> EncryptedPayload:
    nonce = os.urandom(12) if nonce is None else nonce
    sealed = AESGCM(content_key).encrypt(nonce, plaintext, aad)
    return EncryptedPayload(nonce=b64u_encode(nonce), ciphertext=b64u_encode(sealed))


def decrypt_payload(payload: EncryptedPayload, content_key: bytes, aad: bytes) -> bytes:
    """Authenticate and decrypt; no plaintext unless the tag verifies."""
    if len(content_key) != 32:
        raise DecryptionFailed("content key must be 32 bytes")
    try:
        return AESGCM(content_key).decrypt(
            b64u_decode(payload.nonce, length=12), b64u_decode(payload.ciphertext), aad
        )
    except InvalidTag:
        raise DecryptionFailed("payload does not authenticate") from None


def envelope_signing_input(
    envelope: MessageEnvelope | Mapping[str, Any], context: NetworkContext
) -> bytes:
    if type(envelope) is MessageEnvelope and not envelope.extensions:
        payload = envelope.payload
        if type(payload) is EncryptedPayload and not payload.extensions:
            fast = bound_envelope_bytes(
                envelope.message_id,
                envelope.created_at,
                envelope.from_,
                envelope.from_device_id,
                envelope.to,
                payload.alg,
                payload.ciphertext,
                payload.nonce,
                context,
            )
            if fast is not None:
                return fast
    wire = envelope.to_wire() if isinstance(envelope, MessageEnvelope) else envelope
    return network_bound_bytes(wire, context, exclude=("device_signature",))


_ENVELOPE_TYPE_JSON = json_string(ENVELOPE_TYPE)


def _bound_header(
    type_json: str,
    message_id: object,
    created_at: object,
    from_: object,
    from_device_id: object,
    to: object,
    context: object,
    payload_member: str,
) -> bytes | None:
    """Network-bound bytes of a header-shaped object, or None to take the generic path.

    Keys in RFC 8785 order: ``$context``, ``$type``, ``created_at``, ``from``,
    ``from_device_id``, ``message_id``, [``payload``,] ``to``. Only exact ``str``
    values, a safe ``int`` and ASCII output qualify; anything else (including every
    input the generic path would refuse) is left to ``network_bound_bytes``.
    """
    if (
        type(message_id) is not str
        or type(from_) is not str
        or type(from_device_id) is not str
        or type(to) is not str
        or not isinstance(context, str)
        or type(created_at) is not int
        or not -MAX_SAFE_INTEGER <= created_at <= MAX_SAFE_INTEGER
    ):
        return None
    text = (
        f'{{"$context":{json_string(context)},"$type":{type_json},"created_at":{created_at},'
        f'"from":{json_string(from_)},"from_device_id":{json_string(from_device_id)},'
        f'"message_id":{json_string(message_id)},{payload_member}"to":{json_string(to)}}}'
    )
    return text.encode("ascii") if text.isascii() else None


def bound_envelope_bytes(
    message_id: object,
    created_at: object,
    from_: object,
    from_device_id: object,
    to: object,
    alg: object,
    ciphertext: object,
    nonce: object,
    context: object,
) -> bytes | None:
    """The signing input of an envelope without extensions, or None (see ``_bound_header``)."""
    if type(alg) is not str or type(ciphertext) is not str or type(nonce) is not str:
        return None
    payload = (
        f'"payload":{{"alg":{json_string(alg)},"ciphertext":{json_string(ciphertext)},'
        f'"nonce":{json_string(nonce)}}},'
    )
    return _bound_header(
        _ENVELOPE_TYPE_JSON, message_id, created_at, from_, from_device_id, to, context, payload
    )


def sign_envelope(
    unsigned: Mapping[str, Any], signing_key: Any, context: NetworkContext
) -> MessageEnvelope:
    """Sign a wire-shaped envelope (``device_signature`` absent or ignored).

    ``signing_key`` is a ``DeviceKeys`` or an Ed25519 private key.
    """
    body = dict(unsigned)
    body.pop("device_signature", None)
    data = network_bound_bytes(body, context)
    if _full_size(data, context) > ENVELOPE_MAX_BYTES:
        raise RequestTooLarge("message envelope exceeds 256 KiB")
    body["device_signature"] = b64u_encode(signing_key.sign(data))
    return MessageEnvelope.from_wire(body)


def _full_size(bound: bytes, context: NetworkContext) -> int:
    """Canonical size of the signed envelope, from its signing input.

    The bound input differs from the full canonical object only by holding the
    ``$context`` member instead of the ``device_signature`` one (86 base64url
    characters), so oversize envelopes are refused before any crypto.
    """
    return len(bound) - len(f'"$context":"{context}",') + len(',"device_signature":""') + 86


def verify_envelope(
    envelope: MessageEnvelope, signing_public_key: bytes, context: NetworkContext
) -> None:
    """Size, account formats for this network, then the device signature."""
    data = envelope_signing_input(envelope, context)
    # The bound input differs from the full canonical object only by swapping the
    # signature member for $context; refuse oversize envelopes before any crypto.
    full = (
        len(data)
        - len(f'"$context":"{context}",')
        + len(f',"device_signature":"{envelope.device_signature}"')
    )
    if full > ENVELOPE_MAX_BYTES:
        raise RequestTooLarge("message envelope exceeds 256 KiB")
    check_account_id(envelope.from_, context, field="from")
    check_account_id(envelope.to, context, field="to")
    if not device_verify(
        signing_public_key, data, b64u_decode(envelope.device_signature, length=64)
    ):
        raise InvalidSignature("envelope device signature does not verify")
