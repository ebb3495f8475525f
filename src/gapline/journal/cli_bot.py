"""``gapline bot``: run a Matrix bot on the event journal.

::

    gapline bot --homeserver http://127.0.0.1:8008 --user @bot:localhost --password PW \\
        --store bot.sqlite3 --handler echo [--allow-inviter @alice:localhost ...]

Logs are JSON lines on stderr. SIGTERM (or Ctrl-C) stops the bot cleanly:
every task is cancelled, nothing committed is lost, and whatever was in
flight is resumed by the next start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time

from gapline.journal._bot import Bot, BotConfig
from gapline.journal._handlers import BUILTIN_HANDLERS, HandlerError, resolve_handler
from gapline.journal._sidecar import DEFAULT_SIDECAR_LIMIT
from gapline.matrix import MatrixError
from gapline.storage import StorageError

__all__ = ["JsonLogFormatter", "configure", "configure_logging", "run"]

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
    parser.add_argument("--homeserver", required=True, help="homeserver base URL")
    parser.add_argument("--user", required=True, help="the bot's Matrix ID (@bot:example.org)")
    parser.add_argument("--password", required=True, help="the bot's password")
    parser.add_argument(
        "--store", required=True, help="journal DSN: a SQLite path or a postgresql:// URL"
    )
    parser.add_argument(
        "--handler",
        required=True,
        help=f"built-in handler ({', '.join(sorted(BUILTIN_HANDLERS))}) or module:function",
    )
    parser.add_argument(
        "--allow-inviter",
        action="append",
        default=[],
        metavar="MXID",
        help="accept invites only from this user (repeatable; default: anyone)",
    )
    parser.add_argument(
        "--sidecar-limit",
        type=int,
        default=DEFAULT_SIDECAR_LIMIT,
        help="replies longer than this many characters are sent as a preview plus an attachment",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


async def run(args: argparse.Namespace) -> int:
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    log = logging.getLogger("gapline.journal.bot")
    try:
        handler = resolve_handler(args.handler)
    except HandlerError as exc:
        print(f"gapline bot: {exc}", file=sys.stderr)
        return 2
    config = BotConfig(
        homeserver=args.homeserver,
        user=args.user,
        password=args.password,
        store=args.store,
        handler=handler,
        allow_inviters=frozenset(args.allow_inviter),
        sidecar_limit=args.sidecar_limit,
    )
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
        await Bot(config).run()
    except asyncio.CancelledError:
        if not stopping:
            raise
        log.info("stopped", extra={"uptime_s": round(time.monotonic() - started, 1)})
        return 0
    except (MatrixError, StorageError) as exc:
        log.error("bot failed", extra={"error": str(exc), "error_type": type(exc).__name__})
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0
