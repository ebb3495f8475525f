"""The relay's libp2p identity and the handshake payload that carries its descriptor.

The Peer ID is an Ed25519 libp2p key's identity multihash (``12D3KooW…``). Its seed is
derived from the relay's P-256 key with HKDF, so the Peer ID is stable across restarts
without a second key file, and only the holder of the relay key can present it; the
binding others check is the signed ``RelayDescriptor`` listing ``/p2p/<peer id>``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature as _BadSig
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gapline.meshline import AccountKey, b58encode
from gapline.relay._p2p._protobuf import (
    ProtoError,
    as_bytes,
    as_int,
    bytes_field,
    fields,
    varint_field,
)

__all__ = [
    "HandshakePayload",
    "PeerIdentity",
    "peer_id_of_public_key",
]

_ED25519 = 1  # libp2p KeyType
_STATIC_KEY_PREFIX = b"noise-libp2p-static-key:"
_RELAY_DESCRIPTOR_FIELD = 1025  # NoiseExtensions.relay_descriptor (experimental number)
_SEED_INFO = b"gapline/libp2p-identity/ed25519/v1"


def _public_key_proto(raw: bytes) -> bytes:
    return varint_field(1, _ED25519) + bytes_field(2, raw)


def peer_id_of_public_key(proto: bytes) -> bytes:
    """Peer ID bytes of a protobuf ``PublicKey``: identity multihash when ≤ 42 bytes."""
    if len(proto) <= 42:
        return b"\x00" + bytes([len(proto)]) + proto
    return b"\x12\x20" + hashlib.sha256(proto).digest()


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    private: Ed25519PrivateKey

    @classmethod
    def from_relay_key(cls, key: AccountKey) -> PeerIdentity:
        seed = HKDF(hashes.SHA256(), 32, salt=None, info=_SEED_INFO).derive(key.private_bytes())
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public_proto(self) -> bytes:
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return _public_key_proto(raw)

    @property
    def peer_id(self) -> bytes:
        return peer_id_of_public_key(self.public_proto)

    @property
    def peer_id_text(self) -> str:
        return b58encode(self.peer_id)

    def payload(self, static_public: bytes, descriptor: bytes) -> bytes:
        sig = self.private.sign(_STATIC_KEY_PREFIX + static_public)
        extensions = bytes_field(_RELAY_DESCRIPTOR_FIELD, descriptor)
        return bytes_field(1, self.public_proto) + bytes_field(2, sig) + bytes_field(4, extensions)


@dataclass(frozen=True, slots=True)
class HandshakePayload:
    """A verified ``NoiseHandshakePayload``: whose static key it was, and its descriptor."""

    peer_id: bytes
    descriptor: bytes

    @classmethod
    def verify(cls, data: bytes, static_public: bytes) -> HandshakePayload:
        """Parse, then check ``identity_sig`` over the static key; ``ProtoError`` on any fault."""
        key: bytes | None = None
        sig: bytes | None = None
        extensions = b""
        seen_extensions = False
        for number, _, value in fields(data):
            if number == 1:
                key = as_bytes(value)
            elif number == 2:
                sig = as_bytes(value)
            elif number == 4:
                extensions += as_bytes(value)  # embedded messages merge
                seen_extensions = True
        descriptor: bytes | None = None
        for number, _, value in fields(extensions):
            if number == _RELAY_DESCRIPTOR_FIELD:
                descriptor = as_bytes(value)
        if key is None or sig is None or not seen_extensions or descriptor is None:
            raise ProtoError("handshake payload lacks identity_key, identity_sig or descriptor")
        key_type: int | None = None
        raw: bytes | None = None
        for number, _, value in fields(key):
            if number == 1:
                key_type = as_int(value)
            elif number == 2:
                raw = as_bytes(value)
        # Only Ed25519 identities are accepted: what every relay of this stack presents.
        if key_type != _ED25519 or raw is None or len(raw) != 32:
            raise ProtoError("identity key is not an Ed25519 libp2p key")
        try:
            Ed25519PublicKey.from_public_bytes(raw).verify(sig, _STATIC_KEY_PREFIX + static_public)
        except _BadSig:
            raise ProtoError("identity_sig does not verify") from None
        return cls(peer_id_of_public_key(key), descriptor)
