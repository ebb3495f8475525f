"""Structural rules beyond the vectors: size limits before crypto, strict JSON, box sets."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest

from gapline.meshline import (
    ENVELOPE_MAX_BYTES,
    BadRequest,
    DeviceCertificate,
    EncryptedPayload,
    MessageEnvelope,
    RequestTooLarge,
    SendParams,
    b64u_encode,
    canonical_json,
    check_account_id,
    derive_device_id,
    parse_json,
    sign_envelope,
    verify_certificate,
    verify_envelope,
)
from gapline.meshline.testing import TEST_CONTEXT, make_account, make_send_params

ALICE = make_account(1)
BOB = make_account(1)


def test_oversize_envelope_refused_before_any_crypto() -> None:
    params = make_send_params(BOB, ALICE)
    big = EncryptedPayload(
        nonce=params.envelope.payload.nonce, ciphertext=b64u_encode(bytes(ENVELOPE_MAX_BYTES))
    )
    envelope = dataclasses.replace(params.envelope, payload=big)
    with mock.patch("gapline.meshline._envelope.device_verify") as verify:
        with pytest.raises(RequestTooLarge):
            verify_envelope(envelope, BOB.device(0).keys.signing_public_key, TEST_CONTEXT)
        verify.assert_not_called()
    with pytest.raises(RequestTooLarge):
        MessageEnvelope.from_json(envelope.to_json())
    with pytest.raises(RequestTooLarge):
        sign_envelope(envelope.to_wire(), BOB.device(0).keys, TEST_CONTEXT)


def test_envelope_just_under_the_limit_is_accepted() -> None:
    params = make_send_params(BOB, ALICE)
    size = len(params.envelope.to_json())
    ct_len = len(params.envelope.payload.ciphertext)
    room = ENVELOPE_MAX_BYTES - size + ct_len  # base64 chars available for the ciphertext
    raw_len = room * 3 // 4
    wire = params.envelope.to_wire()
    wire["payload"]["ciphertext"] = b64u_encode(bytes(raw_len))
    envelope = sign_envelope(wire, BOB.device(0).keys, TEST_CONTEXT)
    assert len(envelope.to_json()) <= ENVELOPE_MAX_BYTES
    verify_envelope(envelope, BOB.device(0).keys.signing_public_key, TEST_CONTEXT)


def test_oversize_certificate_refused() -> None:
    cert = dataclasses.replace(ALICE.device(0).certificate, extensions={"x_pad": "p" * 4096})
    with pytest.raises(RequestTooLarge):
        verify_certificate(cert, TEST_CONTEXT)


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":1} x',  # trailing data
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b"\xff\xfe",  # invalid UTF-8
        b"[" * 18 + b"]" * 18,  # innermost array at depth 17 (root = 0)
        b'{"a":1e3}',
        b'{"a":01}',
    ],
)
def test_strict_json_refusals(text: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_json(text)


def test_depth_sixteen_is_allowed() -> None:
    assert parse_json(b"[" * 17 + b"]" * 17) is not None  # innermost at depth 16


def test_account_and_device_ids() -> None:
    check_account_id(ALICE.account, TEST_CONTEXT)
    with pytest.raises(BadRequest):
        check_account_id(ALICE.account.replace("neo:860833102:", "neo:1:"), TEST_CONTEXT)
    cert = ALICE.device(0).certificate
    assert (
        derive_device_id(
            cert.account, cert.signing_public_key, cert.encryption_public_key, TEST_CONTEXT
        )
        == ALICE.device(0).device_id
    )
    with pytest.raises(BadRequest):  # a certificate whose account does not match the network
        DeviceCertificate.from_wire({**cert.to_wire(), "$context": str(TEST_CONTEXT)})


def test_send_params_box_rules() -> None:
    params = make_send_params(BOB, ALICE)
    wire = params.to_wire()
    with pytest.raises(BadRequest):  # duplicate device ids
        SendParams.from_wire({**wire, "recipient_boxes": wire["recipient_boxes"] * 2})
    with pytest.raises(BadRequest):  # empty set
        SendParams.from_wire({**wire, "recipient_boxes": []})
    own = make_send_params(ALICE, ALICE)
    with pytest.raises(BadRequest):  # sender boxes on self-delivery
        SendParams.from_wire({**own.to_wire(), "sender_boxes": own.to_wire()["recipient_boxes"]})
    assert SendParams.from_json(canonical_json(wire)) == params


@pytest.mark.parametrize(
    ("message", "digest"),
    [
        (b"", "9c1185a5c5e9fc54612808977ee8f548b2258d31"),
        (b"abc", "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc"),
        (b"a" * 1000, "aa69deee9a8922e92f8105e007f76110f381e9cf"),
    ],
)
def test_ripemd160_fallback(message: bytes, digest: str) -> None:
    """The pure implementation used when OpenSSL lacks RIPEMD-160 (ISO/IEC 10118-3 vectors)."""
    from gapline.meshline._ripemd160 import _pure, ripemd160

    assert _pure(message).hex() == digest
    assert ripemd160(message).hex() == digest
