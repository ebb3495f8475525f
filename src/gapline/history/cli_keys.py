"""`gapline keys`: recovery, key files, on the store of a bridge or tui.

    gapline keys setup-recovery --homeserver URL --user MXID --store DIR [secret flags]
    gapline keys export --store DIR --out FILE [secret flags]
    gapline keys import FILE --store DIR [secret flags]

``setup-recovery`` logs in as the store's device, makes what is missing (cross-signing
keys, a key backup version, secret storage holding the backup key and the
cross-signing seeds), uploads every held key to the backup, and prints the recovery
key once on stdout; it is stored nowhere. ``export`` and ``import`` work offline on
the store (run them while no bridge or tui uses it): Element's key-file format, under a
passphrase from ``--export-passphrase-file``, ``$GAPLINE_EXPORT_PASSPHRASE`` or a prompt.
Rows an import can decrypt heal when the bridge or tui next starts on the store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncGenerator, Coroutine, Generator
from pathlib import Path

from gapline.clikit import (
    PASSPHRASE,
    PASSWORD,
    CommandError,
    Exit,
    SecretSpec,
    add_log_flags,
    add_login_flags,
    add_secret_flags,
    add_user_flag,
    examples,
    log_level,
    resolve_secret,
    subcommand,
)
from gapline.e2ee import (
    BACKUP_SECRET,
    CryptoMachine,
    E2eeError,
    KeyExportError,
    bootstrap_cross_signing,
    enable_backup,
    export_room_keys,
    import_room_keys,
    open_machine,
    save_changes,
    set_up_recovery,
    upload_backup,
)
from gapline.history._accounts import choose_account, read_record
from gapline.history._crypto import STORE_KEY_LABEL
from gapline.history._engine import Engine
from gapline.history.cli import add_store_flags
from gapline.history.cli_session import Target, sign_in, store_passphrase, target
from gapline.matrix import MatrixClient, MatrixError
from gapline.storage import StorageError, WrongPassphrase

__all__ = ["DESCRIPTION", "EXAMPLES", "configure", "run"]

log = logging.getLogger("gapline.history.keys")

EXPORT_PASSPHRASE = SecretSpec(
    "export-passphrase", "GAPLINE_EXPORT_PASSPHRASE", "the key file's passphrase", "PASSPHRASE"
)

DESCRIPTION = """\
Keys that outlive a device, on the store of a `gapline bridge` or `gapline tui`.

setup-recovery prints a recovery key once: keep it; a new device restores every backed-up
message key with it (`gapline bridge ... --recovery-key-file FILE`). export and import
write and read Element's key files, offline, while nothing else uses the store."""

