"""Account and device keys, account signatures, session-authentication inputs.

Account signatures are Neo N3's: ECDSA over secp256r1 with SHA-256 of the raw
network-bound bytes, encoded as 64-byte r||s, keys in 33-byte compressed form.
Signing uses RFC 6979 deterministic nonces (``cryptography``'s
``deterministic_signing=True``), so the published vectors reproduce byte for
byte. Device keys are Ed25519 (signing) and X25519 (encryption).

Ed25519 signing runs on libsodium (PyNaCl; 1.6x faster than ``cryptography`` per
``bench/crypto_primitives.py``) and gives the same bytes: RFC 8032 signatures are
deterministic. Ed25519 verification stays on ``cryptography`` even though libsodium
is faster: libsodium refuses some signatures OpenSSL accepts (small-order keys and
``R``, non-canonical point encodings), the spec does not pick a rule, and changing
what verifies is a protocol decision, not a speed one (docs/meshline.md).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import idna
from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)
from nacl import bindings as _sodium
from nacl.exceptions import BadSignatureError as _SodiumBadSignature

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import NetworkContext, network_bound_bytes
from gapline.meshline._errors import BadRequest, InvalidSignature
from gapline.meshline._ids import neo_account_id, relay_id_from_public_key

__all__ = [
    "AccountKey",
    "DeviceKeys",
    "account_auth_input",
    "account_verify",
    "device_auth_input",
    "device_verify",
    "relay_origin",
    "verify_account_auth",
    "verify_device_auth",
]

_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
_RAW_PRIV = serialization.PrivateFormat.Raw
_NOENC = serialization.NoEncryption()
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


@dataclass(frozen=True, slots=True)
class AccountKey:
    """A Neo N3 account key pair (P-256)."""

    private_key: ec.EllipticCurvePrivateKey = field(repr=False)

    @classmethod
    def generate(cls) -> AccountKey:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def from_private_bytes(cls, secret: bytes) -> AccountKey:
        if len(secret) != 32:
            raise BadRequest("account private key must be 32 bytes")
        return cls(ec.derive_private_key(int.from_bytes(secret, "big"), ec.SECP256R1()))

    def private_bytes(self) -> bytes:
        return self.private_key.private_numbers().private_value.to_bytes(32, "big")

    @property
    def public_key(self) -> bytes:
        """33-byte compressed SEC1 point."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
        )

    @property
    def public_key_b64(self) -> str:
        return b64u_encode(self.public_key)

    def account_id(self, context: NetworkContext) -> str:
        return neo_account_id(self.public_key, context)

    def relay_id(self) -> str:
        return relay_id_from_public_key(self.public_key)

    def sign(self, data: bytes) -> bytes:
        """64-byte r||s, RFC 6979 deterministic nonce."""
        der = self.private_key.sign(data, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
        r, s = decode_dss_signature(der)
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    def sign_object(
        self, obj: Mapping[str, Any], context: NetworkContext, *, exclude: tuple[str, ...]
    ) -> str:
        return b64u_encode(self.sign(network_bound_bytes(obj, context, exclude=exclude)))


def account_verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """Neo N3 account signature check; any malformed input is simply invalid."""
    if len(signature) != 64:
        return False
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:], "big")
    if not (0 < r < _P256_ORDER and 0 < s < _P256_ORDER):
        return False
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), public_key)
        key.verify(encode_dss_signature(r, s), data, ec.ECDSA(hashes.SHA256()))
    except (ValueError, _CryptoInvalidSignature):
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _ed25519_key(public_key: bytes) -> ed25519.Ed25519PublicKey:
    """Parsed keys are reused: a timeline page repeats few senders."""
    return ed25519.Ed25519PublicKey.from_public_bytes(public_key)


def device_verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """Ed25519 check; any malformed input is simply invalid.

    The verdict is OpenSSL's (``cryptography``). libsodium is asked first because it is
    twice as fast (bench/crypto_primitives.py), and whatever it accepts OpenSSL accepts
    too: both check the same cofactorless equation ``[S]B = R + [H(R||A||M)]A`` on the
    same bytes and compare the encoding of R; libsodium only refuses more (small-order
    or non-canonical A and R). So an honest signature is settled by libsodium, and only
    one libsodium refuses is decided by OpenSSL. Which signatures verify is therefore
    exactly what it was with ``cryptography`` alone (tests/meshline/test_backends.py).
    """
    if len(public_key) != 32 or len(signature) != 64:
        return False
    key = bytes(public_key)
    try:
        _sodium.crypto_sign_open(bytes(signature) + bytes(data), key)
    except _SodiumBadSignature:
        pass
    else:
        return True
    try:
        _ed25519_key(key).verify(signature, data)
    except (ValueError, _CryptoInvalidSignature):
        return False
    return True


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    """A device's Ed25519 signing key and X25519 encryption key."""

    signing_key: ed25519.Ed25519PrivateKey = field(repr=False)
    encryption_key: x25519.X25519PrivateKey = field(repr=False)
    # libsodium's 64-byte form of ``signing_key`` (seed || public key), derived once.
    _sodium_signing_key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _, secret = _sodium.crypto_sign_seed_keypair(self.signing_key.private_bytes_raw())
        object.__setattr__(self, "_sodium_signing_key", secret)

    @classmethod
    def generate(cls) -> DeviceKeys:
        return cls(ed25519.Ed25519PrivateKey.generate(), x25519.X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, signing: bytes, encryption: bytes) -> DeviceKeys:
        return cls(
            ed25519.Ed25519PrivateKey.from_private_bytes(signing),
            x25519.X25519PrivateKey.from_private_bytes(encryption),
        )

    def private_bytes(self) -> tuple[bytes, bytes]:
        return (
            self.signing_key.private_bytes(_RAW, _RAW_PRIV, _NOENC),
            self.encryption_key.private_bytes(_RAW, _RAW_PRIV, _NOENC),
        )

    @property
    def signing_public_key(self) -> bytes:
        return self.signing_key.public_key().public_bytes(_RAW, _RAW_PUB)

    @property
    def encryption_public_key(self) -> bytes:
        return self.encryption_key.public_key().public_bytes(_RAW, _RAW_PUB)

    def sign(self, data: bytes | bytearray | memoryview) -> bytes:
        """Ed25519 by libsodium: byte-identical to ``self.signing_key.sign(data)``."""
        # Combined mode (signature || message); PyNaCl has no detached binding.
        return _sodium.crypto_sign(bytes(data), self._sodium_signing_key)[:64]

    def sign_object(
        self, obj: Mapping[str, Any], context: NetworkContext, *, exclude: tuple[str, ...]
    ) -> str:
        return b64u_encode(self.sign(network_bound_bytes(obj, context, exclude=exclude)))


