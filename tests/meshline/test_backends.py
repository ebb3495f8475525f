"""The libsodium (PyNaCl) paths give what the ``cryptography`` ones gave, byte for byte.

Sealing signs and makes its one-time X25519 keys with libsodium; opening stays on
``cryptography``, and so does every verification *verdict* (libsodium is asked first and
only ever accepts what OpenSSL accepts). These properties tie the two together beyond
the published vectors (which pin fixed keys only).
"""

from __future__ import annotations

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl import bindings as sodium

from gapline.meshline import (
    DecryptionFailed,
    DeviceKeys,
    MessageHeader,
    b64u_encode,
    device_verify,
    unwrap_content_key,
    wrap_content_key,
    x25519_shared_secret,
)
from gapline.meshline._keybox import _ephemeral_shared_secret, seal_boxes
from gapline.meshline.testing import make_account

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY = st.binary(min_size=32, max_size=32)

ALICE = make_account(1)
HEADER = MessageHeader("msg_" + "A" * 22, 1_800_000_000, ALICE.account, "dev_" + "B" * 22)

# The two order-8 points of Curve25519 (u-coordinates, little-endian): not in the
# ``common`` x25519 vectors, refused by libsodium up front, all-zero for ``cryptography``.
ORDER_8 = [
    (325606250916557431795983626356110631294008115727848805560023387167927233504).to_bytes(
        32, "little"
    ),
    (39382357235489614581723060781553021112529911719440698176882885853963445705823).to_bytes(
        32, "little"
    ),
]


@SETTINGS
@given(seed=KEY, message=st.binary(max_size=2048))
def test_device_signature_is_byte_identical(seed: bytes, message: bytes) -> None:
    keys = DeviceKeys.from_private_bytes(seed, bytes(32))
    signature = keys.sign(message)
    assert signature == ed25519.Ed25519PrivateKey.from_private_bytes(seed).sign(message)
    assert device_verify(keys.signing_public_key, message, signature)
    # Any bytes-like input, as ``cryptography`` accepted.
    assert keys.sign(bytearray(message)) == keys.sign(memoryview(message)) == signature


@SETTINGS
@given(scalar=KEY, peer_private=KEY)
def test_ephemeral_key_pair_and_exchange_match(scalar: bytes, peer_private: bytes) -> None:
    ours = x25519.X25519PrivateKey.from_private_bytes(scalar)
    peer = x25519.X25519PrivateKey.from_private_bytes(peer_private).public_key()
    assert sodium.crypto_scalarmult_base(scalar) == ours.public_key().public_bytes_raw()
    peer_raw = peer.public_bytes_raw()
    assert _ephemeral_shared_secret(scalar, peer_raw) == x25519_shared_secret(ours, peer_raw)


@pytest.mark.parametrize("point", ORDER_8, ids=["order8_a", "order8_b"])
def test_small_order_peers_refused_by_both(point: bytes) -> None:
    scalar = bytes(range(32))
    with pytest.raises(DecryptionFailed):
        _ephemeral_shared_secret(scalar, point)
    with pytest.raises(DecryptionFailed):
        x25519_shared_secret(x25519.X25519PrivateKey.from_private_bytes(scalar), point)


@pytest.mark.parametrize("peer", [bytes(31), bytes(33), b""], ids=["31", "33", "empty"])
def test_malformed_peer_key_is_refused_before_libsodium(peer: bytes) -> None:
    with pytest.raises(DecryptionFailed):
        seal_boxes(
            bytes(32),
            HEADER,
            [(ALICE.account, "dev_" + "C" * 22, peer, bytes(12))],
            ALICE.context,
        )


def test_zero_peer_key_aborts_sealing() -> None:
    target = (ALICE.account, "dev_" + "C" * 22, bytes(32), bytes(12))
    with pytest.raises(DecryptionFailed):
        seal_boxes(bytes(32), HEADER, [target], ALICE.context)


