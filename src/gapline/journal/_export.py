"""Export: a whole conversation, oldest first, as JSON lines or Markdown.

An export reads the projection through the same :class:`ConversationReader` a prompt
uses, never through a Matrix walk of its own: a second reducer would let an exported
thread and the history a model was shown disagree about which edit won or what a
redaction left behind. What differs is the bounds. A cold conversation is hydrated by
the reader's shared hydrator under the export's own, far larger bounds
(``EXPORT_WINDOW_MESSAGES``, ``EXPORT_MAX_FETCHED_EVENTS``,
``EXPORT_MAX_MESSAGES_REQUESTS``), a strict export repairs redacted revisions through
the shared point refetch, and the projection is then read forwards in explicit pages
of ``page_size``, each written out before the next is read: nothing holds more than one
page, however long the conversation.

A thread's export starts with its root (the message the thread is about), then its
replies. A reader without a homeserver (``gapline journal export``) exports what is
projected and says when that may not reach the conversation's start.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from gapline.journal._hydration import EXPORT_BOUNDS, HydrationBounds
from gapline.journal._reader import ConversationReader
from gapline.journal._types import ConversationKey, ConversationRow, Cursor

__all__ = ["EXPORT_PAGE_SIZE", "ExportFormat", "ExportSummary", "export_conversation", "row_line"]

EXPORT_PAGE_SIZE = 1000


class ExportFormat(enum.StrEnum):
    JSONL = "jsonl"
    MARKDOWN = "markdown"


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote, and what it could not vouch for."""

    messages: int
    omitted: int  # body-cleared rows left out (non-strict): redacted revisions, previews
    reached_start: bool | None  # the hydration coverage says so; None: never hydrated
    not_ready: str | None  # the hydration failed, and this is what was projected


def row_line(row: ConversationRow) -> str:
    """One row as a JSON line: what ``journal read`` prints and a JSON-lines export writes."""
    line = {
        "event_id": row.event_id,
        "sender": row.sender,
        "created_ts": row.created_ts,
        "thread_id": row.thread_id,
        "body": row.body,
        "edited": row.edited,
    }
    return json.dumps(line, ensure_ascii=False) + "\n"


def _markdown(row: ConversationRow) -> str:
    when = datetime.fromtimestamp(row.created_ts / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    edited = " (edited)" if row.edited else ""
    return f"**{row.sender}** · {when}{edited}\n\n{row.body}\n\n"


def _heading(key: ConversationKey) -> str:
    where = key.room_id if key.thread_id is None else f"{key.room_id}, thread {key.thread_id}"
    return f"# Conversation in {where}\n\n"


async def export_conversation(
    reader: ConversationReader,
    key: ConversationKey,
    write: Callable[[str], object],
    *,
    format: ExportFormat = ExportFormat.JSONL,
    strict: bool = False,
    page_size: int = EXPORT_PAGE_SIZE,
    bounds: HydrationBounds = EXPORT_BOUNDS,
    progress: Callable[[int], object] | None = None,
) -> ExportSummary:
    """Write ``key``'s conversation, oldest first, one page at a time.

    ``write`` takes each piece of text as it is ready; ``progress`` the running count
    of messages after each page. A strict export raises ``StaleConversation`` or
    ``ConversationNotReady`` rather than leave anything out.
    """
    render = row_line if format is ExportFormat.JSONL else _markdown
    if format is ExportFormat.MARKDOWN:
        write(_heading(key))
    written = omitted = 0
    not_ready: str | None = None
    cursor: Cursor | None = Cursor.start()
    first = True
    while cursor is not None:
        # Only the first page may walk the server, with the export's bounds; the pages
        # after it read what that walk published (a walk stopped at a ceiling is not
        # walked again for every page).
        page = await reader.read(
            key, limit=page_size, after=cursor, strict=strict, bounds=bounds if first else None
        )
        not_ready = not_ready or page.not_ready
        owed = [d for d in page.owing_refresh if d.logical_event_id != key.thread_id]
        if first:
            if page.root is not None:
                write(render(page.root))
                written += 1
            elif len(owed) < len(page.owing_refresh):
                omitted += 1  # the root itself is body-cleared
        first = False
        for row in page.rows:
            write(render(row))
        written += len(page.rows)
        omitted += len(owed)
        cursor = page.next_after
        if progress is not None:
            progress(written)
    coverage = await reader.view.coverage(key)
    return ExportSummary(
        messages=written,
        omitted=omitted,
        reached_start=None if coverage is None else coverage.reached_start,
        not_ready=not_ready,
    )
