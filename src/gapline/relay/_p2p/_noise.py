"""libp2p Noise (``/noise``): the XX handshake and the transport cipher, sans-I/O.

``Noise_XX_25519_ChaChaPoly_SHA256`` as libp2p runs it: every handshake and transport
message is preceded by a 2-byte big-endian length (the caller frames), messages 2 and 3
carry a protobuf ``NoiseHandshakePayload`` whose ``identity_sig`` signs
``"noise-libp2p-static-key:" || static X25519 key`` with the libp2p identity key. The
primitives are the ``cryptography`` package's; this module holds only the state machine,
so a wrong step shows up against any other libp2p implementation.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "MAX_NOISE_MESSAGE",
    "CipherState",
    "HandshakeState",
    "NoiseError",
    "StaticKey",
]

PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_SHA256"
MAX_NOISE_MESSAGE = 65535  # one handshake or transport message, excluding its 2-byte prefix
_TAG = 16
_DH = 32
_MAX_NONCE = 2**64 - 1


class NoiseError(Exception):
    """A handshake or transport message that fails: the connection must close."""


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class StaticKey:
    """The connection's static X25519 key (the identity key signs its public half)."""

    private: X25519PrivateKey

    @classmethod
    def generate(cls) -> StaticKey:
        return cls(X25519PrivateKey.generate())

    @property
    def public(self) -> bytes:
        return _raw(self.private.public_key())


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as exc:  # an all-zero result (low-order point)
        raise NoiseError("invalid Diffie-Hellman result") from exc
    return shared


def _hkdf2(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    temp = hmac.digest(chaining_key, ikm, "sha256")
    out1 = hmac.digest(temp, b"\x01", "sha256")
    return out1, hmac.digest(temp, out1 + b"\x02", "sha256")


class CipherState:
    """ChaChaPoly with the 64-bit little-endian counter nonce of the Noise spec."""

    __slots__ = ("_aead", "_n")

    def __init__(self, key: bytes | None = None) -> None:
        self._aead = None if key is None else ChaCha20Poly1305(key)
        self._n = 0

    @property
    def has_key(self) -> bool:
        return self._aead is not None

    def _nonce(self) -> bytes:
        if self._n >= _MAX_NONCE:
            raise NoiseError("nonce exhausted")
        nonce = b"\x00\x00\x00\x00" + self._n.to_bytes(8, "little")
        self._n += 1
        return nonce

    def encrypt(self, ad: bytes, plaintext: bytes | memoryview) -> bytes:
        if self._aead is None:
            return bytes(plaintext)
        return self._aead.encrypt(self._nonce(), plaintext, ad)

    def decrypt(self, ad: bytes, ciphertext: bytes) -> bytes:
        if self._aead is None:
            return ciphertext
        try:
            return self._aead.decrypt(self._nonce(), ciphertext, ad)
        except Exception as exc:  # cryptography's InvalidTag
            raise NoiseError("message authentication failed") from exc


class _Symmetric:
    __slots__ = ("cipher", "ck", "h")

    def __init__(self) -> None:
        # The protocol name is exactly HASHLEN bytes, so it is h without hashing.
        self.h = PROTOCOL_NAME
        self.ck = PROTOCOL_NAME
        self.cipher = CipherState()
        self.mix_hash(b"")  # empty prologue

    def mix_hash(self, data: bytes) -> None:
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, key = _hkdf2(self.ck, ikm)
        self.cipher = CipherState(key)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher.encrypt(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher.decrypt(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = _hkdf2(self.ck, b"")
        return CipherState(k1), CipherState(k2)


class HandshakeState:
    """One side of XX: ``-> e``, ``<- e, ee, s, es``, ``-> s, se``.

    Call ``write_message``/``read_message`` alternately (initiator writes first). After
    the third message ``split()`` gives (send, receive) ciphers and ``remote_static`` is
    the peer's authenticated static key.
    """

    def __init__(self, *, initiator: bool, static: StaticKey) -> None:
        self.initiator = initiator
        self._s = static
        self._e: X25519PrivateKey | None = None
        self._re: bytes | None = None
        self.remote_static: bytes | None = None
        self._sym = _Symmetric()
        self._step = 0

    @property
    def complete(self) -> bool:
        return self._step == 3

    def _ephemeral(self) -> bytes:
        self._e = X25519PrivateKey.generate()
        public = _raw(self._e.public_key())
        self._sym.mix_hash(public)
        return public

    def write_message(self, payload: bytes) -> bytes:
        sym, step = self._sym, self._step
        if step == 0 and self.initiator:
            out = self._ephemeral() + sym.encrypt_and_hash(payload)
        elif step == 1 and not self.initiator:
            assert self._re is not None
            e = self._ephemeral()
            assert self._e is not None
            sym.mix_key(_dh(self._e, self._re))
            s = sym.encrypt_and_hash(self._s.public)
            sym.mix_key(_dh(self._s.private, self._re))
            out = e + s + sym.encrypt_and_hash(payload)
        elif step == 2 and self.initiator:
            assert self._re is not None
            s = sym.encrypt_and_hash(self._s.public)
            sym.mix_key(_dh(self._s.private, self._re))
            out = s + sym.encrypt_and_hash(payload)
        else:
            raise NoiseError("not this side's turn to write")
        if len(out) > MAX_NOISE_MESSAGE:
            raise NoiseError("handshake message over 65535 bytes")
        self._step += 1
        return out

    def read_message(self, message: bytes) -> bytes:
        sym, step = self._sym, self._step
        if len(message) > MAX_NOISE_MESSAGE:
            raise NoiseError("handshake message over 65535 bytes")
        if step == 0 and not self.initiator:
            if len(message) < _DH:
                raise NoiseError("short handshake message 1")
            self._re = message[:_DH]
            sym.mix_hash(self._re)
            payload = sym.decrypt_and_hash(message[_DH:])
        elif step == 1 and self.initiator:
            if len(message) < 2 * _DH + 2 * _TAG:
                raise NoiseError("short handshake message 2")
            assert self._e is not None
            self._re = message[:_DH]
            sym.mix_hash(self._re)
            sym.mix_key(_dh(self._e, self._re))
            self.remote_static = sym.decrypt_and_hash(message[_DH : 2 * _DH + _TAG])
            sym.mix_key(_dh(self._e, self.remote_static))
            payload = sym.decrypt_and_hash(message[2 * _DH + _TAG :])
        elif step == 2 and not self.initiator:
            if len(message) < _DH + 2 * _TAG:
                raise NoiseError("short handshake message 3")
            assert self._e is not None
            self.remote_static = sym.decrypt_and_hash(message[: _DH + _TAG])
            sym.mix_key(_dh(self._e, self.remote_static))
            payload = sym.decrypt_and_hash(message[_DH + _TAG :])
        else:
            raise NoiseError("not this side's turn to read")
        self._step += 1
        return payload

    def split(self) -> tuple[CipherState, CipherState]:
        """(send, receive) transport ciphers: the initiator sends with the first."""
        if not self.complete:
            raise NoiseError("handshake not complete")
        first, second = self._sym.split()
        return (first, second) if self.initiator else (second, first)
