"""`gapline login`, and the sign-in every command on a store shares.

    gapline login --store DIR --homeserver URL --user MXID [--password-file FILE]
                  [--passphrase-file FILE] [--device-id ID]

``login`` asks the homeserver which logins it offers (an SSO-only homeserver is one
line, before any password is asked), asks for the password on the terminal unless a
file or ``$GAPLINE_PASSWORD`` gives it (never only the command line), logs in and keeps
the access token sealed in the account's directory of DIR, encrypted with the store key
like the device's keys. ``gapline bridge``, ``tui`` and ``keys`` then start from that
session without a password; ``--user`` picks the account when DIR holds several.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gapline.clikit import (
    PASSPHRASE,
    PASSWORD,
    CommandError,
    Exit,
    add_login_flags,
    add_secret_flags,
    examples,
    resolve_secret,
    store_directory,
)
from gapline.history._accounts import (
    Account,
    DeviceRecord,
    choose_account,
    read_record,
    write_record,
)
from gapline.history._cache_store import CacheStore
from gapline.history._engine import Engine
from gapline.history._session_store import load_session, save_session
from gapline.matrix import MatrixClient, MatrixError, MatrixUnavailable, Session, UnknownToken
from gapline.storage import CipherError, StorageError, WrongPassphrase

__all__ = [
    "DESCRIPTION",
    "EXAMPLES",
    "Target",
    "add_device_flag",
    "check_password_login",
    "configure",
    "keep",
    "keep_resumed",
    "login",
    "login_failure",
    "on_store",
    "password_given",
    "run",
    "session_ended",
    "sign_in",
    "store_passphrase",
    "target",
]

log = logging.getLogger("gapline.history.session")

_T = TypeVar("_T")

DESCRIPTION = """\
Log in to a homeserver with a password and keep the session in the store.

