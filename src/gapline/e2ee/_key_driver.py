"""The async shell of recovery, key backup and cross-signing: requests out, answers in.

Like `CryptoDriver`, it owns no rule: it fetches what the sans-I/O parts need
(account data, backup versions, backed-up keys), sends what they build, and
commits the machine's changes through the driver (one write per step).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gapline.matrix import (
    BackupVersionResponse,
    KeyBackupData,
    MatrixError,
    MatrixHTTPError,
    NotFound,
    Request,
    RoomKeysResponse,
    RoomKeysRoomResponse,
    RoomKeysUpdateResponse,
    crypto_api,
)

from ._backup import BackupTrust, RestoreReport, entries, merge_reports
from ._driver import CryptoDriver
from ._recovery import RecoverySetup, SecretStorageState, recover, setup_recovery
from ._types import RoomKeyId

__all__ = [
    "BackupEntries",
    "bootstrap_cross_signing",
    "enable_backup",
    "fetch_backup_room",
    "fetch_backup_sessions",
    "fetch_secret_storage",
    "recover_from_server",
    "restore_backup",
    "set_up_recovery",
    "sign_own_device",
    "upload_backup",
    "verify_user",
]

log = logging.getLogger("gapline.e2ee.backup")


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


async def _current_version(driver: CryptoDriver) -> BackupVersionResponse | None:
    try:
        return await driver.client.request(
            crypto_api.room_keys_version_get(), BackupVersionResponse
        )
    except NotFound:
        return None


async def enable_backup(
    driver: CryptoDriver, *, create: bool = True, replace_untrusted: bool = False
) -> BackupTrust | None:
    """Use the server's current backup version if it is trusted, or create one.

    A created version's key is committed (in the vault) before the version is
    created, so a crash in between leaves a version whose key this device holds.
    ``replace_untrusted``: a current version this device cannot trust is replaced by a
    new one (after a reset of the cross-signing keys that signed it).
    ``None``: there is no version and ``create`` is false."""
    machine = driver.machine
    current = await _current_version(driver)
    if current is None:
        if not create:
            machine.backup.no_version()
            await driver.commit()
            return None
        return await _create_version(driver)
    trust = machine.backup.use_version(current)
    await driver.commit()
    if not trust.trusted and replace_untrusted:
        log.warning(
            "backup version %s is not trusted (%s): replacing it", trust.version, trust.reason
        )
        return await _create_version(driver)
    return trust


async def _create_version(driver: CryptoDriver) -> BackupTrust:
    machine = driver.machine
    request = machine.backup.create_version(machine.cross_signing.sign_with_master)
    await driver.commit()
    created = await driver.client.request(request, crypto_api.BackupVersionCreated)
    machine.backup.version_created(created.version)
    await driver.commit()
    return BackupTrust(created.version, True, "created by this device")


async def upload_backup(driver: CryptoDriver, *, batch: int = 200) -> int:
    """Upload every pending session in batches, committing after each; how many went up.

    When the server says the version is no longer its current one (another device made
    a new version), the current one is taken up if it is trusted, and uploading goes on
    there; an untrusted one stops the upload (nothing more is sent)."""
    sent = 0
    while (upload := driver.machine.backup.next_upload(batch)) is not None:
        try:
            await driver.client.request(upload.request, RoomKeysUpdateResponse)
        except MatrixHTTPError as exc:
            driver.machine.backup.upload_failed(upload)
            if exc.errcode != "M_WRONG_ROOM_KEYS_VERSION":
                raise
            trust = await enable_backup(driver, create=False)
            if trust is None or not trust.trusted:
                return sent
            continue
        except MatrixError:
            driver.machine.backup.upload_failed(upload)
            raise
        driver.machine.backup.upload_done(upload)
        await driver.commit()
        sent += len(upload.sessions)
    return sent


async def restore_backup(
    driver: CryptoDriver,
    *,
    version: str | None = None,
    room_id: str | None = None,
    session_id: str | None = None,
    batch: int = 64,
) -> RestoreReport:
    """Download the backup (the current version, or ``version``; all of it, one room's
    sessions, or one session), decrypt it with the held key and import it; committed at
    once, so a crash leaves nothing half-restored. A session the backup lacks restores
    nothing.

    Entries are decrypted ``batch`` at a time with a yield to the event loop between
    batches (about 60 µs each: a batch of 64 holds the loop for a few ms)."""
    if version is None:
        current = await _current_version(driver)
        if current is None:
            raise NotFound(404, "M_NOT_FOUND", "the account has no key backup")
        version = current.version
    request = crypto_api.room_keys_get(version, room_id, session_id)
    items: list[tuple[str, str, KeyBackupData]]
    if room_id is None:
        items = entries(await driver.client.request(request, RoomKeysResponse))
    elif session_id is None:
        room = await driver.client.request(request, RoomKeysRoomResponse)
        items = [(room_id, sid, entry) for sid, entry in sorted(room.sessions.items())]
    else:
        try:
            items = [(room_id, session_id, await driver.client.request(request, KeyBackupData))]
        except NotFound:
            items = []
    reports = []
    for start in range(0, len(items), batch):
        reports.append(driver.machine.backup.restore_entries(version, items[start : start + batch]))
        await asyncio.sleep(0)
    await driver.commit()
    return merge_reports(reports)


@dataclass(frozen=True, slots=True)
class BackupEntries:
    """What a backup version answered for the sessions asked, not yet imported: restore
    them with ``machine.backup.restore_entries(version, entries)``."""

    version: str
    entries: tuple[tuple[str, str, KeyBackupData], ...]
    missing: tuple[RoomKeyId, ...] = ()  # asked for, and not in the backup


async def fetch_backup_sessions(
    driver: CryptoDriver, keys: Iterable[RoomKeyId], *, version: str, concurrency: int = 8
) -> BackupEntries:
    """``GET /room_keys/keys/{roomId}/{sessionId}`` for each key (each once, up to
    ``concurrency`` at a time). Nothing is imported or committed here, so the caller
    imports under its own lock. A 404 is a session the backup lacks; any other failure
    raises the first `MatrixError` once every request has settled."""
    wanted = list(dict.fromkeys(keys))
    found: dict[RoomKeyId, KeyBackupData] = {}
    missing: list[RoomKeyId] = []
    failures: list[MatrixError] = []
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(key: RoomKeyId) -> None:
        request = crypto_api.room_keys_get(version, key.room_id, key.session_id)
        async with gate:
            try:
                found[key] = await driver.client.request(request, KeyBackupData)
            except NotFound:
                missing.append(key)
            except MatrixError as exc:
                failures.append(exc)

    async with asyncio.TaskGroup() as tg:
        for key in wanted:
            tg.create_task(one(key))
    if failures:
        raise failures[0]
    return BackupEntries(
        version,
        tuple((k.room_id, k.session_id, found[k]) for k in wanted if k in found),
        tuple(k for k in wanted if k in missing),
    )


async def fetch_backup_room(driver: CryptoDriver, room_id: str, *, version: str) -> BackupEntries:
    """``GET /room_keys/keys/{roomId}``: every session the version holds for the room,
    not yet imported (see `fetch_backup_sessions`); a room it lacks has none."""
    request = crypto_api.room_keys_get(version, room_id)
    try:
        room = await driver.client.request(request, RoomKeysRoomResponse)
    except NotFound:
        return BackupEntries(version, ())
    return BackupEntries(
        version, tuple((room_id, sid, entry) for sid, entry in sorted(room.sessions.items()))
    )


async def _publish_signatures(driver: CryptoDriver, body: Any) -> None:
    answer = await driver.client.request(
        crypto_api.signatures_upload(body), crypto_api.SignaturesUploadResponse
    )
    if answer.failures:
        raise MatrixError(f"the server refused signatures: {answer.failures}")


async def _requery(driver: CryptoDriver, user_id: str) -> None:
    machine = driver.machine
    machine.update_tracked_users([user_id])
    machine.receive_sync_changes(changed=[user_id])
    result = await driver.send_outgoing()
    if result.failed:
        raise result.failed[0][1]


async def bootstrap_cross_signing(driver: CryptoDriver, *, password: str) -> str:
    """New cross-signing keys for the user, published with the account password, and this
    device signed with them; the master public key.

    The seeds are committed before the upload; if the server refuses it (a wrong password)
    the seeds held before are restored."""
    boot = driver.machine.cross_signing.bootstrap()
    await driver.commit()
    try:
        await driver.client.device_signing_upload(boot.keys, password=password)
    except MatrixError:
        driver.machine.cross_signing.undo(boot)
        await driver.commit()
        raise
    await _requery(driver, driver.machine.user_id)
    await sign_own_device(driver)
    return boot.master_key


async def sign_own_device(driver: CryptoDriver) -> None:
    """Sign this device with the held self-signing key (after bootstrap or recovery)."""
    body = driver.machine.cross_signing.sign_own_device()
    if body is None:
        raise ValueError("no self-signing key is held: bootstrap or recover first")
    await _publish_signatures(driver, body)
    await _requery(driver, driver.machine.user_id)


async def verify_user(driver: CryptoDriver, user_id: str) -> None:
    """Sign ``user_id``'s master key with our user-signing key (after verifying them)."""
    await _requery(driver, user_id)
    body = driver.machine.cross_signing.sign_user(user_id)
    if body is None:
        raise ValueError(f"{user_id} has no master key, or no user-signing key is held")
    await _publish_signatures(driver, body)
    await _requery(driver, user_id)
    await _requery(driver, driver.machine.user_id)
