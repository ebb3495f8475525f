"""Secret storage (``m.secret_storage.v1.aes-hmac-sha2``): secrets as encrypted account data.

A secret-storage key is 32 random bytes (shown to the user as the recovery
key) or derived from a passphrase (PBKDF2-HMAC-SHA-512, ``m.pbkdf2``). Its
description, account data ``m.secret_storage.key.<id>``, carries a check: the
encryption of 32 zero bytes under the name ``""``; a key that does not
reproduce its MAC is the wrong key (`WrongRecoveryKey`), found before any
secret is touched. ``m.secret_storage.default_key`` names the default key.

Each secret (account data of the secret's own name, e.g. ``m.megolm_backup.v1``)
is ``{"encrypted": {key_id: {iv, ciphertext, mac}}}``: HKDF-SHA-256 (32 zero
bytes of salt, the secret's name as info) gives an AES-256-CTR key and an
HMAC-SHA-256 key; the MAC covers the ciphertext. Nothing here does I/O: the
caller reads and writes the account data (`gapline.matrix` requests are built
by `setup_requests`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gapline.matrix import Request, api

from ._errors import E2eeError

__all__ = [
    "AES_HMAC_SHA2",
    "DEFAULT_KEY",
    "KEY_PREFIX",
    "SecretStorageError",
    "SecretStorageKey",
    "WrongRecoveryKey",
    "check_key",
    "decrypt_secret",
    "encrypt_secret",
    "key_from_passphrase",
    "new_key",
    "setup_requests",
]

AES_HMAC_SHA2 = "m.secret_storage.v1.aes-hmac-sha2"
DEFAULT_KEY = "m.secret_storage.default_key"
KEY_PREFIX = "m.secret_storage.key."
_ZERO_SALT = bytes(32)


class SecretStorageError(E2eeError):
    """A secret or key description that cannot be used (missing, malformed, bad MAC)."""


class WrongRecoveryKey(SecretStorageError):
    """The recovery key (or passphrase) does not match the key description's MAC."""


@dataclass(frozen=True, slots=True)
class SecretStorageKey:
    """A secret-storage key: its ID, its 32 bytes (secret) and its description."""

    key_id: str
    key: bytes = field(repr=False)
    description: dict[str, Any]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise SecretStorageError(f"{what} is missing")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SecretStorageError(f"{what} is not base64") from None


def _subkeys(key: bytes, name: str) -> tuple[bytes, bytes]:
    derived = HKDF(algorithm=hashes.SHA256(), length=64, salt=_ZERO_SALT, info=name.encode())
    out = derived.derive(key)
    return out[:32], out[32:]


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    cryptor = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return cryptor.update(data) + cryptor.finalize()


def _encrypt(key: bytes, name: str, plaintext: bytes, iv: bytes | None = None) -> dict[str, str]:
    aes_key, mac_key = _subkeys(key, name)
    if iv is None:
        raw = bytearray(os.urandom(16))
        raw[8] &= 0x7F  # bit 63 clear, as the spec asks
        iv = bytes(raw)
    ciphertext = _ctr(aes_key, iv, plaintext)
    mac = hmac.new(mac_key, ciphertext, hashlib.sha256).digest()
    return {"iv": _b64(iv), "ciphertext": _b64(ciphertext), "mac": _b64(mac)}


def encrypt_secret(key: bytes, name: str, secret: str) -> dict[str, str]:
    """``{iv, ciphertext, mac}`` of ``secret`` (a base64 private key, usually) under ``name``."""
    return _encrypt(key, name, secret.encode("utf-8"))


def decrypt_secret(key: bytes, name: str, encrypted: Mapping[str, Any]) -> str:
    """The secret; raises `SecretStorageError` when the MAC fails or a field is bad."""
    iv = _unb64(encrypted.get("iv"), "iv")
    ciphertext = _unb64(encrypted.get("ciphertext"), "ciphertext")
    mac = _unb64(encrypted.get("mac"), "mac")
    aes_key, mac_key = _subkeys(key, name)
    if not hmac.compare_digest(hmac.new(mac_key, ciphertext, hashlib.sha256).digest(), mac):
        raise SecretStorageError(f"the MAC of secret {name} does not match")
    try:
        return _ctr(aes_key, iv, ciphertext).decode("utf-8")
    except UnicodeDecodeError:
        raise SecretStorageError(f"secret {name} is not text") from None


def _description(key: bytes, name: str | None, passphrase: dict[str, Any] | None) -> dict[str, Any]:
    check = _encrypt(key, "", bytes(32))
    out: dict[str, Any] = {"algorithm": AES_HMAC_SHA2, "iv": check["iv"], "mac": check["mac"]}
    if name is not None:
        out["name"] = name
    if passphrase is not None:
        out["passphrase"] = passphrase
    return out


def new_key(*, name: str | None = None, passphrase: str | None = None) -> SecretStorageKey:
    """A new key with a fresh ID: random, or derived from ``passphrase`` (500,000 rounds)."""
    key_id = _b64(os.urandom(24)).replace("/", "_").replace("+", "-")
    if passphrase is None:
        key = os.urandom(32)
        return SecretStorageKey(key_id, key, _description(key, name, None))
    info = {"algorithm": "m.pbkdf2", "salt": _b64(os.urandom(24)), "iterations": 500_000}
    key = key_from_passphrase(passphrase, info)
    return SecretStorageKey(key_id, key, _description(key, name, info))


def key_from_passphrase(passphrase: str, info: Mapping[str, Any]) -> bytes:
    """The key a passphrase gives under a description's ``passphrase`` parameters."""
    if info.get("algorithm") != "m.pbkdf2":
        raise SecretStorageError(f"unknown passphrase algorithm {info.get('algorithm')!r}")
    salt, rounds, bits = info.get("salt"), info.get("iterations"), info.get("bits", 256)
    if not isinstance(salt, str) or not isinstance(rounds, int) or bits != 256 or rounds < 1:
        raise SecretStorageError("the passphrase parameters are malformed")
    return hashlib.pbkdf2_hmac("sha512", passphrase.encode("utf-8"), salt.encode(), rounds, 32)


def check_key(description: Mapping[str, Any], key: bytes) -> None:
    """Raise `WrongRecoveryKey` unless ``key`` reproduces the description's MAC."""
    if description.get("algorithm") != AES_HMAC_SHA2:
        raise SecretStorageError(f"unsupported key algorithm {description.get('algorithm')!r}")
    iv = _unb64(description.get("iv"), "the key description's iv")
    mac = _unb64(description.get("mac"), "the key description's mac")
    if not hmac.compare_digest(_unb64(_encrypt(key, "", bytes(32), iv)["mac"], "mac"), mac):
        raise WrongRecoveryKey("wrong recovery key: it does not match the secret storage key")


def setup_requests(
    user_id: str, key: SecretStorageKey, secrets: Mapping[str, str], *, make_default: bool = True
) -> list[Request]:
    """The account-data writes that store ``secrets`` under ``key`` (and make it default).

    The key description and the secrets come first, the default-key pointer last, so a
    crash in between leaves the old default in place rather than one naming no secrets."""
    requests = [api.put_account_data(user_id, KEY_PREFIX + key.key_id, key.description)]
    for name, secret in sorted(secrets.items()):
        content = {"encrypted": {key.key_id: encrypt_secret(key.key, name, secret)}}
        requests.append(api.put_account_data(user_id, name, content))
    if make_default:
        requests.append(api.put_account_data(user_id, DEFAULT_KEY, {"key": key.key_id}))
    return requests