One store directory holds several accounts, one subdirectory each, chosen with --user.
The password comes from --password-file, $GAPLINE_PASSWORD or a prompt; the access token
is kept sealed with the store's key (the passphrase opens it). Afterwards `gapline
bridge`, `gapline tui` and `gapline keys` start on the account without a password. A
homeserver that offers only single sign-on (SSO) is refused in one line: gapline does not
support SSO yet."""

EXAMPLES = examples(
    "gapline login --store ~/gapline --homeserver https://matrix.example.org --user @me:example.org",
    (
        "gapline login --store ~/gapline --homeserver https://matrix.example.org",
        "--user @bot:example.org --password-file bot.password --passphrase-file passphrase.txt",
    ),
)


@dataclass(frozen=True, slots=True)
class Target:
    """What the flags chose: the accounts directory, the account, and how to log in."""

    store: Path
    account: Account
    homeserver: str
    password: str | None  # given by a file, the environment or the flag; else prompted


def password_given(args: argparse.Namespace) -> bool:
    """Whether a password came with the command (file, flag or environment), not a prompt."""
    return (
        getattr(args, PASSWORD.file_dest, None) is not None
        or getattr(args, PASSWORD.name, None) is not None
        or PASSWORD.env in os.environ
    )


def target(
    args: argparse.Namespace, *, create: bool = True, ask: bool = True, hint: str = ""
) -> Target:
    """The account the flags pick (a store from before accounts moved in place), its
    homeserver, and the password when the command line gave one, or (``ask``) when the
    store keeps no session: asked now, before the store's passphrase."""
    store = store_directory(args.store)
    account = choose_account(store, args.user, create=create and args.user is not None)
    homeserver = args.homeserver or (account.record.homeserver if account.record else None)
    if homeserver is None:
        raise CommandError(
            f"--homeserver is needed{hint}: {account.user_id} has no login in {store} "
            "that names one",
            Exit.USAGE,
        )
    record = account.record
    kept = record is not None and (record.session or record.logged_out)
    password = None
    if password_given(args) or (ask and not kept):
        password = resolve_secret(args, PASSWORD, prompt=f"password for {account.user_id}: ")
    return Target(store, account, homeserver, password)


def store_passphrase(args: argparse.Namespace, store: Path) -> str:
    """The store's passphrase; none given and no terminal: empty, with a warning."""
    passphrase = resolve_secret(
        args, PASSPHRASE, prompt=f"passphrase of the store in {store}: ", required=False
    )
    if passphrase is None:
        log.warning(
            "no --passphrase-file, no $GAPLINE_PASSPHRASE and no terminal to ask on: "
            "the store's key is wrapped with an empty passphrase"
        )
    return passphrase or ""


def login_failure(homeserver: str, user: str, exc: MatrixError) -> CommandError:
    """The one line for a login that did not happen: unreachable server, or refused."""
    if isinstance(exc, MatrixUnavailable):
        return CommandError(f"cannot reach the homeserver at {homeserver}: {exc}")
    return CommandError(f"login as {user} failed: {exc}")


def session_ended(store: Path, user: str, device: str, exc: UnknownToken) -> CommandError:
    """The one line for a stored session the homeserver no longer accepts."""
    again = f"`gapline login --store {store} --user {user}`"
    if exc.soft_logout:
        return CommandError(
            f"the session of {user} expired (the homeserver logged device {device} out "
            f"softly): log in again with {again}; the same device resumes"
        )
    return CommandError(
        f"the homeserver no longer accepts the session of {user} (device {device} was "
        f"logged out or deleted): log in again with {again}"
    )


def _same_server(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


async def sign_in(
    client: MatrixClient, cache: CacheStore, chosen: Target, *, device_id: str | None, name: str
) -> Session:
    """Resume the account's sealed session, or log in with the password and seal the new one.

    A password given with the command always logs in (on the stored device); otherwise
    the stored session is used, checked with ``whoami`` (an unreachable homeserver is
    only a warning: the engine works offline and retries). A dead session is a
    `CommandError` saying how to log in again, soft logout or not.
    """
    account = chosen.account
    record = read_record(account.directory)
    if record is not None and record.logged_out:
        raise CommandError(
            f"device {record.device_id} of {account.user_id} was logged out; its messages and "
            f"keys are still in {account.directory}: delete them with `gapline logout --store "
            f"{chosen.store} --user {account.user_id} --local` before logging in again",
            Exit.STORE,
        )
    try:
        stored = await load_session(cache.backend, cache.cipher)
    except CipherError as exc:
        raise CommandError(f"the stored session in {account.directory} is damaged: {exc}") from None
    if stored is not None and (
        stored.user_id != account.user_id or not _same_server(stored.homeserver, chosen.homeserver)
    ):
        stored = None  # another homeserver asked for: log in there
    if stored is not None and chosen.password is None and device_id in (None, stored.device_id):
        client.restore(stored)
        try:
            await client.whoami()
        except UnknownToken as exc:
            raise session_ended(chosen.store, account.user_id, stored.device_id, exc) from None
        except MatrixUnavailable as exc:
            log.warning("cannot reach %s (%s); starting offline", chosen.homeserver, exc)
        return stored
    password = chosen.password
    if password is None:
        password = await asyncio.to_thread(_ask_password, account.user_id)
    previous = device_id or (stored.device_id if stored else None)
    if previous is None and record is not None:
        previous = record.device_id
    try:
        session = await client.login(
            account.user_id, password, device_id=previous, initial_device_display_name=name
        )
    except MatrixError as exc:
        raise login_failure(chosen.homeserver, account.user_id, exc) from None
    await keep(cache, account, session)
    return session


def _ask_password(user: str) -> str:
    answer = resolve_secret(argparse.Namespace(), PASSWORD, prompt=f"password for {user}: ")
    assert answer is not None
    return answer


async def keep(cache: CacheStore, account: Account, session: Session) -> None:
    """Seal ``session`` in the account's store and name its device in ``device.json``."""
    try:
        await save_session(cache.backend, cache.cipher, session)
    except StorageError as exc:
        raise CommandError(
            f"cannot keep the session in {account.directory}: {exc}", Exit.STORE
        ) from None
    record = DeviceRecord(session.user_id, session.device_id, session.homeserver, session=True)
    await asyncio.to_thread(write_record, account.directory, record)


