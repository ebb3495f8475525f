"""At-rest cipher for a store: AEAD for values, keyed hashes for looked-up identifiers.

Key hierarchy::

    passphrase --Argon2id(salt, params)--> key-encryption key (KEK)
    KEK --AES-256-GCM--> wraps a random 32-byte store key, kept in the database
    store key --HKDF-SHA256--> value key (AES-256-GCM) and lookup key (HMAC-SHA256)

Changing the passphrase re-wraps the store key only; the data stays as it is.
The KDF name and parameters are stored beside the wrapped key (and bound to it
as associated data), so a store created with one setting still opens after
the default changes. A wrong passphrase fails the wrap's authentication tag:
:class:`WrongPassphrase`, never garbage. Subkeys are derived once at open, so
per-value work is one AES-GCM call plus 12 random bytes.

Sealed value layout: ``0x01 || nonce(12) || ciphertext || tag(16)``. Nonces
are random; with 96-bit nonces one key stays well inside the safety margin
for the 2^32 values a store would need to exceed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from gapline.storage._backend import Backend, Migration
from gapline.storage._errors import CipherError, WrongPassphrase

try:  # cryptography >= 44
    from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
except ImportError:  # pragma: no cover - older cryptography: fall back to scrypt
    Argon2id = None

__all__ = ["CIPHER_MIGRATIONS", "KdfParams", "StoreCipher", "open_cipher"]

_VERSION = 1
_NONCE = 12
_TAG = 16
_WRAP_AAD = b"gapline/store-key/v1"

CIPHER_MIGRATIONS = [
    Migration(
        1,
        "store key wrapped by a passphrase-derived key",
        sqlite="""
        CREATE TABLE gapline_cipher_key (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            kdf TEXT NOT NULL,          -- JSON: the KDF name and its parameters
            salt BLOB NOT NULL,
            wrapped BLOB NOT NULL,      -- nonce || AES-256-GCM(KEK, store key)
            created_at TEXT NOT NULL
        )""",
        postgres="""
        CREATE TABLE gapline_cipher_key (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            kdf TEXT NOT NULL,
            salt BYTEA NOT NULL,
            wrapped BYTEA NOT NULL,
            created_at TEXT NOT NULL
        )""",
    )
]


@dataclass(frozen=True, slots=True)
class KdfParams:
    """Passphrase KDF settings; used only when a store key is first created.

    The default is RFC 9106's second recommended Argon2id option (64 MiB,
    3 passes, 4 lanes: ~0.2 s here). :meth:`cheap` is for tests only.
    """

    name: str = "argon2id"
    memory_kib: int = 65536
    iterations: int = 3
    lanes: int = 4
    # scrypt, used only when Argon2id is unavailable: N = 2**17, r = 8, p = 1 (128 MiB).
    scrypt_log_n: int = 17
    scrypt_r: int = 8
    scrypt_p: int = 1

    @classmethod
    def default(cls) -> KdfParams:
        return cls() if Argon2id is not None else cls(name="scrypt")

    @classmethod
    def cheap(cls) -> KdfParams:
        """Minimal cost, so a test suite can create many stores. Never for real data."""
        if Argon2id is not None:
            return cls(memory_kib=8, iterations=1, lanes=1)
        return cls(name="scrypt", scrypt_log_n=4, scrypt_r=1, scrypt_p=1)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> KdfParams:
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise CipherError(f"the stored key-derivation settings are unreadable: {exc}") from exc

    def derive(self, passphrase: str, salt: bytes) -> bytes:
        secret = passphrase.encode("utf-8")
        if self.name == "argon2id":
            if Argon2id is None:
                raise CipherError("this store uses Argon2id; install cryptography >= 44")
            kdf: Any = Argon2id(
                salt=salt,
                length=32,
                iterations=self.iterations,
                lanes=self.lanes,
                memory_cost=self.memory_kib,
            )
        elif self.name == "scrypt":
            kdf = Scrypt(
                salt=salt, length=32, n=2**self.scrypt_log_n, r=self.scrypt_r, p=self.scrypt_p
            )
        else:
            raise CipherError(f"unknown key-derivation function {self.name!r}")
        return kdf.derive(secret)


def _subkey(store_key: bytes, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(store_key)


class StoreCipher:
    """Seals values and hashes identifiers with one store's key. Thread-safe."""

    __slots__ = ("_aead", "_lookup")

    def __init__(self, store_key: bytes) -> None:
        if len(store_key) != 32:
            raise CipherError("a store key is 32 bytes")
        self._aead = AESGCM(_subkey(store_key, b"gapline/values/aes-256-gcm/v1"))
        self._lookup = hmac.new(
            _subkey(store_key, b"gapline/lookup/hmac-sha256/v1"), digestmod=hashlib.sha256
        )

    def encrypt(self, plaintext: bytes, aad: bytes = b"") -> bytes:
        """Seal ``plaintext``; ``aad`` (e.g. the row's identity) must match at decrypt."""
        nonce = os.urandom(_NONCE)
        return b"\x01" + nonce + self._aead.encrypt(nonce, plaintext, aad or None)

    def encrypt_many(self, items: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
        """Seal each ``(plaintext, aad)`` as :meth:`encrypt` does, in one call: the nonces
        come from one read of the system's random source (a page of fifty rows made
        fifty), and the loop stays in one frame."""
        pairs = list(items)
        drawn = os.urandom(_NONCE * len(pairs))
        nonces = [drawn[i : i + _NONCE] for i in range(0, len(drawn), _NONCE)]
        seal = self._aead.encrypt
        return [
            b"\x01" + nonce + seal(nonce, plaintext, aad or None)
            for nonce, (plaintext, aad) in zip(nonces, pairs, strict=True)
        ]

    def decrypt(self, sealed: bytes, aad: bytes = b"") -> bytes:
        """Open a sealed value; a tampered, truncated or misplaced one is a CipherError."""
        if len(sealed) < 1 + _NONCE + _TAG or sealed[0] != _VERSION:
            raise CipherError("not a sealed value (wrong version byte or truncated)")
        try:
            return self._aead.decrypt(sealed[1 : 1 + _NONCE], sealed[1 + _NONCE :], aad or None)
        except InvalidTag:
            raise CipherError(
                "sealed value failed authentication (tampered, truncated, or wrong associated data)"
            ) from None

    def lookup_key(self, identifier: str) -> bytes:
        """A stable 32-byte keyed hash of ``identifier``, for indexed equality lookups."""
        mac = self._lookup.copy()
        mac.update(identifier.encode("utf-8"))
        return mac.digest()


def _wrap(kek: bytes, store_key: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE)
    return nonce + AESGCM(kek).encrypt(nonce, store_key, aad)


def _unwrap(kek: bytes, wrapped: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(kek).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], aad)
    except InvalidTag:
        raise WrongPassphrase(
            "wrong passphrase: it does not unlock this store's key "
            "(or the stored key record was altered)"
        ) from None


