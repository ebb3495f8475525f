"""The async shell of recovery, key backup and cross-signing: requests out, answers in.

Like `CryptoDriver`, it owns no rule: it fetches what the sans-I/O parts need
(account data, backup versions, backed-up keys), sends what they build, and
commits the machine's changes through the driver (one write per step).
"""

from __future__ import annotations

from typing import Any

from gapline.matrix import NotFound, Request

from ._driver import CryptoDriver
from ._recovery import RecoverySetup, SecretStorageState, recover, setup_recovery

__all__ = ["fetch_secret_storage", "recover_from_server", "set_up_recovery"]


async def _json_or_none(driver: CryptoDriver, request: Request) -> dict[str, Any] | None:
    try:
        return await driver.client.request(request, dict)
    except NotFound:
        return None


async def fetch_secret_storage(driver: CryptoDriver) -> SecretStorageState:
    """The account's secret storage as it is now (default key, description, secrets)."""
    user = driver.machine.user_id
    default = await _json_or_none(driver, SecretStorageState.default_key_request(user))
    key_id = default.get("key") if default else None
    found: dict[str, dict[str, Any]] = {}
    if isinstance(key_id, str):
        for name, request in SecretStorageState.reads(user, key_id):
            content = await _json_or_none(driver, request)
            if content is not None:
                found[name] = content
    return SecretStorageState.from_account_data(default, found)


async def set_up_recovery(driver: CryptoDriver, *, passphrase: str | None = None) -> RecoverySetup:
    """Store every held private key under a new default key; show ``recovery_key`` once."""
    setup = setup_recovery(driver.machine, passphrase=passphrase)
    for request in setup.requests:
        await driver.client.request(request, dict)
    return setup


async def recover_from_server(
    driver: CryptoDriver, *, recovery_key: str | None = None, passphrase: str | None = None
) -> tuple[str, ...]:
    """Fetch secret storage, open it, keep the secrets (committed); the names recovered.

    A wrong key raises `WrongRecoveryKey` and nothing is changed or saved."""
    state = await fetch_secret_storage(driver)
    names = recover(driver.machine, state, recovery_key=recovery_key, passphrase=passphrase)
    await driver.commit()
    return names