@SETTINGS
@given(content_key=KEY, ephemeral=KEY, nonce=st.binary(min_size=12, max_size=12))
def test_given_ephemeral_box_opens_with_cryptography(
    content_key: bytes, ephemeral: bytes, nonce: bytes
) -> None:
    device = ALICE.device(0)
    fixed = x25519.X25519PrivateKey.from_private_bytes(ephemeral)
    box = wrap_content_key(
        content_key,
        HEADER,
        account=ALICE.account,
        device_id=device.device_id,
        encryption_public_key=device.keys.encryption_public_key,
        context=ALICE.context,
        ephemeral=fixed,
        nonce=nonce,
    )
    # Same public key as ``cryptography`` derives, so the vectors' boxes re-create.
    assert box.enc == b64u_encode(fixed.public_key().public_bytes_raw())
    opened = unwrap_content_key(
        box,
        HEADER,
        account=ALICE.account,
        encryption_key=device.keys.encryption_key,
        context=ALICE.context,
    )
    assert opened == content_key


def test_fresh_boxes_use_fresh_ephemeral_keys() -> None:
    device = ALICE.device(0)
    target = (ALICE.account, device.device_id, device.keys.encryption_public_key, bytes(12))
    boxes = seal_boxes(bytes(32), HEADER, [target, target], ALICE.context)
    assert boxes[0].enc != boxes[1].enc
    for box in boxes:
        assert unwrap_content_key(
            box,
            HEADER,
            account=ALICE.account,
            encryption_key=device.keys.encryption_key,
            context=ALICE.context,
        ) == bytes(32)


def _openssl_accepts(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _sodium_accepts(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        sodium.crypto_sign_open(signature + message, public_key)
    except Exception:  # noqa: BLE001 - any refusal is a refusal here
        return False
    return True


@SETTINGS
@given(seed=KEY, message=st.binary(max_size=1024), flip=st.integers(0, 64 * 8 - 1))
def test_verification_verdict_is_openssls(seed: bytes, message: bytes, flip: int) -> None:
    keys = DeviceKeys.from_private_bytes(seed, bytes(32))
    public = keys.signing_public_key
    good = keys.sign(message)
    bad = bytearray(good)
    bad[flip // 8] ^= 1 << (flip % 8)
    for signature in (good, bytes(bad)):
        assert device_verify(public, message, signature) is _openssl_accepts(
            public, message, signature
        )
    assert device_verify(public, message, good)
    assert not device_verify(public, message, bytes(bad))


# Small-order Ed25519 points (encodings of y): the identity (y = 1), the order-2 point
# (y = -1), and the identity with the sign bit set (a non-canonical encoding of x = 0).
IDENTITY = bytes([1]) + bytes(31)
ORDER_2 = bytes([0xEC]) + bytes([0xFF]) * 30 + bytes([0x7F])
IDENTITY_SIGNED = bytes([1]) + bytes(30) + bytes([0x80])


@pytest.mark.parametrize("public", [IDENTITY, ORDER_2, IDENTITY_SIGNED], ids=["id", "o2", "id-neg"])
@pytest.mark.parametrize("r", [IDENTITY, ORDER_2], ids=["R=id", "R=o2"])
@pytest.mark.parametrize("message", [b"", b"hello", bytes(range(200))], ids=["0", "5", "200"])
def test_signatures_only_openssl_accepts_still_verify(
    public: bytes, r: bytes, message: bytes
) -> None:
    # S = 0: [0]B = R + [h]A holds exactly when R = -[h]A, which small-order A allows.
    signature = r + bytes(32)
    assert device_verify(public, message, signature) is _openssl_accepts(public, message, signature)
    assert not _sodium_accepts(public, message, signature)  # libsodium refuses them all


def test_the_fallback_is_exercised() -> None:
    # The identity key with R = identity and S = 0 satisfies the equation for any message:
    # OpenSSL accepts it, libsodium refuses it, so the verdict must come from OpenSSL.
    signature = IDENTITY + bytes(32)
    assert _openssl_accepts(IDENTITY, b"any", signature)
    assert not _sodium_accepts(IDENTITY, b"any", signature)
    assert device_verify(IDENTITY, b"any", signature)
