"""`SecretVault`: the private keys this device holds, by their secret-storage names.

What it holds: the key backup's Curve25519 decryption key (``m.megolm_backup.v1``)
and the cross-signing seeds (``m.cross_signing.master``, ``.self_signing``,
``.user_signing``), each as the unpadded base64 text secret storage keeps. They
come from bootstrapping on this device or from secret storage after a recovery.
At rest each is sealed by the machine's value cipher, bound to its name, so a
row copied under another name does not open.
"""

from __future__ import annotations

from collections.abc import Iterable

from gapline.storage import StorageError

from ._changes import ChangeBuilder, SecretRecord
from ._secrets import CryptoKeys

__all__ = [
    "BACKUP_SECRET",
    "MASTER_SECRET",
    "SELF_SIGNING_SECRET",
    "USER_SIGNING_SECRET",
    "SecretVault",
]

BACKUP_SECRET = "m.megolm_backup.v1"
MASTER_SECRET = "m.cross_signing.master"
SELF_SIGNING_SECRET = "m.cross_signing.self_signing"
USER_SIGNING_SECRET = "m.cross_signing.user_signing"


def _aad(name: str) -> bytes:
    return b"e2ee_secrets:" + name.encode()


class SecretVault:
    def __init__(self, keys: CryptoKeys) -> None:
        self._keys = keys
        self._secrets: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self.generation = 0  # bumped on every change (trust caches)

    def __repr__(self) -> str:
        return f"SecretVault({sorted(self._secrets)})"

    def load(self, records: Iterable[SecretRecord]) -> None:
        for r in records:
            try:
                self._secrets[r.name] = self._keys.cipher.decrypt(r.sealed, _aad(r.name)).decode()
                self.generation += 1
            except StorageError as exc:  # a tampered or misplaced row
                raise ValueError(f"held secret {r.name}: {exc}") from None

    def get(self, name: str) -> str | None:
        return self._secrets.get(name)

    def names(self) -> list[str]:
        return sorted(self._secrets)

    def put(self, name: str, secret: str) -> None:
        if self._secrets.get(name) != secret:
            self._secrets[name] = secret
            self.generation += 1
            self._dirty.add(name)
            self._removed.discard(name)

    def remove(self, name: str) -> None:
        if self._secrets.pop(name, None) is not None:
            self.generation += 1
            self._dirty.discard(name)
            self._removed.add(name)

    @property
    def dirty(self) -> bool:
        return bool(self._dirty or self._removed)

    def drain(self, out: ChangeBuilder) -> None:
        for name in sorted(self._dirty):
            sealed = self._keys.cipher.encrypt(self._secrets[name].encode(), _aad(name))
            out.add("secrets", SecretRecord(name, sealed))
        out.add("secrets_removed", *sorted(self._removed))
        self._dirty.clear()
        self._removed.clear()
