"""``m.megolm_backup.v1.curve25519-aes-sha2``: one backed-up session, sealed to the backup key.

Each session is encrypted to the backup's Curve25519 public key with
vodozemac's `PkEncryption` (an ephemeral key, ECDH, HKDF-SHA-256 to an AES-256-CBC
key, a MAC key and an IV) into ``{ephemeral, ciphertext, mac}``; `PkDecryption`
with the private key (the secret ``m.megolm_backup.v1``) opens it, refusing a
failing MAC. The MAC is the one every deployed client computes (the first 8
bytes of HMAC-SHA-256 under the MAC key of an empty input, the libolm
behaviour the spec documents), which `tests/e2ee/test_backup.py` checks
against an implementation of the construction on ``cryptography``.
"""

from __future__ import annotations

import json
from typing import Any

import vodozemac

from ._canonical import b64decode, b64encode

__all__ = ["BACKUP_ALGORITHM", "BackupEntryInvalid", "BackupKey", "seal_session"]

BACKUP_ALGORITHM = "m.megolm_backup.v1.curve25519-aes-sha2"


class BackupEntryInvalid(ValueError):
    """A backed-up session that does not open (MAC, encoding or shape)."""


def seal_session(public_key: vodozemac.PkEncryption, session: dict[str, Any]) -> dict[str, str]:
    """``session_data`` for one session (its JSON encrypted to the backup key)."""
    message = public_key.encrypt(json.dumps(session, separators=(",", ":")).encode())
    return {
        "ephemeral": b64encode(message.ephemeral_key),
        "ciphertext": b64encode(message.ciphertext),
        "mac": b64encode(message.mac),
    }


class BackupKey:
    """The backup's private key (secret: never logged) and what it opens."""

    __slots__ = ("_decryption", "public_key", "secret")

    def __init__(self, secret: str) -> None:
        """``secret``: the unpadded base64 of the 32-byte Curve25519 private key."""
        try:
            raw = b64decode(secret)
            key = vodozemac.Curve25519SecretKey.from_bytes(raw)
        except (ValueError, vodozemac.KeyException) as exc:
            raise ValueError(f"not a backup key: {exc}") from None
        self.secret = b64encode(raw)
        self._decryption = vodozemac.PkDecryption.from_key(key)
        self.public_key = self._decryption.public_key.to_base64()

    @classmethod
    def generate(cls) -> BackupKey:
        return cls(b64encode(vodozemac.Curve25519SecretKey().to_bytes()))

    def __repr__(self) -> str:
        return f"BackupKey(public_key={self.public_key!r})"

    def encryption(self) -> vodozemac.PkEncryption:
        return vodozemac.PkEncryption.from_key(self._decryption.public_key)

    @staticmethod
    def encryption_for(public_key: str) -> vodozemac.PkEncryption:
        """Encryption to a backup's public key (no private key needed to upload)."""
        return vodozemac.PkEncryption.from_key(
            vodozemac.Curve25519PublicKey.from_base64(public_key)
        )

    def open(self, session_data: Any) -> dict[str, Any]:
        """The session JSON inside ``session_data``; raises `BackupEntryInvalid`."""
        if not isinstance(session_data, dict):
            raise BackupEntryInvalid("session_data is not an object")
        parts = [session_data.get(k) for k in ("ciphertext", "mac", "ephemeral")]
        if not all(isinstance(p, str) for p in parts):
            raise BackupEntryInvalid("session_data lacks ciphertext, mac or ephemeral")
        try:
            message = vodozemac.Message.from_base64(*parts)
            plaintext = self._decryption.decrypt(message)
        except (ValueError, vodozemac.PkDecodeException) as exc:
            raise BackupEntryInvalid(f"does not open: {exc}") from None
        try:
            session = json.loads(plaintext)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BackupEntryInvalid(f"not JSON inside: {exc}") from None
        if not isinstance(session, dict):
            raise BackupEntryInvalid("not an object inside")
        return session
