"""``gapline journal read``: print a principal's projected conversation as JSON lines.

::

    gapline journal read --store DSN --principal @bot:example.org --room '!r:example.org' \\
        [--thread '$root'] [--limit 50] [--before '<created_ts>:<event_id>'] [--strict]

Oldest first: the newest N rows before the cursor (default: the newest N).
Each line is ``{"event_id", "sender", "created_ts", "thread_id", "body", "edited"}``.
stdout carries those lines only; the last line on stderr says how to page:
``next page: --before '<cursor>'``, or ``start of the conversation`` when
nothing older is left. A message whose visible revision was redacted is
omitted, or, with ``--strict``, makes the read fail (exit 3): repairing it
needs the homeserver, which only the bot (or the Python API with a client) has.

The store is only read: a path that does not exist, or a database that holds
no journal, is an error (exit 4), never a new empty journal.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Coroutine

from gapline.clikit import (
    CommandError,
    Exit,
    dsn,
    event_id,
    examples,
    existing_store,
    positive_int,
    room_id,
    subcommand,
    user_id,
)
from gapline.journal._reader import ConversationReader, StaleConversation
from gapline.journal._schema import SCHEMA
from gapline.journal._store import JournalStore
from gapline.journal._types import ConversationKey, ConversationPage, Cursor, InvalidCursor
from gapline.storage import Backend, MigrationError, StorageError

__all__ = ["EXAMPLES", "configure", "run"]

READ_EXAMPLES = examples(
    (
        "gapline journal read --store bot.sqlite3 --principal @bot:localhost",
        "--room '!abc:localhost' --limit 20",
    ),
    (
        "gapline journal read --store bot.sqlite3 --principal @bot:localhost",
        "--room '!abc:localhost' --limit 20 --before '1700000000000:$abc:localhost'",
    ),
)
EXAMPLES = READ_EXAMPLES

# Timestamps are stored as signed 64-bit integers on both backends.
_MAX_TS = 2**63 - 1
# The storage layer's bookkeeping table (docs/storage.md, "Migrations"): a journal is a
# database in which the journal's migrations were applied.
_IS_A_JOURNAL = "SELECT 1 FROM gapline_schema_migrations WHERE schema = ? LIMIT 1"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    read = subcommand(
        sub,
        "read",
        help="print a projected conversation as JSON lines",
        description=(
            "Print a principal's projected conversation as JSON lines on stdout, oldest first:\n"
            "the newest --limit rows before --before (default: the newest). The last line on\n"
            "stderr is the next page's flag, next page: --before '<cursor>', or\n"
            '"start of the conversation". The store is only read, never created.'
        ),
        examples=READ_EXAMPLES,
    )
    read.add_argument(
        "--store",
        required=True,
        type=dsn,
        metavar="DSN",
        help="the journal to read: an existing SQLite file or a postgresql:// URL",
    )
    read.add_argument(
        "--principal", required=True, type=user_id, metavar="MXID", help="the bot's Matrix ID"
    )
    read.add_argument(
        "--room", required=True, type=room_id, metavar="ROOM_ID", help="the room to print"
    )
    read.add_argument(
        "--thread",
        default=None,
        type=event_id,
        metavar="EVENT_ID",
        help="print this thread (its root event ID) instead of the room's main timeline",
    )
    read.add_argument("--limit", type=positive_int, default=50, metavar="N", help="rows to print")
    read.add_argument(
        "--before",
        default=None,
        type=_cursor,
        metavar="CURSOR",
        help="print the rows before this <created_ts>:<event_id> (from 'next page:')",
    )
    read.add_argument(
        "--strict", action="store_true", help="fail instead of omitting redacted revisions"
    )


def _cursor(text: str) -> Cursor:
    try:
        cursor = Cursor.parse(text)
    except InvalidCursor as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if cursor.created_ts > _MAX_TS:
        raise argparse.ArgumentTypeError(
            f"created_ts {cursor.created_ts} is out of range (at most {_MAX_TS})"
        )
    return cursor


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    existing_store(args.store, "journal")
    return _read(args)


async def _read(args: argparse.Namespace) -> int:
    from gapline.storage import open_backend

    try:
        backend = await open_backend(args.store)
    except StorageError as exc:
        raise CommandError(f"cannot open --store {args.store}: {exc}", Exit.STORE) from None
    try:
        await _require_journal(backend, args.store)
        store = await JournalStore.open(backend)
        reader = ConversationReader(store.principal(args.principal))
        key = ConversationKey(args.room, args.thread)
        try:
            page = await reader.read(key, limit=args.limit, before=args.before, strict=args.strict)
        except StaleConversation as exc:
            raise CommandError(str(exc), Exit.STALE) from None
        _print(page)
        return Exit.OK
    except MigrationError as exc:  # a journal written by a newer gapline
        raise CommandError(f"cannot read --store {args.store}: {exc}", Exit.STORE) from None
    except StorageError as exc:
        raise CommandError(f"reading --store {args.store} failed: {exc}") from None
    finally:
        await backend.close()


async def _require_journal(backend: Backend, store: str) -> None:
    try:
        row = await backend.read(lambda tx: tx.one(_IS_A_JOURNAL, (SCHEMA,)))
    except StorageError:
        row = None  # no bookkeeping table: no gapline store at all
    if row is None:
        raise CommandError(f"--store {store} holds no journal", Exit.STORE)


def _print(page: ConversationPage) -> None:
    out = sys.stdout
    for row in page.rows:
        out.write(
            json.dumps(
                {
                    "event_id": row.event_id,
                    "sender": row.sender,
                    "created_ts": row.created_ts,
                    "thread_id": row.thread_id,
                    "body": row.body,
                    "edited": row.edited,
                },
                ensure_ascii=False,
            )
            + "\n"
        )
    out.flush()
    if page.next_before is None:
        print("start of the conversation", file=sys.stderr)
    else:
        print(f"next page: --before {shlex.quote(str(page.next_before))}", file=sys.stderr)