def _wrap_aad(kdf_json: str, salt: bytes) -> bytes:
    return _WRAP_AAD + b"|" + kdf_json.encode() + b"|" + salt


_SELECT = "SELECT kdf, salt, wrapped FROM gapline_cipher_key WHERE id = 1"


async def open_cipher(
    backend: Backend, passphrase: str, *, kdf_cost: KdfParams | None = None
) -> StoreCipher:
    """The store's cipher, creating (and wrapping) its key on first use.

    ``kdf_cost`` chooses the KDF settings for a *new* store key (default:
    :meth:`KdfParams.default`); an existing key keeps the settings stored with it.
    Raises :class:`WrongPassphrase` when ``passphrase`` does not unwrap the key.
    """
    await backend.migrate("cipher", CIPHER_MIGRATIONS)
    row = await backend.read(lambda tx: tx.one(_SELECT))
    if row is None:
        params = kdf_cost or KdfParams.default()
        kdf_json = params.to_json()
        salt = os.urandom(16)
        store_key = os.urandom(32)
        kek = await asyncio.to_thread(params.derive, passphrase, salt)
        wrapped = _wrap(kek, store_key, _wrap_aad(kdf_json, salt))

        def create(tx: Any) -> tuple[Any, ...] | None:
            # Two processes may race to create the key: the first one wins, the
            # other adopts it (and unwraps it below with the same passphrase).
            if tx.one(_SELECT) is None:
                tx.execute(
                    "INSERT INTO gapline_cipher_key (id, kdf, salt, wrapped, created_at)"
                    " VALUES (1, ?, ?, ?, CURRENT_TIMESTAMP)",
                    (kdf_json, salt, wrapped),
                )
            return tx.one(_SELECT)

        row = await backend.write(create)
        assert row is not None
    kdf_json, salt, wrapped = str(row[0]), bytes(row[1]), bytes(row[2])
    params = KdfParams.from_json(kdf_json)
    kek = await asyncio.to_thread(params.derive, passphrase, salt)
    return StoreCipher(_unwrap(kek, wrapped, _wrap_aad(kdf_json, salt)))


async def change_passphrase(
    backend: Backend, old: str, new: str, *, kdf_cost: KdfParams | None = None
) -> None:
    """Re-wrap the store key under ``new`` (and, optionally, new KDF settings)."""
    row = await backend.read(lambda tx: tx.one(_SELECT))
    if row is None:
        raise CipherError("this store has no key yet")
    kdf_json, salt, wrapped = str(row[0]), bytes(row[1]), bytes(row[2])
    old_params = KdfParams.from_json(kdf_json)
    store_key = _unwrap(
        await asyncio.to_thread(old_params.derive, old, salt), wrapped, _wrap_aad(kdf_json, salt)
    )
    params = kdf_cost or old_params
    new_json, new_salt = params.to_json(), os.urandom(16)
    kek = await asyncio.to_thread(params.derive, new, new_salt)
    new_wrapped = _wrap(kek, store_key, _wrap_aad(new_json, new_salt))

    def replace(tx: Any) -> int:
        return tx.execute(
            "UPDATE gapline_cipher_key SET kdf = ?, salt = ?, wrapped = ? WHERE id = 1 AND wrapped = ?",
            (new_json, new_salt, new_wrapped, wrapped),
        )

    if await backend.write(replace) != 1:
        raise CipherError("the store key changed while re-wrapping it; try again")
