"""``gapline bot``: run a Matrix bot on the event journal.

::

    gapline bot --homeserver http://127.0.0.1:8008 --user @bot:localhost \\
        --password-file bot.password --store bot.sqlite3 --handler echo \\
        [--allow-inviter @alice:localhost ...] [--approver @alice:localhost ...]

Logs are JSON lines on stderr. SIGTERM (or Ctrl-C) stops the bot cleanly:
every task is cancelled, nothing committed is lost, and whatever was in
flight is resumed by the next start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine

from gapline.clikit import (
    PASSPHRASE,
    PASSWORD,
    CommandError,
    Exit,
    add_log_flags,
    add_login_flags,
    add_recovery_flags,
    add_secret_flags,
    dsn,
    examples,
    log_level,
    positive_int,
    recovery_key,
    resolve_secret,
    user_id,
)
from gapline.e2ee import E2eeError
from gapline.journal._bot import Bot, BotConfig
from gapline.journal._handlers import BUILTIN_HANDLERS, HandlerError, resolve_handler
from gapline.journal._sidecar import DEFAULT_SIDECAR_LIMIT
from gapline.journal._types import JournalError
from gapline.matrix import MatrixError
from gapline.storage import StorageError

__all__ = [
    "EXAMPLES",
    "JsonLogFormatter",
    "configure",
    "configure_logging",
    "given_passphrase",
    "run",
]

log = logging.getLogger("gapline.journal.bot")

DESCRIPTION = """\
Run a Matrix bot on the event journal: every message is admitted exactly once,
answered by the handler, and delivered through crashes.

Logs are JSON lines on stderr ("msg": "ready" once the first sync is in).
SIGTERM or Ctrl-C stops it cleanly (exit status 0); the next start resumes
whatever was in flight."""

EXAMPLES = examples(
    (
        "GAPLINE_PASSWORD=secret gapline bot --homeserver http://127.0.0.1:8008",
        "--user @bot:localhost --store bot.sqlite3 --handler echo",
    ),
    (
        "gapline bot --homeserver https://matrix.example.org --user @bot:example.org",
        "--password-file bot.password --store postgresql://gapline@db/journal",
        "--handler myhandlers:summarise",
    ),
)

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger("gapline")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def configure(parser: argparse.ArgumentParser) -> None:
    add_login_flags(parser)
    parser.add_argument(
        "--store",
        required=True,
        type=dsn,
        metavar="DSN",
        help="the journal, created if missing: a SQLite file path, or a postgresql:// URL "
        "that several bots share",
    )
    parser.add_argument(
        "--handler",
        required=True,
        metavar="NAME",
        help=f"what answers each message: a built-in ({', '.join(sorted(BUILTIN_HANDLERS))}) "
        "or module:function, the module found from the current directory or the import path",
    )
    parser.add_argument(
        "--allow-inviter",
        action="append",
        default=[],
        type=user_id,
        metavar="MXID",
        help="accept invites only from this user (repeatable; default: anyone)",
    )
    parser.add_argument(
        "--approver",
        action="append",
        default=[],
        type=user_id,
        metavar="MXID",
        help="who may decide the approvals a handler asks for (repeatable; default: the "
        "sender of the message being answered)",
    )
    parser.add_argument(
        "--sidecar-limit",
        type=positive_int,
        default=DEFAULT_SIDECAR_LIMIT,
        metavar="N",
        help="replies longer than N characters are sent as a preview plus an attachment",
    )
    add_secret_flags(parser, PASSPHRASE)
    add_recovery_flags(parser)
    add_log_flags(parser)


def given_passphrase(args: argparse.Namespace) -> str | None:
    """The store's passphrase from --passphrase-file, --passphrase or $GAPLINE_PASSPHRASE;
    None when none gives one (the bot: no encrypted rooms; journal read: an unsealed
    journal). Never asked on a terminal: most journals have none."""
    if (
        getattr(args, PASSPHRASE.file_dest, None) is None
        and getattr(args, PASSPHRASE.name, None) is None
        and PASSPHRASE.env not in os.environ
    ):
        return None
    return resolve_secret(args, PASSPHRASE, prompt="", required=False, warn=log.warning)


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    """Resolve the handler and the password before the event loop starts (a prompt is
    answered, or interrupted, before anything runs), then hand back the bot."""
    configure_logging(log_level(args))
    try:
        handler = resolve_handler(args.handler)
    except HandlerError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
    password = resolve_secret(
        args, PASSWORD, prompt=f"password for {args.user}: ", warn=log.warning
    )
    assert password is not None
    passphrase = given_passphrase(args)
    key = recovery_key(args)
    if key is not None and passphrase is None:
        raise CommandError(
            "--recovery-key-file needs the bot's end-to-end encryption state: give "
            "--passphrase-file FILE or $GAPLINE_PASSPHRASE",
            Exit.USAGE,
        )
    config = BotConfig(
        homeserver=args.homeserver,
        user=args.user,
        password=password,
        store=args.store,
        handler=handler,
        allow_inviters=frozenset(args.allow_inviter),
        approvers=frozenset(args.approver),
        sidecar_limit=args.sidecar_limit,
        passphrase=passphrase,
        recovery_key=key,
    )
    return _run(config)


async def _run(config: BotConfig) -> int:
    from gapline.storage import open_backend

    try:
        backend = await open_backend(config.store)
    except StorageError as exc:
        raise CommandError(f"cannot open --store {config.store}: {exc}", Exit.STORE) from None
    try:
        return await _until_signal(Bot(config, backend=backend))
    finally:
        await backend.close()


async def _until_signal(bot: Bot) -> int:
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    stopping = False

    def stop() -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            log.info("stopping on signal")
            main.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    started = time.monotonic()
    try:
        await bot.run()
    except asyncio.CancelledError:
        if not stopping:
            raise
        main.uncancel()
        log.info("stopped", extra={"uptime_s": round(time.monotonic() - started, 1)})
        return Exit.OK
    except (MatrixError, StorageError, E2eeError, JournalError) as exc:
        log.error("bot failed", extra={"error": str(exc), "error_type": type(exc).__name__})
        return Exit.FAILED
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return Exit.OK
