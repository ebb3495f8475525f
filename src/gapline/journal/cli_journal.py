"""``gapline journal read`` and ``gapline journal export``: a principal's projected
conversation, a page at a time or all of it.

::

    gapline journal read --store DSN --principal @bot:example.org --room '!r:example.org' \\
        [--thread '$root'] [--limit 50] [--before '<created_ts>:<event_id>'] [--strict]
    gapline journal export --store DSN --principal @bot:example.org --room '!r:example.org' \\
        [--thread '$root'] --format jsonl|markdown [--strict]

Oldest first: the newest N rows before the cursor (default: the newest N).
Each line is ``{"event_id", "sender", "created_ts", "thread_id", "body", "edited"}``.
stdout carries those lines only; the last line on stderr says how to page:
``next page: --before '<cursor>'``, or ``start of the conversation`` when
nothing older is left. A message whose visible revision was redacted is
omitted, or, with ``--strict``, makes the read fail (exit 3): repairing it
needs the homeserver, which only the bot (or the Python API with a client) has.

``export`` writes the whole conversation to stdout, oldest first (a thread: its root,
then its replies), as JSON lines (the same objects as ``read``) or Markdown. It pages
the same reader ``read`` uses, one bounded page after another, so memory does not grow
with the conversation; a long export draws a progress bar on stderr when stderr is a
terminal, and the last line on stderr says how many messages were written and what
the projection could not vouch for. Without the bot's homeserver it cannot hydrate a
conversation the bot never walked (``gapline.journal.export_conversation`` with the
bot's reader does).

The store is only read: a path that does not exist, or a database that holds
no journal, is an error (exit 4), never a new empty journal.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections.abc import AsyncGenerator, Callable, Coroutine

from gapline.clikit import (
    PASSPHRASE,
    CommandError,
    Exit,
    add_secret_flags,
    bounded_int,
    dsn,
    event_id,
    examples,
    existing_store,
    room_id,
    subcommand,
    user_id,
)
from gapline.journal._export import ExportFormat, ExportSummary, export_conversation, row_line
from gapline.journal._reader import ConversationReader, StaleConversation
from gapline.journal._schema import SCHEMA
from gapline.journal._sealing import SealedContent, open_sealing
from gapline.journal._store import JournalStore
from gapline.journal._types import ConversationKey, ConversationPage, Cursor, InvalidCursor
from gapline.journal.cli_bot import given_passphrase
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
EXPORT_EXAMPLES = examples(
    (
        "gapline journal export --store bot.sqlite3 --principal @bot:localhost",
        "--room '!abc:localhost' --format markdown",
    ),
    (
        "gapline journal export --store postgresql://gapline@db/journal",
        "--principal @bot:example.org --room '!abc:example.org' --thread '$root' --format jsonl",
    ),
)
EXAMPLES = READ_EXAMPLES

# Timestamps are stored as signed 64-bit integers on both backends.
_MAX_TS = 2**63 - 1

MAX_LIMIT = 10_000
"""Most rows one read prints."""
# The storage layer's bookkeeping table (docs/storage.md, "Migrations"): a journal is a
# database in which the journal's migrations were applied.
_IS_A_JOURNAL = "SELECT 1 FROM gapline_schema_migrations WHERE schema = ? LIMIT 1"


def _conversation_flags(parser: argparse.ArgumentParser, *, room_help: str) -> None:
    """The flags ``read`` and ``export`` share: which journal, whose, which conversation."""
    parser.add_argument(
        "--store",
        required=True,
        type=dsn,
        metavar="DSN",
        help="the journal to read: an existing SQLite file or a postgresql:// URL",
    )
    parser.add_argument(
        "--principal", required=True, type=user_id, metavar="MXID", help="the bot's Matrix ID"
    )
    parser.add_argument("--room", required=True, type=room_id, metavar="ROOM_ID", help=room_help)
    parser.add_argument(
        "--thread",
        default=None,
        type=event_id,
        metavar="EVENT_ID",
        help="this thread (its root event ID) instead of the room's main timeline",
    )
    add_secret_flags(parser, PASSPHRASE)


def _strict_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strict", action="store_true", help="fail instead of omitting redacted revisions"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    _configure_read(sub)
    export = subcommand(
        sub,
        "export",
        help="write a whole projected conversation as JSON lines or Markdown",
        description=(
            "Write a principal's whole projected conversation to stdout, oldest first (a\n"
            "thread: its root, then its replies), one bounded page at a time. A progress bar\n"
            "goes to stderr on a terminal; the last line on stderr says how many messages\n"
            "were written. The store is only read, never created."
        ),
        examples=EXPORT_EXAMPLES,
    )
    _conversation_flags(export, room_help="the room to export")
    export.add_argument(
        "--format",
        required=True,
        choices=[f.value for f in ExportFormat],
        metavar="FORMAT",
        help="jsonl (one JSON object per message, as journal read prints) or markdown",
    )
    _strict_flag(export)


def _configure_read(sub: argparse._SubParsersAction) -> None:
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
    _conversation_flags(read, room_help="the room to print")
    read.add_argument(
        "--limit",
        type=bounded_int(MAX_LIMIT),
        default=50,
        metavar="N",
        help=f"rows to print (at most {MAX_LIMIT:,})",
    )
    read.add_argument(
        "--before",
        default=None,
        type=_cursor,
        metavar="CURSOR",
        help="print the rows before this <created_ts>:<event_id> (from 'next page:')",
    )
    _strict_flag(read)


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
    return _export(args) if args.action == "export" else _read(args)


@contextlib.asynccontextmanager
async def _reader(args: argparse.Namespace) -> AsyncGenerator[ConversationReader]:
    """The principal's reader on an existing journal, without a homeserver: it reads
    the projection and never writes. Store failures become one-line errors."""
    from gapline.storage import open_backend

    try:
        backend = await open_backend(args.store)
    except StorageError as exc:
        raise CommandError(f"cannot open --store {args.store}: {exc}", Exit.STORE) from None
    try:
        await _require_journal(backend, args.store)
        passphrase = given_passphrase(args)
        sealing = None if passphrase is None else await open_sealing(backend, passphrase)
        store = await JournalStore.open(backend)
        yield ConversationReader(store.principal(args.principal, sealing=sealing))
    except SealedContent as exc:
        raise CommandError(f"cannot read --store {args.store}: {exc}") from None
    except StaleConversation as exc:
        raise CommandError(str(exc), Exit.STALE) from None
    except MigrationError as exc:  # a journal written by a newer gapline
        raise CommandError(f"cannot read --store {args.store}: {exc}", Exit.STORE) from None
    except StorageError as exc:
        raise CommandError(f"reading --store {args.store} failed: {exc}") from None
    finally:
        await backend.close()


async def _read(args: argparse.Namespace) -> int:
    async with _reader(args) as reader:
        key = ConversationKey(args.room, args.thread)
        page = await reader.read(key, limit=args.limit, before=args.before, strict=args.strict)
        _print(page)
    return Exit.OK


async def _export(args: argparse.Namespace) -> int:
    out = sys.stdout
    async with _reader(args) as reader, _progress_bar() as progress:
        summary = await export_conversation(
            reader,
            ConversationKey(args.room, args.thread),
            out.write,
            format=ExportFormat(args.format),
            strict=args.strict,
            progress=progress,
        )
    out.flush()
    print(_summary_line(summary), file=sys.stderr)
    return Exit.OK


def _summary_line(summary: ExportSummary) -> str:
    notes = []
    if summary.omitted:
        notes.append(
            f"{summary.omitted} redacted or unresolved revisions left out (--strict fails)"
        )
    if summary.reached_start is None:
        notes.append("never hydrated from the homeserver: older messages may be missing")
    elif not summary.reached_start:
        notes.append("the hydration stopped before the conversation's start")
    return f"exported {summary.messages} messages" + "".join(f"; {n}" for n in notes)


@contextlib.asynccontextmanager
async def _progress_bar() -> AsyncGenerator[Callable[[int], object]]:
    """A count-and-rate bar on stderr, on a terminal only, drawn once an export runs past
    its first page; gone when the export ends (the summary line stays)."""
    if not sys.stderr.isatty():
        yield lambda _count: None
        return
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

    bar = Progress(
        SpinnerColumn(),
        TextColumn("exporting"),
        MofNCompleteColumn(),
        TextColumn("messages, {task.speed} /s"),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task("export", total=None)
    pages = 0

    def advance(count: int) -> None:
        nonlocal pages
        pages += 1
        if pages == 2:
            bar.start()
        bar.update(task, completed=count)

    try:
        yield advance
    finally:
        bar.stop()


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
        out.write(row_line(row))
    out.flush()
    if page.next_before is None:
        print("start of the conversation", file=sys.stderr)
    else:
        print(f"next page: --before {shlex.quote(str(page.next_before))}", file=sys.stderr)
