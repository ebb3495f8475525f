"""The keys the machine derives from the caller's 32-byte store key.

The store key is the caller's (the client engine's passphrase-wrapped key, the
bot's the same). From it, by HKDF-SHA256 with distinct labels:

- the **pickle key** that vodozemac uses to encrypt and authenticate every
  pickled Account, Session, InboundGroupSession and GroupSession;
- a **value cipher** (`gapline.storage.StoreCipher`) for other secret values
  (decrypted to-device payloads waiting for their sender's keys);
- a keyed hash for the event IDs of the Megolm replay index;
- a **key check**: an HMAC of a constant, stored with the account, so a wrong
  store key is told apart from a damaged pickle before any pickle is opened.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gapline.storage import StoreCipher

__all__ = ["CryptoKeys"]


def _derive(store_key: bytes, label: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label).derive(store_key)


class CryptoKeys:
    """Subkeys of one store key. Holds key material: never logged, never repr'd."""

    __slots__ = ("_check", "_digest", "cipher", "pickle_key")

    def __init__(self, store_key: bytes) -> None:
        if len(store_key) != 32:
            raise ValueError("the e2ee store key is 32 bytes")
        self.pickle_key = _derive(store_key, b"gapline/e2ee/vodozemac-pickle/v1")
        self.cipher = StoreCipher(_derive(store_key, b"gapline/e2ee/values/v1"))
        self._check = _derive(store_key, b"gapline/e2ee/key-check/v1")
        self._digest = _derive(store_key, b"gapline/e2ee/event-digest/v1")

    def __repr__(self) -> str:
        return "CryptoKeys(<secret>)"

    @property
    def key_check(self) -> bytes:
        return hmac.new(self._check, b"gapline e2ee store", hashlib.sha256).digest()

    def matches(self, key_check: bytes) -> bool:
        return hmac.compare_digest(self.key_check, key_check)

    def event_digest(self, event_id: str) -> bytes:
        """A keyed 16-byte hash of an event ID: enough to tell two events apart.

        Keyed BLAKE2b: one C call, on the decryption path of every event."""
        return hashlib.blake2b(event_id.encode(), key=self._digest, digest_size=16).digest()