SETUP_EXAMPLES = examples(
    (
        "gapline keys setup-recovery --homeserver https://matrix.example.org",
        "--user @me:example.org --password-file password.txt --store bridge-store",
        "> recovery-key.txt",
    ),
)
EXPORT_EXAMPLES = examples(
    (
        "gapline keys export --store bridge-store --out keys.txt",
        "--passphrase-file passphrase.txt --export-passphrase-file export-passphrase.txt",
    ),
)
IMPORT_EXAMPLES = examples(
    (
        "gapline keys import element-keys.txt --store bridge-store",
        "--passphrase-file passphrase.txt --export-passphrase-file export-passphrase.txt",
    ),
)
EXAMPLES = examples(
    "gapline keys setup-recovery --homeserver https://matrix.example.org --user @me:example.org "
    "--store bridge-store",
    "gapline keys import element-keys.txt --store bridge-store",
)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    setup = subcommand(
        sub,
        "setup-recovery",
        help="set up key backup and recovery; print the recovery key once",
        description=(
            "Log in as the store's device, make what is missing (cross-signing keys, a key\n"
            "backup version, secret storage with the backup key and the cross-signing seeds),\n"
            "upload every held message key to the backup, and print the new recovery key on\n"
            "stdout, once: it is stored nowhere. Running it again makes a new recovery key.\n"
            "When the account has cross-signing keys this device does not hold, it stops:\n"
            "recover first (`gapline bridge ... --recovery-key-file FILE`), or replace them\n"
            "with --reset-cross-signing."
        ),
        examples=SETUP_EXAMPLES,
    )
    setup.add_argument(
        "--reset-cross-signing",
        action="store_true",
        help=(
            "replace the account's cross-signing keys when this device does not hold them "
            "(every device and user verified with the old keys loses that trust)"
        ),
    )
    add_login_flags(setup, stored=True)
    add_store_flags(setup)
    add_log_flags(setup)
    export = subcommand(
        sub,
        "export",
        help="write every message key of the store to an Element key file",
        description=(
            "Write every message key the store's device holds to FILE, in Element's key-file\n"
            "format (`-----BEGIN MEGOLM SESSION DATA-----`), encrypted with the export\n"
            "passphrase. Offline; the file is created with mode 0600."
        ),
        examples=EXPORT_EXAMPLES,
    )
    _offline_flags(export)
    export.add_argument(
        "--out", required=True, type=Path, metavar="FILE", help="the key file to write"
    )
    imported = subcommand(
        sub,
        "import",
        help="add the message keys of an Element key file to the store",
        description=(
            "Read an Element key file (from Element, matrix-nio or `gapline keys export`) and\n"
            "keep its message keys in the store's device. Offline: rows they decrypt heal\n"
            "when the bridge or tui next starts on the store. A wrong passphrase or a damaged\n"
            "file changes nothing."
        ),
        examples=IMPORT_EXAMPLES,
    )
    imported.add_argument("file", type=Path, metavar="FILE", help="the key file to read")
    _offline_flags(imported)


