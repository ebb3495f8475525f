"""The flags several commands share, each defined once so it means the same everywhere."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from gapline.clikit._exits import CommandError, Exit
from gapline.clikit._secrets import PASSWORD, add_secret_flags
from gapline.clikit._values import homeserver_url, is_postgres, user_id

__all__ = [
    "LOG_LEVELS",
    "add_log_flags",
    "add_login_flags",
    "add_user_flag",
    "existing_store",
    "log_level",
    "store_directory",
]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
LOG_LEVELS = tuple(_LEVELS)


def add_login_flags(parser: argparse.ArgumentParser, *, stored: bool = False) -> None:
    """``--homeserver URL --user MXID`` and the password's sources.

    ``stored``: a command on a store that remembers its accounts' logins (``gapline
    login`` made them), where both flags are optional: the homeserver is the one the
    account logged in to, the user the store's only account (the command's description
    says so; a flag's help is the same in every command).
    """
    parser.add_argument(
        "--homeserver",
        required=not stored,
        type=homeserver_url,
        metavar="URL",
        help="the homeserver's base URL, e.g. https://matrix.example.org",
    )
    add_user_flag(parser, required=not stored)
    add_secret_flags(parser, PASSWORD)


def add_user_flag(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """``--user MXID``: the account a command acts as (or picks in a store of several)."""
    parser.add_argument(
        "--user",
        required=required,
        type=user_id,
        metavar="MXID",
        help="the account, a full Matrix user ID (@name:server)",
    )


def add_log_flags(parser: argparse.ArgumentParser, *, default: str = "info") -> None:
    """``-v/--verbose`` and ``--log-level``: what a long-running command logs on stderr."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        metavar="LEVEL",
        help=f"threshold of the log lines on stderr: {', '.join(LOG_LEVELS)}",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logs on stderr (--log-level debug)"
    )


def log_level(args: argparse.Namespace) -> int:
    return logging.DEBUG if args.verbose else _LEVELS[args.log_level]


def store_directory(path: Path) -> Path:
    """``--store DIR`` for a command that writes: created if missing, and usable.

    A regular file, a directory it may not write, a parent it may not create in:
    a `CommandError` with status `Exit.STORE`.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CommandError(f"--store {path} exists and is not a directory", Exit.STORE) from None
    except NotADirectoryError:
        raise CommandError(
            f"--store {path}: a parent of it is a file, not a directory", Exit.STORE
        ) from None
    except OSError as exc:
        raise CommandError(
            f"cannot create --store {path}: {exc.strerror or exc}", Exit.STORE
        ) from None
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise CommandError(f"--store {path} is not readable and writable by you", Exit.STORE)
    return path


def existing_store(dsn: str, what: str) -> str:
    """``--store DSN`` for a command that only reads: a SQLite path must name an existing
    file (opening it would create an empty database). A PostgreSQL database is checked
    when it is opened."""
    if is_postgres(dsn):
        return dsn
    path = Path(dsn)
    if not path.exists():
        raise CommandError(f"no {what} at --store {dsn}: the file does not exist", Exit.STORE)
    if not path.is_file():
        raise CommandError(f"--store {dsn} is not a file", Exit.STORE)
    if path.stat().st_size == 0:
        raise CommandError(f"--store {dsn} is empty: there is no {what} in it", Exit.STORE)
    return dsn
