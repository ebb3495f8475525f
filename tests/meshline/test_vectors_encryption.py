"""message-encryption-v1.json: envelope signature, payload AAD, key boxes, the full send request."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gapline.meshline import (
    DecryptionFailed,
    DeviceCertificate,
    InvalidSignature,
    MessageEnvelope,
    MessageHeader,
    NetworkContext,
    SendParams,
    b64u_decode,
    b64u_encode,
    decrypt_payload,
    encrypt_payload,
    envelope_signing_input,
    message_aad,
    network_bound_bytes,
    open_envelope,
    sign_envelope,
    unwrap_content_key,
    verify_certificate,
    verify_envelope,
    wrap_content_key,
)
from gapline.meshline._keybox import KEYBOX_SALT, key_box_info
from tests.meshline.vectors import load, pointer

V = load("message-encryption-v1.json")
CTX = NetworkContext(V["network_context"])
ES = V["envelope_signature"]
ENC = V["payload"]["encryption"]
TL = V["timeline"]


def x_priv(b64: str) -> x25519.X25519PrivateKey:
    return x25519.X25519PrivateKey.from_private_bytes(b64u_decode(b64))


def aad_of(envelope: MessageEnvelope, context: NetworkContext = CTX) -> bytes:
    return message_aad(
        message_id=envelope.message_id,
        created_at=envelope.created_at,
        from_=envelope.from_,
        from_device_id=envelope.from_device_id,
        to=envelope.to,
        context=context,
    )


def test_envelope_signature_recreated() -> None:
    wire = pointer(V, ES["unsigned_object_ref"])
    envelope = MessageEnvelope.from_wire(wire)
    assert envelope.to_wire() == wire
    assert envelope_signing_input(envelope, CTX).hex() == ES["signing_input_utf8_hex"]
    key = ed25519.Ed25519PrivateKey.from_private_bytes(b64u_decode(ES["private_key"]))
    resigned = sign_envelope(wire, key, CTX)
    assert resigned.device_signature == ES["signature"] == envelope.device_signature
    verify_envelope(envelope, b64u_decode(ES["public_key"]), CTX)
    boxes = pointer(V, ES["recipient_boxes_ref"])
    assert boxes[0]["sealed_key"] == ENC["sealed_key"]  # boxes are not covered by the signature


def test_payload_aad() -> None:
    envelope = MessageEnvelope.from_wire(ENC["envelope"])
    assert aad_of(envelope).hex() == V["payload"]["aad"]["utf8_hex"]


def test_payload_encryption_step_by_step() -> None:
    envelope = MessageEnvelope.from_wire(ENC["envelope"])
    box = ENC["recipient_boxes"][0]
    recipient = x_priv(ENC["recipient_private_key"])
    ephemeral = x_priv(ENC["ephemeral_private_key"])
    assert b64u_encode(recipient.public_key().public_bytes_raw()) == ENC["recipient_public_key"]
    assert b64u_encode(ephemeral.public_key().public_bytes_raw()) == ENC["ephemeral_public_key"]
    assert box["enc"] == ENC["ephemeral_public_key"]
    secret = ephemeral.exchange(recipient.public_key())
    assert b64u_encode(secret) == ENC["shared_secret"]
    assert b64u_encode(KEYBOX_SALT) == ENC["hkdf_salt"]
    header = MessageHeader.of(envelope)
    info = key_box_info(
        header, account=envelope.to, device_id=box["device_id"], enc=box["enc"], context=CTX
    )
    assert (
        base64.b64encode(info).decode() == ENC["hkdf_info"] == ENC["key_box_aad"]
    )  # padded std b64
    wrap = HKDF(hashes.SHA256(), 32, KEYBOX_SALT, info).derive(secret)
    assert b64u_encode(wrap) == ENC["wrap_key"]
    content_key = b64u_decode(ENC["content_key"])
    # Re-create the box bit for bit with the vector's ephemeral key and nonce.
    rebuilt = wrap_content_key(
        content_key,
        header,
        account=envelope.to,
        device_id=box["device_id"],
        encryption_public_key=b64u_decode(ENC["recipient_public_key"]),
        context=CTX,
        ephemeral=ephemeral,
        nonce=b64u_decode(ENC["key_box_nonce"]),
    )
    assert rebuilt.to_wire() == box
    assert rebuilt.sealed_key == ENC["sealed_key"]
    # Re-create the payload bit for bit with the vector's nonce.
    plaintext = bytes.fromhex(ENC["plaintext_utf8_hex"])
    payload = encrypt_payload(
        plaintext, content_key, aad_of(envelope), nonce=b64u_decode(ENC["payload_nonce"])
    )
    assert payload == envelope.payload and payload.ciphertext == ENC["ciphertext"]
    # And open it the way a recipient does.
    from gapline.meshline import MessageKeyBox

    key = unwrap_content_key(
        MessageKeyBox.from_wire(box),
        header,
        account=envelope.to,
        encryption_key=recipient,
        context=CTX,
    )
    assert key == content_key
    assert decrypt_payload(envelope.payload, key, aad_of(envelope)) == plaintext
    opened = open_envelope(
        envelope,
        MessageKeyBox.from_wire(box),
        sender_signing_key=b64u_decode(ES["public_key"]),
        box_account=envelope.to,
        encryption_key=recipient,
        context=CTX,
    )
    assert opened == plaintext


@pytest.mark.parametrize(
    "case",
    V["payload"]["aad_rejection_cases"],
    ids=[c["name"] for c in V["payload"]["aad_rejection_cases"]],
)
def test_aad_rejection(case: dict[str, Any]) -> None:
    envelope = MessageEnvelope.from_wire(ENC["envelope"])
    aad_obj = {
        "$type": "meshline.message.aad",
        "message_id": envelope.message_id,
        "created_at": envelope.created_at,
        "from": envelope.from_,
        "from_device_id": envelope.from_device_id,
        "to": envelope.to,
    }
    overrides = dict(case["aad_overrides"])
    context = NetworkContext(overrides.pop("$context", CTX))
    aad_obj.update(overrides)
    assert case["expected_authenticated"] is False
    with pytest.raises(DecryptionFailed):
        decrypt_payload(
            envelope.payload, b64u_decode(ENC["content_key"]), network_bound_bytes(aad_obj, context)
        )


# --- timeline: the complete message.send request with sender and recipient boxes ---------------


def request() -> SendParams:
    wire = {k: v for k, v in TL["request"].items() if k != "signer_certificate"}
    return SendParams.from_wire(wire)


def test_timeline_request_certificate_and_signature() -> None:
    cert = DeviceCertificate.from_wire(TL["request"]["signer_certificate"])
    params = request()
    assert verify_certificate(cert, CTX) == params.envelope.from_device_id
    assert cert.account == params.envelope.from_
    signing = ed25519.Ed25519PrivateKey.from_private_bytes(
        b64u_decode(TL["sender_signing_private_key"])
    )
    assert signing.public_key().public_bytes_raw() == cert.signing_key_bytes
    assert (
        envelope_signing_input(params.envelope, CTX).hex() == TL["envelope_signing_input_utf8_hex"]
    )
    assert (
        sign_envelope(params.envelope.to_wire(), signing, CTX).device_signature
        == params.envelope.device_signature
    )
    verify_envelope(params.envelope, cert.signing_key_bytes, CTX)
    assert aad_of(params.envelope).hex() == TL["message_aad_utf8_hex"]
    assert params.to_wire() == {k: v for k, v in TL["request"].items() if k != "signer_certificate"}


@pytest.mark.parametrize("which", ["target_key_box", "sender_key_box"])
def test_timeline_key_boxes_recreated(which: str) -> None:
    params = request()
    envelope = params.envelope
    cert = DeviceCertificate.from_wire(TL["request"]["signer_certificate"])
    block = TL[which]
    if which == "target_key_box":
        box, account = params.recipient_boxes[0], envelope.to
        private = x_priv(TL["target_encryption_private_key"])
    else:
        assert params.sender_boxes is not None
        box, account = params.sender_boxes[0], envelope.from_
        private = x_priv(TL["sender_encryption_private_key"])
        assert private.public_key().public_bytes_raw() == cert.encryption_key_bytes
    ephemeral = x_priv(block["ephemeral_private_key"])
    assert b64u_encode(ephemeral.public_key().public_bytes_raw()) == box.enc
    secret = ephemeral.exchange(private.public_key())
    assert b64u_encode(secret) == block["shared_secret"]
    header = MessageHeader.of(envelope)
    info = key_box_info(header, account=account, device_id=box.device_id, enc=box.enc, context=CTX)
    assert info.hex() == block["kdf_info_utf8_hex"] == block["aad_utf8_hex"]
    assert (
        b64u_encode(HKDF(hashes.SHA256(), 32, b64u_decode(TL["hkdf_salt"]), info).derive(secret))
        == block["wrapping_key"]
    )
    content_key = b64u_decode(TL["content_key"])
    rebuilt = wrap_content_key(
        content_key,
        header,
        account=account,
        device_id=box.device_id,
        encryption_public_key=private.public_key().public_bytes_raw(),
        context=CTX,
        ephemeral=ephemeral,
        nonce=b64u_decode(block["nonce"]),
    )
    assert rebuilt == box and rebuilt.sealed_key == block["sealed_key"]
    assert (
        unwrap_content_key(box, header, account=account, encryption_key=private, context=CTX)
        == content_key
    )
    plaintext = open_envelope(
        envelope,
        box,
        sender_signing_key=cert.signing_key_bytes,
        box_account=account,
        encryption_key=private,
        context=CTX,
    )
    assert plaintext.hex() == TL["plaintext_utf8_hex"]
    payload = encrypt_payload(
        plaintext, content_key, aad_of(envelope), nonce=b64u_decode(TL["payload_nonce"])
    )
    assert payload == envelope.payload
    # A box opened as if for the other account (recipient vs sender) does not authenticate.
    other = envelope.from_ if account == envelope.to else envelope.to
    with pytest.raises(DecryptionFailed):
        unwrap_content_key(box, header, account=other, encryption_key=private, context=CTX)


def test_timeline_tampered_envelope_rejected() -> None:
    params = request()
    cert = DeviceCertificate.from_wire(TL["request"]["signer_certificate"])
    wire = params.envelope.to_wire()
    wire["created_at"] += 1
    with pytest.raises(InvalidSignature):
        verify_envelope(MessageEnvelope.from_wire(wire), cert.signing_key_bytes, CTX)
