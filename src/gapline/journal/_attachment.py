"""Matrix encrypted attachments (the client-server spec's ``EncryptedFile``), for the
sidecars of encrypted rooms.

Media uploads are not end-to-end encrypted by the homeserver, so in an encrypted room an
attachment is encrypted first: AES-256-CTR under a fresh key, the IV's high 8 bytes
random and its counter half zero, and the SHA-256 of the ciphertext; the key travels as
a JWK inside the event (Megolm-encrypted with it), so only the room's members can read
it. Any Matrix client decrypts it the same way (matrix-nio's ``decrypt_attachment``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["AttachmentInvalid", "EncryptedFile", "decrypt_attachment", "encrypt_attachment"]


class AttachmentInvalid(ValueError):
    """The ``file`` object is malformed, or the ciphertext does not match its hash."""


def _b64(data: bytes, *, urlsafe: bool = False) -> str:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return encode(data).decode("ascii").rstrip("=")


def _unb64(text: object, length: int | None = None) -> bytes:
    if not isinstance(text, str):
        raise AttachmentInvalid("a base64 field is not a string")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except ValueError as exc:
        raise AttachmentInvalid(f"bad base64: {exc}") from None
    if length is not None and len(raw) != length:
        raise AttachmentInvalid(f"expected {length} bytes, got {len(raw)}")
    return raw


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    transform = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return transform.update(data) + transform.finalize()


@dataclass(frozen=True, slots=True)
class EncryptedFile:
    """What decrypts one attachment: its URL, the AES-CTR key and IV, and the SHA-256 of
    the ciphertext."""

    url: str
    key: bytes
    iv: bytes
    sha256: bytes

    def as_content(self) -> dict[str, Any]:
        """The spec's ``file`` object (JWK key, unpadded base64, ``v2``)."""
        return {
            "url": self.url,
            "key": {
                "kty": "oct",
                "key_ops": ["encrypt", "decrypt"],
                "alg": "A256CTR",
                "k": _b64(self.key, urlsafe=True),
                "ext": True,
            },
            "iv": _b64(self.iv),
            "hashes": {"sha256": _b64(self.sha256)},
            "v": "v2",
        }

    @classmethod
    def from_content(cls, raw: object) -> EncryptedFile:
        """Parse a ``file`` object; `AttachmentInvalid` when it is not one we can read."""
        if not isinstance(raw, Mapping):
            raise AttachmentInvalid("file is not an object")
        url, key, hashes = raw.get("url"), raw.get("key"), raw.get("hashes")
        if not (isinstance(url, str) and url.startswith("mxc://")):
            raise AttachmentInvalid("file.url is not an mxc URI")
        if raw.get("v") != "v2":
            raise AttachmentInvalid(f"unsupported file version {raw.get('v')!r}")
        if not isinstance(key, Mapping) or key.get("alg") != "A256CTR" or key.get("kty") != "oct":
            raise AttachmentInvalid("file.key is not an A256CTR JWK")
        if not isinstance(hashes, Mapping):
            raise AttachmentInvalid("file.hashes is missing")
        return cls(
            url=url,
            key=_unb64(key.get("k"), 32),
            iv=_unb64(raw.get("iv"), 16),
            sha256=_unb64(hashes.get("sha256"), 32),
        )


def encrypt_attachment(plaintext: bytes, url_for: str = "") -> tuple[bytes, EncryptedFile]:
    """The ciphertext to upload and its `EncryptedFile` (``url`` filled in by the caller
    once the upload named it)."""
    key = os.urandom(32)
    iv = os.urandom(8) + bytes(8)  # the counter half starts at zero (the spec's rule)
    ciphertext = _ctr(key, iv, plaintext)
    return ciphertext, EncryptedFile(url_for, key, iv, hashlib.sha256(ciphertext).digest())


def decrypt_attachment(ciphertext: bytes, file: EncryptedFile) -> bytes:
    """The plaintext, after the ciphertext's hash is checked (`AttachmentInvalid` if not)."""
    if not hmac.compare_digest(hashlib.sha256(ciphertext).digest(), file.sha256):
        raise AttachmentInvalid("the attachment does not match its sha256")
    return _ctr(file.key, file.iv, ciphertext)