# --- relay origin (authentication-and-sessions.md "origin") -------------------------------


def relay_origin(endpoint: str) -> str:
    """The HTTPS origin a session token and auth signature are bound to.

    ``wss`` maps to ``https``; host lower-cased and IDNA2008 A-labels (the
    ``idna`` package, not Python's IDNA2003 codec); IPv6 in RFC 5952 form; a
    trailing dot is kept; port 443 (however spelled) dropped; no path.
    """
    parts = urlsplit(endpoint)
    scheme = parts.scheme.lower()
    if scheme not in ("https", "wss", "http", "ws"):
        raise BadRequest(f"unsupported endpoint scheme: {parts.scheme!r}")
    # Loopback tests run over plain http/ws; they map to their own origin family.
    out_scheme = "https" if scheme in ("https", "wss") else "http"
    default_port = 443 if out_scheme == "https" else 80
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if netloc.startswith("["):
        close = netloc.index("]")
        host_text, rest = netloc[1:close], netloc[close + 1 :]
        host = "[" + ipaddress.IPv6Address(host_text).compressed + "]"
    else:
        host_text, _, port_text = netloc.partition(":")
        rest = ":" + port_text if port_text else ""
        host = _normalise_host(host_text)
    port: int | None = None
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit() or not rest[1:].isascii():
            raise BadRequest(f"invalid port in {endpoint!r}")
        port = int(rest[1:])
        if not 0 < port < 65536:
            raise BadRequest(f"invalid port in {endpoint!r}")
    suffix = "" if port is None or port == default_port else f":{port}"
    return f"{out_scheme}://{host}{suffix}"


def _normalise_host(host: str) -> str:
    if not host:
        raise BadRequest("endpoint has no host")
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    trailing = host.endswith(".")
    labels = host[:-1] if trailing else host
    try:
        encoded = idna.encode(labels.lower(), uts46=False).decode("ascii")
    except idna.IDNAError as exc:
        raise BadRequest(f"invalid host {host!r}: {exc}") from None
    return encoded.lower() + ("." if trailing else "")


# --- session authentication inputs ---------------------------------------------------------


def device_auth_input(
    *, relay_id: str, origin: str, account: str, device_id: str, nonce: str, timestamp: int
) -> dict[str, Any]:
    return {
        "$type": "meshline.relay.auth",
        "relay_id": relay_id,
        "origin": origin,
        "account": account,
        "device_id": device_id,
        "nonce": nonce,
        "timestamp": timestamp,
    }


def account_auth_input(
    *, relay_id: str, origin: str, account: str, account_public_key: str, nonce: str
) -> dict[str, Any]:
    return {
        "$type": "meshline.relay.account_auth",
        "relay_id": relay_id,
        "origin": origin,
        "account": account,
        "account_public_key": account_public_key,
        "nonce": nonce,
    }


def verify_device_auth(
    signature_b64: str,
    *,
    signing_public_key: bytes,
    context: NetworkContext,
    relay_id: str,
    origin: str,
    account: str,
    device_id: str,
    nonce: str,
    timestamp: int,
) -> None:
    """Raise InvalidSignature unless the device signed this relay's auth input.

    ``relay_id`` and ``origin`` are the verifier's own, never the request's.
    """
    data = network_bound_bytes(
        device_auth_input(
            relay_id=relay_id,
            origin=origin,
            account=account,
            device_id=device_id,
            nonce=nonce,
            timestamp=timestamp,
        ),
        context,
    )
    if not device_verify(signing_public_key, data, b64u_decode(signature_b64, length=64)):
        raise InvalidSignature("device authentication signature does not verify")


def verify_account_auth(
    signature_b64: str,
    *,
    account_public_key: str,
    context: NetworkContext,
    relay_id: str,
    origin: str,
    account: str,
    nonce: str,
) -> None:
    """Raise InvalidSignature unless the account key signed this relay's auth input
    and derives ``account``."""
    public_key = b64u_decode(account_public_key, length=33, field="account_public_key")
    if neo_account_id(public_key, context) != account:
        raise InvalidSignature("account public key does not derive the account ID")
    data = network_bound_bytes(
        account_auth_input(
            relay_id=relay_id,
            origin=origin,
            account=account,
            account_public_key=account_public_key,
            nonce=nonce,
        ),
        context,
    )
    if not account_verify(public_key, data, b64u_decode(signature_b64, length=64)):
        raise InvalidSignature("account authentication signature does not verify")