async def keep_resumed(engine: Engine, session: Session) -> None:
    """Seal ``session`` (the same device, logged in again after its token expired) in the
    store the running engine holds open, so the next start resumes it."""
    await save_session(engine.store.backend, engine.store.cipher, session)


# -- gapline login ---------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory of the accounts' encrypted stores, created if missing; the "
        "account's subdirectory is made in it",
    )
    add_login_flags(parser)
    add_secret_flags(parser, PASSPHRASE)
    add_device_flag(parser)


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """``--device-id ID``: the device a password login asks for."""
    parser.add_argument(
        "--device-id",
        metavar="ID",
        default=None,
        help="device to log in as with a password (default: the one the store remembers)",
    )


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    chosen = target(args, ask=False)  # asked after the homeserver says it takes a password
    passphrase = store_passphrase(args, chosen.account.directory)
    return login(chosen, passphrase, args.device_id)


async def login(
    chosen: Target,
    passphrase: str,
    device_id: str | None,
    *,
    connect: Callable[..., MatrixClient] = MatrixClient,
) -> int:
    """The login command's work; ``connect`` makes the client (a fake's in tests)."""
    account = chosen.account
    async with connect(chosen.homeserver) as client:
        await check_password_login(client, chosen.homeserver)
        session = await on_store(
            account.directory,
            passphrase,
            lambda cache: _fresh_login(client, cache, chosen, device_id),
        )
    print(
        f"logged in as {session.user_id} (device {session.device_id}); the session is kept "
        f"sealed in {account.directory}",
        file=sys.stderr,
    )
    return Exit.OK


async def _fresh_login(
    client: MatrixClient, cache: CacheStore, chosen: Target, device_id: str | None
) -> Session:
    # A login always logs in, even over a stored session: that is what it is for.
    if chosen.password is None:
        chosen = Target(
            chosen.store,
            chosen.account,
            chosen.homeserver,
            await asyncio.to_thread(_ask_password, chosen.account.user_id),
        )
    return await sign_in(client, cache, chosen, device_id=device_id, name="gapline")


async def check_password_login(client: MatrixClient, homeserver: str) -> None:
    """Refuse, in one line, a homeserver that offers no password login (SSO only)."""
    try:
        flows = await client.login_flows()
    except MatrixError as exc:
        if isinstance(exc, MatrixUnavailable):
            raise CommandError(f"cannot reach the homeserver at {homeserver}: {exc}") from None
        raise CommandError(
            f"the homeserver at {homeserver} would not say how to log in: {exc}"
        ) from None
    if flows.password:
        return
    if flows.sso_only:
        raise CommandError(
            f"the homeserver at {homeserver} offers only single sign-on (SSO), which gapline "
            "does not support yet; it needs a password login (m.login.password)"
        )
    offered = ", ".join(flows.types) or "none"
    raise CommandError(
        f"the homeserver at {homeserver} offers no password login (it offers: {offered}), "
        "and gapline logs in only with a password"
    )


async def on_store(
    directory: Path, passphrase: str, work: Callable[[CacheStore], Coroutine[None, None, _T]]
) -> _T:
    """Run ``work`` on the account's store, opened offline (one line if it will not open)."""
    opened = False
    failure: CommandError | None = None
    try:
        async with Engine.open(directory, None, passphrase=passphrase, sync=False) as engine:
            opened = True
            # Raised after the engine closed: its task group would wrap it in a group.
            try:
                result = await work(engine.store)
            except CommandError as exc:
                failure = exc
    except WrongPassphrase as exc:
        raise CommandError(f"cannot open the store in {directory}: {exc}") from None
    except StorageError as exc:
        status = Exit.FAILED if opened else Exit.STORE
        raise CommandError(f"cannot use the store in {directory}: {exc}", status) from None
    if failure is not None:
        raise failure
    return result
