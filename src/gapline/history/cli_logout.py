"""`gapline logout`: end an account's session on the homeserver, its device with it.

    gapline logout --store DIR [--user MXID] [--local] [--passphrase-file FILE]

Opens the account's store (the passphrase unseals the access token), sends
``POST /logout`` with it (the homeserver invalidates the token and deletes the device),
then forgets the token. The account's messages and message keys stay in its directory
(``gapline keys export`` still reads them) unless ``--local`` deletes them too; kept,
they are marked as a logged-out device's, which is never logged in again.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path

from gapline.clikit import (
    PASSPHRASE,
    CommandError,
    Exit,
    add_secret_flags,
    add_user_flag,
    examples,
)
from gapline.history._accounts import Account, DeviceRecord, choose_account, write_record
from gapline.history._cache_store import CacheStore
from gapline.history._session_store import forget_session, load_session
from gapline.history.cli_session import on_store, store_passphrase
from gapline.matrix import MatrixClient, MatrixError, MatrixUnavailable, Session, UnknownToken
from gapline.storage import CipherError

__all__ = ["DESCRIPTION", "EXAMPLES", "configure", "logout", "run"]

log = logging.getLogger("gapline.history.logout")

DESCRIPTION = """\
Log an account out: the homeserver invalidates its access token and deletes its device.

The token is forgotten locally too. The account's cached messages and message keys stay
in its directory of the store (`gapline keys export` still reads them) unless --local
deletes them as well. An unreachable homeserver changes nothing (status 1): run it again."""

EXAMPLES = examples(
    "gapline logout --store ~/gapline --user @me:example.org",
    "gapline logout --store ~/gapline --user @bot:example.org --local --passphrase-file pp.txt",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", required=True, type=Path, metavar="DIR", help="the store `gapline login` used"
    )
    add_user_flag(parser, required=False)
    parser.add_argument(
        "--local",
        action="store_true",
        help="also delete the account's local data: cached messages, message keys, device",
    )
    add_secret_flags(parser, PASSPHRASE)


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    store: Path = args.store
    if not store.is_dir():
        raise CommandError(f"no store at --store {store}: not a directory", Exit.STORE)
    account = choose_account(store, args.user)
    passphrase = store_passphrase(args, account.directory)
    return logout(account, passphrase, local=args.local)


async def logout(
    account: Account,
    passphrase: str,
    *,
    local: bool,
    connect: Callable[..., MatrixClient] = MatrixClient,
) -> int:
    """The command's work; ``connect`` makes the client (a fake's in tests)."""
    ended = await on_store(
        account.directory, passphrase, lambda cache: _end(cache, account, connect)
    )
    if ended is None and not local:
        raise CommandError(
            f"{account.user_id} has no session in {account.directory}: nothing to log out "
            "(--local deletes the local data)"
        )
    if local:
        await asyncio.to_thread(shutil.rmtree, account.directory)
        where = f"its local data in {account.directory} deleted"
    else:
        where = f"its messages and keys kept in {account.directory}"
    device = f"device {ended.device_id} deleted on the homeserver" if ended else "no session"
    print(f"logged out {account.user_id} ({device}; {where})", file=sys.stderr)
    return Exit.OK


async def _end(
    cache: CacheStore, account: Account, connect: Callable[..., MatrixClient]
) -> Session | None:
    """Log the stored session out on its homeserver and forget it; None if there was none."""
    try:
        session = await load_session(cache.backend, cache.cipher)
    except CipherError as exc:
        raise CommandError(f"the stored session in {account.directory} is damaged: {exc}") from None
    if session is None:
        return None
    async with connect(session.homeserver, session=session) as client:
        try:
            await client.logout()
        except UnknownToken:
            log.info("the homeserver had already ended this session")
        except MatrixUnavailable as exc:
            raise CommandError(
                f"cannot reach the homeserver at {session.homeserver} ({exc}): still logged "
                "in, nothing changed"
            ) from None
        except MatrixError as exc:
            raise CommandError(f"the homeserver refused the logout: {exc}") from None
    await forget_session(cache.backend)
    record = DeviceRecord(session.user_id, session.device_id, session.homeserver, logged_out=True)
    await asyncio.to_thread(write_record, account.directory, record)
    return session
