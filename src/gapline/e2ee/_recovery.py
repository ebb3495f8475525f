"""Recovery: this device's private keys kept in secret storage under one recovery key.

Setting up (`setup_recovery`): a new default secret-storage key; every private
key the device holds (`SecretVault`: the backup key, the cross-signing seeds)
is written encrypted to account data, and the recovery key is shown once.

Recovering on another device (`SecretStorageState` from account data, then
`recover`): the recovery key (or passphrase) is checked against the default
key's description **before** anything is decrypted, every secret is decrypted
and checked next, and only then are they all put into the vault at once. A
wrong key is `WrongRecoveryKey`, a damaged secret `SecretStorageError`; in
both cases the machine is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gapline.matrix import Request, api

from ._recovery_key import decode_recovery_key, encode_recovery_key
from ._secret_storage import (
    DEFAULT_KEY,
    KEY_PREFIX,
    SecretStorageError,
    check_key,
    decrypt_secret,
    key_from_passphrase,
    new_key,
    setup_requests,
)
from ._vault import BACKUP_SECRET, MASTER_SECRET, SELF_SIGNING_SECRET, USER_SIGNING_SECRET

if TYPE_CHECKING:
    from ._machine import CryptoMachine

__all__ = [
    "RECOVERABLE_SECRETS",
    "RecoverySetup",
    "SecretStorageState",
    "recover",
    "setup_recovery",
]

log = logging.getLogger("gapline.e2ee.recovery")

RECOVERABLE_SECRETS = (BACKUP_SECRET, MASTER_SECRET, SELF_SIGNING_SECRET, USER_SIGNING_SECRET)


@dataclass(frozen=True, slots=True)
class RecoverySetup:
    """The recovery key to show once (secret), and the account-data writes to send."""

    key_id: str
    recovery_key: str = field(repr=False)
    requests: tuple[Request, ...]
    secrets: tuple[str, ...]  # the names stored


def setup_recovery(machine: CryptoMachine, *, passphrase: str | None = None) -> RecoverySetup:
    """A new default key holding every private key the machine's vault has.

    With ``passphrase`` the key is derived from it (PBKDF2); the recovery key
    opens it either way."""
    secrets = {n: s for n in RECOVERABLE_SECRETS if (s := machine.vault.get(n)) is not None}
    key = new_key(passphrase=passphrase)
    requests = setup_requests(machine.user_id, key, secrets)
    return RecoverySetup(key.key_id, encode_recovery_key(key.key), tuple(requests), tuple(secrets))


@dataclass(frozen=True, slots=True)
class SecretStorageState:
    """What the account data holds: the default key, its description, the secrets."""

    default_key_id: str | None
    description: Mapping[str, Any] | None
    secrets: Mapping[str, Mapping[str, Any]]  # name -> {"encrypted": {key_id: ...}}

    @staticmethod
    def default_key_request(user_id: str) -> Request:
        return api.account_data(user_id, DEFAULT_KEY)

    @staticmethod
    def reads(user_id: str, key_id: str) -> list[tuple[str, Request]]:
        """The account-data reads after the default key is known (a 404 is "not there")."""
        names = [KEY_PREFIX + key_id, *RECOVERABLE_SECRETS]
        return [(n, api.account_data(user_id, n)) for n in names]

    @classmethod
    def from_account_data(
        cls, default_key: Mapping[str, Any] | None, found: Mapping[str, Mapping[str, Any]]
    ) -> SecretStorageState:
        key_id = default_key.get("key") if default_key else None
        if not isinstance(key_id, str):
            return cls(None, None, {})
        return cls(
            key_id,
            found.get(KEY_PREFIX + key_id),
            {n: found[n] for n in RECOVERABLE_SECRETS if n in found},
        )


def _key(state: SecretStorageState, recovery_key: str | None, passphrase: str | None) -> bytes:
    if state.default_key_id is None or state.description is None:
        raise SecretStorageError("this account has no default secret storage key")
    if passphrase is not None:
        info = state.description.get("passphrase")
        if not isinstance(info, Mapping):
            raise SecretStorageError("the secret storage key has no passphrase")
        key = key_from_passphrase(passphrase, info)
    elif recovery_key is not None:
        key = decode_recovery_key(recovery_key)
    else:
        raise ValueError("give a recovery key or a passphrase")
    check_key(state.description, key)
    return key


def recover(
    machine: CryptoMachine,
    state: SecretStorageState,
    *,
    recovery_key: str | None = None,
    passphrase: str | None = None,
    names: Iterable[str] = RECOVERABLE_SECRETS,
) -> tuple[str, ...]:
    """Put the secrets of secret storage into the machine's vault; the names recovered.

    Raises `WrongRecoveryKey` (checked by the description's MAC first), `RecoveryKeyInvalid`
    (mistyped) or `SecretStorageError` (a damaged secret); then nothing is changed."""
    key = _key(state, recovery_key, passphrase)
    opened: dict[str, str] = {}
    for name in names:
        content = state.secrets.get(name)
        if content is None:
            continue
        encrypted = content.get("encrypted")
        entry = encrypted.get(state.default_key_id) if isinstance(encrypted, Mapping) else None
        if not isinstance(entry, Mapping):
            log.info("secret %s is not stored under the default key", name)
            continue
        opened[name] = decrypt_secret(key, name, entry)
    for name, secret in opened.items():
        machine.vault.put(name, secret)
    return tuple(opened)
