"""Several accounts in one store directory: one subdirectory per account, chosen by user ID.

    DIR/
      me_example.org/        one account: its encrypted cache (messages, device keys,
        history.sqlite3      the sealed access token) and device.json (identifiers only)
        device.json
      bot_example.org/
        ...

The subdirectory's name is the user ID without its ``@`` and with ``:`` as ``_`` (the
name ``gapline tui`` always gave a user's default store, so those stores are accounts
of ``$XDG_DATA_HOME/gapline`` as they are); the account a directory holds is the user
its ``device.json`` names, so two user IDs with one name are refused rather than mixed.
A store from before accounts (``history.sqlite3`` and ``device.json`` directly in DIR)
is moved into its account's subdirectory in place, through a staging directory that a
crash leaves for the next start to finish: the database never moves without its WAL.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from gapline.clikit import CommandError, Exit

__all__ = [
    "DEVICE_FILE",
    "STORE_FILE",
    "Account",
    "DeviceRecord",
    "account_dirname",
    "accounts",
    "choose_account",
    "migrate_layout",
    "read_record",
    "write_record",
]

log = logging.getLogger("gapline.history.accounts")

DEVICE_FILE = "device.json"
STORE_FILE = "history.sqlite3"  # the engine's file in an account's directory
_LEGACY_FILES = (STORE_FILE, f"{STORE_FILE}-wal", f"{STORE_FILE}-shm", DEVICE_FILE)
_STAGING = ".account-migration"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=+-")


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """What ``device.json`` holds: identifiers, never a credential.

    ``session`` says the store keeps a sealed access token (the password is not asked
    first). ``logged_out`` marks a device deleted by ``gapline logout`` whose local data
    was kept: its keys belong to a device that no longer exists, so it is never logged
    in again.
    """

    user_id: str
    device_id: str | None = None
    homeserver: str | None = None
    logged_out: bool = False
    session: bool = False


@dataclass(frozen=True, slots=True)
class Account:
    user_id: str
    directory: Path
    record: DeviceRecord | None


def account_dirname(user_id: str) -> str:
    """``@me:example.org`` -> ``me_example.org``; other unsafe characters as ``%XX``."""
    out: list[str] = []
    for char in user_id.removeprefix("@"):
        if char in _SAFE:
            out.append(char)
        elif char == ":" or char == "_":
            out.append("_")
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    name = "".join(out)
    return "%2E" + name[1:] if name.startswith(".") else name


def read_record(directory: Path) -> DeviceRecord | None:
    """The account's ``device.json``; None when missing or unreadable (with a warning)."""
    path = directory / DEVICE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None
    if not isinstance(data, dict):
        log.warning("ignoring %s: not a JSON object", path)
        return None
    user = data.get("user_id") or data.get("user")
    if not isinstance(user, str):
        return None
    device = data.get("device_id")
    homeserver = data.get("homeserver")
    return DeviceRecord(
        user_id=user,
        device_id=device if isinstance(device, str) else None,
        homeserver=homeserver if isinstance(homeserver, str) else None,
        logged_out=data.get("logged_out") is True,
        session=data.get("session") is True,
    )


def write_record(directory: Path, record: DeviceRecord) -> None:
    path = directory / DEVICE_FILE
    tmp = path.with_suffix(".tmp")
    data = {
        "user": record.user_id,
        "user_id": record.user_id,
        "device_id": record.device_id,
        "homeserver": record.homeserver,
    }
    if record.logged_out:
        data["logged_out"] = True
    if record.session:
        data["session"] = True
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}", Exit.STORE) from None


def migrate_layout(store: Path, user_id: str | None) -> Path | None:
    """Move a store from before accounts into its account's subdirectory; its new path.

    None when there is nothing to move. The account is the user its ``device.json``
    names, else ``user_id`` (``--user``); a store that names no one and no ``--user``
    is a `CommandError`, nothing moved.
    """
    staging = store / _STAGING
    legacy = [name for name in _LEGACY_FILES if (store / name).exists()]
    if not legacy and not staging.is_dir():
        return None
    record = read_record(store) if (store / DEVICE_FILE).exists() else read_record(staging)
    owner = record.user_id if record is not None else user_id
    if owner is None:
        raise CommandError(
            f"the store in {store} is from before accounts and does not say whose it is: "
            "give --user MXID to move it into that account's directory",
            Exit.USAGE,
        )
    target = store / account_dirname(owner)
    if target.exists():
        raise CommandError(
            f"cannot move the single-account store in {store} into {target}: "
            "that directory exists already",
            Exit.STORE,
        )
    try:
        staging.mkdir(exist_ok=True)
        for name in legacy:
            os.replace(store / name, staging / name)
        os.replace(staging, target)
        _sync_directory(store)
    except OSError as exc:
        raise CommandError(
            f"cannot move the store in {store} into {target}: {exc.strerror or exc}", Exit.STORE
        ) from None
    log.info("moved the single-account store in %s to %s", store, target)
    return target


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def accounts(store: Path) -> list[Account]:
    """The accounts in ``store`` (subdirectories with a ``device.json``), by user ID."""
    found: list[Account] = []
    try:
        entries = sorted(store.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CommandError(
            f"cannot list --store {store}: {exc.strerror or exc}", Exit.STORE
        ) from None
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        record = read_record(entry)
        if record is not None:
            found.append(Account(record.user_id, entry, record))
    return sorted(found, key=lambda account: account.user_id)


def choose_account(store: Path, user_id: str | None, *, create: bool = False) -> Account:
    """The account ``--user`` names (its directory made when ``create``), or the only one.

    Several accounts and no ``--user``: a `CommandError` listing them (status 2); none:
    a `CommandError` saying how to add one.
    """
    migrate_layout(store, user_id)
    if user_id is not None:
        directory = store / account_dirname(user_id)
        record = read_record(directory)
        if record is not None and record.user_id != user_id:
            raise CommandError(
                f"{directory} holds the account {record.user_id}, not {user_id}", Exit.STORE
            )
        if create:
            try:
                directory.mkdir(exist_ok=True)
            except OSError as exc:
                raise CommandError(
                    f"cannot create {directory}: {exc.strerror or exc}", Exit.STORE
                ) from None
        elif record is None and not (directory / STORE_FILE).exists():
            raise CommandError(_no_account(store, user_id), Exit.STORE)
        return Account(user_id, directory, record)
    found = accounts(store)
    if len(found) == 1:
        return found[0]
    if not found:
        raise CommandError(_no_account(store, None), Exit.STORE)
    listed = ", ".join(account.user_id for account in found)
    raise CommandError(
        f"the store in {store} holds {len(found)} accounts ({listed}): pick one with --user",
        Exit.USAGE,
    )


def _no_account(store: Path, user_id: str | None) -> str:
    who = user_id or "MXID"
    return (
        f"no account {user_id + ' ' if user_id else ''}in {store}: log in first with "
        f"`gapline login --store {store} --homeserver URL --user {who}`"
    )
