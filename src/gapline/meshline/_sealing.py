"""Whole-message construction and opening: the ``message.send`` params object.

Sealing: random content key → payload encrypted under the message AAD →
envelope signed by the device → one key box per recipient device (recipient
account) and, optionally, per sender device (sender account).
Opening (messages-and-content.md "Random sources and recipient validation"):
envelope signature first, then the key box, then the payload; no plaintext
escapes unless every step passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import x25519

from gapline.meshline._base64 import b64u_encode
from gapline.meshline._canonical import (
    NetworkContext,
    canonical_json,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._certificates import DeviceCertificate
from gapline.meshline._envelope import (
    ENVELOPE_MAX_BYTES,
    ENVELOPE_TYPE,
    MessageEnvelope,
    _full_size,
    bound_envelope_bytes,
    decrypt_payload,
    encrypt_payload,
    envelope_aad,
    message_aad,
    verify_envelope,
)
from gapline.meshline._errors import BadRequest, RequestTooLarge
from gapline.meshline._fields import object_of
from gapline.meshline._identity import DeviceKeys
from gapline.meshline._ids import (
    check_account_id,
    check_device_id,
    check_message_id,
    new_message_id,
)
from gapline.meshline._keybox import (
    MAX_BOXES,
    MessageKeyBox,
    check_box_set,
    seal_boxes,
    unwrap_content_key,
)

__all__ = ["BoxTarget", "SendParams", "open_envelope", "seal_message"]


@dataclass(frozen=True, slots=True)
class BoxTarget:
    """A device to wrap the content key for: its ID and X25519 public key."""

    device_id: str
    encryption_public_key: bytes

    @classmethod
    def of(cls, cert: DeviceCertificate, context: NetworkContext) -> BoxTarget:
        return cls(cert.device_id(context), cert.encryption_key_bytes)


@dataclass(frozen=True, slots=True)
class SendParams:
    """``message.send`` params: ``{envelope, recipient_boxes, sender_boxes?, authorization?}``."""

    envelope: MessageEnvelope
    recipient_boxes: tuple[MessageKeyBox, ...]
    sender_boxes: tuple[MessageKeyBox, ...] | None = None
    authorization: Mapping[str, Any] | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            **self.extensions,
            "envelope": self.envelope.to_wire(),
            "recipient_boxes": [b.to_wire() for b in self.recipient_boxes],
        }
        if self.sender_boxes is not None:
            wire["sender_boxes"] = [b.to_wire() for b in self.sender_boxes]
        if self.authorization is not None:
            wire["authorization"] = dict(self.authorization)
        return wire

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @classmethod
    def from_wire(cls, value: object) -> SendParams:
        """Structure only: box-set shape, self-delivery without sender boxes."""
        obj = object_of(value, "message.send params")
        envelope = MessageEnvelope.from_wire(obj.get("envelope"))
        recipient_boxes = check_box_set(obj.get("recipient_boxes"), "recipient_boxes")
        sender_boxes = None
        if "sender_boxes" in obj:
            if envelope.from_ == envelope.to:
                raise BadRequest("sender_boxes must be omitted for self-delivery")
            sender_boxes = check_box_set(obj.get("sender_boxes"), "sender_boxes")
        authorization = obj.get("authorization")
        if "authorization" in obj and not isinstance(authorization, Mapping):
            raise BadRequest("authorization: expected an object")
        known = {"envelope", "recipient_boxes", "sender_boxes", "authorization"}
        return cls(
            envelope=envelope,
            recipient_boxes=recipient_boxes,
            sender_boxes=sender_boxes,
            authorization=authorization,
            extensions={k: v for k, v in obj.items() if k not in known},
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> SendParams:
        return cls.from_wire(parse_json(data))


def seal_message(
    content: Mapping[str, Any],
    *,
    device_keys: DeviceKeys,
    from_: str,
    from_device_id: str,
    to: str,
    recipients: Sequence[BoxTarget],
    context: NetworkContext,
    senders: Sequence[BoxTarget] | None = None,
    created_at: int | None = None,
    message_id: str | None = None,
    content_key: bytes | None = None,
) -> SendParams:
    """Encrypt ``content`` (a business object with ``$type``) into ``message.send`` params."""
    if not isinstance(content.get("$type"), str):
        raise BadRequest("business object needs a string $type")
    if senders is not None and from_ == to:
        raise BadRequest("sender boxes must be omitted for self-delivery")
    for name, targets in (("recipient", recipients), ("sender", senders or ())):
        if len({t.device_id for t in targets}) != len(targets) or len(targets) > MAX_BOXES:
            raise BadRequest(f"{name} boxes: at most {MAX_BOXES} distinct devices")
    if not recipients or senders == []:
        raise BadRequest("a box set needs at least one device")
    check_account_id(from_, context, field="from")
    check_account_id(to, context, field="to")
    check_device_id(from_device_id, field="from_device_id")
    message_id = new_message_id() if message_id is None else check_message_id(message_id)
    created_at = int(time.time()) if created_at is None else created_at
    # One OS draw for the content key and every GCM nonce (payload, then one per box):
    # disjoint slices of one draw are as independent as separate draws, and the
    # getrandom calls saved cost more than the slicing.
    box_count = len(recipients) + (0 if senders is None else len(senders))
    randomness = os.urandom(44 + 12 * box_count)
    key: bytes = randomness[:32] if content_key is None else content_key
    aad = message_aad(
        message_id=message_id,
        created_at=created_at,
        from_=from_,
        from_device_id=from_device_id,
        to=to,
        context=context,
    )
    plaintext = canonical_json(content if type(content) is dict else dict(content))
    payload = encrypt_payload(plaintext, key, aad, nonce=randomness[32:44])
    # Built from checked parts, so no re-parse: sign the bound bytes directly.
    data = bound_envelope_bytes(
        message_id,
        created_at,
        from_,
        from_device_id,
        to,
        payload.alg,
        payload.ciphertext,
        payload.nonce,
        context,
    )
    if data is None:
        data = network_bound_bytes(
            {
                "$type": ENVELOPE_TYPE,
                "message_id": message_id,
                "created_at": created_at,
                "from": from_,
                "from_device_id": from_device_id,
                "to": to,
                "payload": payload.to_wire(),
            },
            context,
        )
    if _full_size(data, context) > ENVELOPE_MAX_BYTES:
        raise RequestTooLarge("message envelope exceeds 256 KiB")
    envelope = MessageEnvelope(
        message_id=message_id,
        created_at=created_at,
        from_=from_,
        from_device_id=from_device_id,
        to=to,
        payload=payload,
        device_signature=b64u_encode(device_keys.sign(data)),
    )
    # Nonces follow the payload's in ``randomness``: recipients' boxes first, then senders'.
    targets = [(to, t) for t in recipients] + [(from_, t) for t in senders or ()]
    boxes = seal_boxes(
        key,
        envelope,
        (
            (account, t.device_id, t.encryption_public_key, randomness[at : at + 12])
            for at, (account, t) in zip(range(44, len(randomness), 12), targets, strict=True)
        ),
        context,
    )
    recipient_boxes = boxes[: len(recipients)]
    sender_boxes = None if senders is None else boxes[len(recipients) :]
    return SendParams(envelope, recipient_boxes, sender_boxes)


def open_envelope(
    envelope: MessageEnvelope,
    key_box: MessageKeyBox,
    *,
    sender_signing_key: bytes,
    box_account: str,
    encryption_key: x25519.X25519PrivateKey,
    context: NetworkContext,
) -> bytes:
    """Verify, unwrap, authenticate and decrypt; the plaintext bytes of the business object.

    ``box_account`` is the account the box was sealed for: the envelope's
    ``to`` for a received record, its ``from`` for a sent record.
    """
    verify_envelope(envelope, sender_signing_key, context)
    content_key = unwrap_content_key(
        key_box,
        envelope,
        account=box_account,
        encryption_key=encryption_key,
        context=context,
    )
    return decrypt_payload(envelope.payload, content_key, envelope_aad(envelope, context))