def _offline_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", required=True, type=Path, metavar="DIR", help="a bridge or tui store directory"
    )
    add_user_flag(parser, required=False)
    add_secret_flags(parser, PASSPHRASE)
    add_secret_flags(parser, EXPORT_PASSPHRASE)
    add_log_flags(parser)


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    logging.basicConfig(
        stream=sys.stderr,
        level=log_level(args),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.action == "setup-recovery":
        chosen = target(args)
        passphrase = store_passphrase(args, chosen.account.directory)
        if chosen.password is None:  # cross-signing keys are uploaded with the password
            password = resolve_secret(
                args, PASSWORD, prompt=f"password for {chosen.account.user_id}: "
            )
            assert password is not None
            chosen = Target(chosen.store, chosen.account, chosen.homeserver, password)
        return _setup(args, chosen, passphrase)
    if not args.store.is_dir():
        raise CommandError(f"no store at --store {args.store}: not a directory", Exit.STORE)
    account = choose_account(args.store, args.user)
    store = account.directory
    if read_record(store) is None:
        raise CommandError(
            f"{store} is not a store that logged in: run `gapline login`, `gapline bridge` or "
            "`gapline tui` on it first",
            Exit.STORE,
        )
    passphrase = store_passphrase(args, store)
    secret = resolve_secret(args, EXPORT_PASSPHRASE, prompt="passphrase of the key file: ")
    assert secret is not None
    if args.action == "export":
        return _export(store, passphrase, secret, args.out)
    return _import(store, passphrase, secret, args.file)


@contextlib.contextmanager
def _store_errors(store: Path) -> Generator[None]:
    try:
        yield
    except WrongPassphrase:
        raise CommandError(f"wrong passphrase for the store in {store}") from None
    except StorageError as exc:
        raise CommandError(f"cannot use the store in {store}: {exc}", Exit.STORE) from None


async def _setup(args: argparse.Namespace, chosen: Target, passphrase: str) -> int:
    store = chosen.account.directory
    assert chosen.password is not None
    with _store_errors(store):
        async with (
            MatrixClient(chosen.homeserver) as client,
            Engine.open(store, client, passphrase=passphrase, sync=False, e2ee=True) as engine,
        ):
            await sign_in(client, engine.store, chosen, device_id=args.device_id, name="gapline")
            assert engine.crypto is not None
            try:
                key = await _set_up(engine, chosen.password, reset=args.reset_cross_signing)
            except (E2eeError, MatrixError) as exc:
                raise CommandError(f"setting up recovery failed: {exc}") from None
    print(key, flush=True)
    return Exit.OK


async def _set_up(engine: Engine, password: str, *, reset: bool = False) -> str:
    """Cross-signing, backup and secret storage, each made if missing; the recovery key.

    The account's existing cross-signing keys are replaced only when ``reset`` says so:
    replacing them silently would undo every verification made with them."""
    assert engine.crypto is not None
    driver = await engine.crypto.ensure()
    assert driver is not None
    machine = driver.machine
    me = machine.user_id
    async with engine.crypto.lock:
        machine.update_tracked_users([me])
        machine.receive_sync_changes(changed=[me])
        await driver.send_outgoing()
        if machine.cross_signing.trusted_master_key() is None:
            if machine.devices.cross_signing_keys(me).get("master") is not None:
                if not reset:
                    raise CommandError(
                        "the account has cross-signing keys this device does not hold: "
                        "recover them first (gapline bridge ... --recovery-key-file FILE), "
                        "or pass --reset-cross-signing to replace them (every device and "
                        "user verified with the old keys loses that trust)"
                    )
                log.warning("replacing the account's cross-signing keys (--reset-cross-signing)")
            await bootstrap_cross_signing(driver, password=password)
        trust = await enable_backup(driver, replace_untrusted=reset)
        if trust is None or not trust.trusted:
            reason = "none" if trust is None else trust.reason
            raise CommandError(
                f"the account's key backup is not trusted by this device ({reason}): recover "
                "with --recovery-key-file on a bridge first"
            )
        if machine.vault.get(BACKUP_SECRET) is None:
            raise CommandError(
                "this device does not hold the key of the account's backup: recover with "
                "--recovery-key-file on a bridge first"
            )
        sent = await upload_backup(driver)
        log.info("backup version %s: %d sessions uploaded", trust.version, sent)
        setup = await set_up_recovery(driver)
    return setup.recovery_key


@contextlib.asynccontextmanager
async def _machine(store: Path, passphrase: str) -> AsyncGenerator[tuple[Engine, CryptoMachine]]:
    """The store's crypto machine, offline (the store must have logged in before)."""
    ids = await asyncio.to_thread(_device_ids, store)
    with _store_errors(store):
        async with Engine.open(store, None, passphrase=passphrase, sync=False) as engine:
            key = engine.store.cipher.lookup_key(STORE_KEY_LABEL)
            try:
                machine = await open_machine(
                    engine.store.backend, key, user_id=ids[0], device_id=ids[1]
                )
            except E2eeError as exc:
                raise CommandError(f"cannot open the store's keys: {exc}", Exit.STORE) from None
            yield engine, machine


def _device_ids(store: Path) -> tuple[str, str]:
    record = read_record(store)
    if record is None or record.device_id is None:
        raise CommandError(
            f"{store} has no device: run `gapline login`, `gapline bridge` or `gapline tui` "
            "on it first",
            Exit.STORE,
        )
    return record.user_id, record.device_id


async def _export(store: Path, passphrase: str, secret: str, out: Path) -> int:
    async with _machine(store, passphrase) as (_, machine):
        text = await asyncio.to_thread(export_room_keys, machine, secret)
        count = len(machine.inbound.identifiers())
    try:
        await asyncio.to_thread(_write_private, out, text)
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from None
    print(f"exported {count} sessions to {out}", file=sys.stderr)
    return Exit.OK


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


async def _import(store: Path, passphrase: str, secret: str, path: Path) -> int:
    try:
        text = await asyncio.to_thread(path.read_text)
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read {path}: {exc}", Exit.USAGE) from None
    async with _machine(store, passphrase) as (engine, machine):
        try:
            report = await asyncio.to_thread(import_room_keys, machine, text, secret)
        except KeyExportError as exc:
            raise CommandError(f"cannot import {path}: {exc}") from None
        changes = machine.take_changes()
        with _store_errors(store):
            await engine.store.backend.write(lambda tx: save_changes(tx, changes))
    for refusal in report.refusals:
        log.warning("key refused: %s", refusal.detail)
    print(
        f"imported {len(report.imported)} sessions from {path} "
        f"({report.already_known} already known, {len(report.skipped)} skipped)",
        file=sys.stderr,
    )
    return Exit.OK
