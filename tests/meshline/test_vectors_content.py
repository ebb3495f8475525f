"""message-content-v1.json: bodies, attachments (encrypted references), ni: references,
the private message envelope and the group message's signature and payload."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from gapline.meshline import (
    BadRequest,
    DecryptionFailed,
    MessageEnvelope,
    NetworkContext,
    b64u_decode,
    decrypt_payload,
    device_verify,
    encrypt_payload,
    envelope_signing_input,
    message_aad,
    network_bound_bytes,
    parse_json,
    sign_envelope,
)
from gapline.meshline._content import (
    BodyFormat,
    ContentReference,
    DirectMessage,
    MessageBody,
    ReferenceStatus,
    body_references,
    check_hash_text,
    decrypt_attachment,
    encrypt_attachment,
    ni_uri,
    parse_content,
    resolve_reference,
)
from tests.meshline.vectors import load

V = load("message-content-v1.json")
CTX = NetworkContext(V["network_context"])
B = V["body"]
H = V["hash_references"]


def names(cases: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in cases]


@pytest.mark.parametrize("case", B["body_cases"], ids=names(B["body_cases"]))
def test_body_cases(case: dict[str, Any]) -> None:
    body = MessageBody.from_wire(case["body"])
    assert body.to_wire() == case["body"]
    expected = case.get("interpretation", "unknown")  # no interpretation: unknown, shown as text
    assert body.format is BodyFormat(expected)


@pytest.mark.parametrize("case", B["invalid_body_cases"], ids=names(B["invalid_body_cases"]))
def test_invalid_body_cases(case: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        MessageBody.from_wire(case["body"])
    with pytest.raises(BadRequest):
        DirectMessage.from_wire({"$type": "meshline.message.direct", "body": case["body"]})


@pytest.mark.parametrize(
    "case", B["rendering_safety_cases"], ids=names(B["rendering_safety_cases"])
)
def test_rendering_safety_cases(case: dict[str, Any]) -> None:
    """The library never renders; it classifies and yields no active ni: targets."""
    body = MessageBody.from_wire(case["body"])
    assert body.format is BodyFormat.COMMONMARK
    assert body_references(body) == []
    assert case["expected"].startswith("do_not_execute")


def test_media_reference() -> None:
    media = B["media"]
    plaintext = base64.b64decode(media["plaintext_base64"])
    ref = ContentReference.from_wire(media["reference"])
    assert decrypt_attachment(ref, plaintext) == plaintext  # unencrypted: size + hash checks
    with pytest.raises(DecryptionFailed):
        decrypt_attachment(ref, plaintext + b"x")


def test_attachment_encryption_recreated() -> None:
    ae = V["attachment_encryption"]
    ref = ContentReference.from_wire(ae["reference"])
    assert ref.to_wire() == ae["reference"]
    assert ref.aad().hex() == ae["aad_utf8_hex"]
    plaintext = bytes.fromhex(ae["plaintext_utf8_hex"])
    assert ref.encryption is not None
    rebuilt, ciphertext = encrypt_attachment(
        plaintext,
        uri=ref.uri,
        content_type=ref.content_type,
        key=b64u_decode(ref.encryption.key),
        nonce=b64u_decode(ref.encryption.nonce),
    )
    assert rebuilt == ref
    assert ciphertext == b64u_decode(ae["ciphertext_and_tag"])
    assert decrypt_attachment(ref, ciphertext) == plaintext
    tampered = bytearray(ciphertext)
    tampered[0] ^= 1
    with pytest.raises(DecryptionFailed):
        decrypt_attachment(ref, bytes(tampered))


@pytest.mark.parametrize("case", H["uri_generation"], ids=["png", "empty"])
def test_uri_generation(case: dict[str, Any]) -> None:
    import hashlib

    from gapline.meshline import sha256_text

    plaintext = base64.b64decode(case["plaintext_base64"])
    assert sha256_text(plaintext) == case["hash"]
    assert check_hash_text(case["hash"]) == hashlib.sha256(plaintext).digest()
    assert ni_uri(case["hash"]) == case["uri"]


@pytest.mark.parametrize("which", ["encrypted_attachment", "re_encrypted_attachment"])
def test_hash_reference_attachments(which: str) -> None:
    case = H[which]
    plaintext = base64.b64decode(case["plaintext_base64"])
    ref = ContentReference.from_wire(case["reference"])
    assert ref.aad().hex() == case["aad_utf8_hex"]
    data = b64u_decode(case["ciphertext_and_tag"])
    assert decrypt_attachment(ref, data) == plaintext
    assert ref.encryption is not None
    _, again = encrypt_attachment(
        plaintext,
        uri=ref.uri,
        content_type=ref.content_type,
        key=b64u_decode(ref.encryption.key),
        nonce=b64u_decode(ref.encryption.nonce),
    )
    assert again == data


@pytest.mark.parametrize("case", H["hash_cases"], ids=names(H["hash_cases"]))
def test_hash_cases(case: dict[str, Any]) -> None:
    if case["valid"]:
        assert len(check_hash_text(case["value"])) == 32
    else:
        with pytest.raises(BadRequest):
            check_hash_text(case["value"])


@pytest.mark.parametrize("case", H["resolution_cases"], ids=names(H["resolution_cases"]))
def test_resolution_cases(case: dict[str, Any]) -> None:
    status, index = resolve_reference(case["uri"], case["attachments"])
    assert status is ReferenceStatus(case["expected"]["status"])
    assert index == case["expected"].get("index")


@pytest.mark.parametrize("case", H["markdown_cases"], ids=names(H["markdown_cases"]))
def test_markdown_cases(case: dict[str, Any]) -> None:
    body = MessageBody.from_wire(case["body"])
    expected = [(t["kind"], t["uri"]) for t in case["expected_targets"]]
    assert body_references(body) == expected


def test_private_message_recreated() -> None:
    pm = H["private_message"]
    plaintext = bytes.fromhex(pm["plaintext_utf8_hex"])
    assert parse_json(plaintext) == pm["content"]  # sender's JSON, not necessarily canonical
    content = parse_content(plaintext)
    assert isinstance(content, DirectMessage)
    assert content.body is not None and body_references(content.body) == [
        ("image", ni_uri(content.attachments[0].hash))
    ]
    envelope = MessageEnvelope.from_wire(pm["envelope"])
    aad = message_aad(
        message_id=envelope.message_id,
        created_at=envelope.created_at,
        from_=envelope.from_,
        from_device_id=envelope.from_device_id,
        to=envelope.to,
        context=CTX,
    )
    assert aad.hex() == pm["aad_utf8_hex"]
    key = b64u_decode(pm["content_key"])
    payload = encrypt_payload(plaintext, key, aad, nonce=b64u_decode(envelope.payload.nonce))
    assert payload == envelope.payload
    assert decrypt_payload(envelope.payload, key, aad) == plaintext
    assert envelope_signing_input(envelope, CTX).hex() == pm["signing_input_utf8_hex"]
    signing = ed25519.Ed25519PrivateKey.from_private_bytes(b64u_decode(pm["signing_private_key"]))
    assert b64u_decode(pm["signing_public_key"]) == signing.public_key().public_bytes_raw()
    assert sign_envelope(pm["envelope"], signing, CTX).device_signature == envelope.device_signature


def test_group_message_signature_and_payload() -> None:
    """Group crypto (epoch key schedule) is outside the account timeline; the vector's
    message key is given, so the envelope signature, AAD and payload are still checked."""
    gm = H["group_message"]
    wire = gm["envelope"]
    data = network_bound_bytes(wire, CTX, exclude=("device_signature",))
    assert data.hex() == gm["signing_input_utf8_hex"]
    signing = ed25519.Ed25519PrivateKey.from_private_bytes(b64u_decode(gm["signing_private_key"]))
    assert signing.public_key().public_bytes_raw() == b64u_decode(gm["signing_public_key"])
    assert device_verify(
        b64u_decode(gm["signing_public_key"]), data, b64u_decode(wire["device_signature"])
    )
    aad = network_bound_bytes(
        {
            "$type": "meshline.group.message.aad",
            "message_id": wire["message_id"],
            "group_id": wire["group_id"],
            "epoch": wire["epoch"],
            "created_at": wire["created_at"],
            "from": gm["sender_account"],
            "from_device_id": gm["sender_device_id"],
        },
        CTX,
    )
    assert aad.hex() == gm["aad_utf8_hex"]
    from gapline.meshline import EncryptedPayload

    payload = EncryptedPayload.from_wire(wire["payload"])
    assert payload.nonce == gm["message_nonce"]
    plaintext = decrypt_payload(payload, b64u_decode(gm["message_key"]), aad)
    assert plaintext.hex() == gm["plaintext_utf8_hex"]
    assert parse_json(plaintext) == gm["content"]
