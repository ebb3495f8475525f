"""``gapline journal read``: print a principal's projected conversation as JSON lines.

::

    gapline journal read --store DSN --principal @bot:example.org --room '!r:example.org' \\
        [--thread '$root'] [--limit 50] [--before '<created_ts>:<event_id>'] [--strict]

Oldest first: the newest N rows before the cursor (default: the newest N).
Each line is ``{"event_id", "sender", "created_ts", "thread_id", "body", "edited"}``;
pass the first line's ``created_ts:event_id`` as ``--before`` for the page before it.
A message whose visible revision was redacted is omitted, or, with
``--strict``, makes the read fail (exit 3): repairing it needs the homeserver,
which only the bot (or the Python API with a client) has.

Arguments are bounded before they reach the store (exit 2 otherwise): ``--limit``
is 1..10,000; IDs are at most 255 bytes (the Matrix limit) without control
characters; a cursor's ``created_ts`` is at most 19 ASCII digits within a 64-bit
integer.
"""

from __future__ import annotations

import argparse
import json
import sys

from gapline.journal._reader import ConversationReader, StaleConversation
from gapline.journal._store import JournalStore
from gapline.journal._types import ConversationKey, Cursor, InvalidCursor
from gapline.storage import StorageError

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    read = sub.add_parser("read", help="print a projected conversation as JSON lines")
    read.add_argument("--store", required=True, help="journal DSN (SQLite path or postgresql://)")
    read.add_argument("--principal", required=True, type=_matrix_id, help="the bot's Matrix ID")
    read.add_argument("--room", required=True, type=_matrix_id, help="room ID")
    read.add_argument("--thread", default=None, type=_matrix_id, help="thread root event ID")
    read.add_argument(
        "--limit", type=_positive_int, default=50, help=f"rows (default 50, at most {MAX_LIMIT})"
    )
    read.add_argument(
        "--before", default=None, type=_cursor_text, help="cursor <created_ts>:<event_id>"
    )
    read.add_argument(
        "--strict", action="store_true", help="fail instead of omitting redacted revisions"
    )


MAX_LIMIT = 10_000
"""Most rows one read prints."""

_MAX_ID_BYTES = 255
_MAX_TS = 2**63 - 1


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _positive_int(text: str) -> int:
    # Digits are counted before converting: int() of thousands of digits refuses.
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise argparse.ArgumentTypeError(f"not a whole number up to {MAX_LIMIT}: {_shown(text)}")
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be positive")
    if value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"at most {MAX_LIMIT}")
    return value


def _matrix_id(text: str) -> str:
    if len(text.encode("utf-8", "surrogatepass")) > _MAX_ID_BYTES:
        raise argparse.ArgumentTypeError(f"longer than {_MAX_ID_BYTES} bytes: {_shown(text)}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise argparse.ArgumentTypeError(f"holds a control character: {_shown(text)}")
    return text


def _cursor_text(text: str) -> str:
    ts, sep, event_id = text.partition(":")
    if sep and not (ts.isascii() and ts.isdigit() and len(ts) <= 19 and int(ts) <= _MAX_TS):
        raise argparse.ArgumentTypeError(
            f"created_ts must be a whole number below 2^63: {_shown(text)}"
        )
    _matrix_id(event_id)
    return text


async def run(args: argparse.Namespace) -> int:
    from gapline.storage import open_backend

    try:
        before = None if args.before is None else Cursor.parse(args.before)
    except InvalidCursor as exc:
        print(f"gapline journal read: {exc}", file=sys.stderr)
        return 2
    if args.thread == "":
        print("gapline journal read: --thread must not be empty", file=sys.stderr)
        return 2
    try:
        backend = await open_backend(args.store)
    except StorageError as exc:
        print(f"gapline journal read: cannot open {args.store}: {exc}", file=sys.stderr)
        return 1
    try:
        store = await JournalStore.open(backend)
        reader = ConversationReader(store.principal(args.principal))
        key = ConversationKey(args.room, args.thread)
        try:
            page = await reader.read(key, limit=args.limit, before=before, strict=args.strict)
        except StaleConversation as exc:
            print(f"gapline journal read: {exc}", file=sys.stderr)
            return 3
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
        return 0
    except StorageError as exc:
        print(f"gapline journal read: {exc}", file=sys.stderr)
        return 1
    finally:
        await backend.close()
