"""Reads of the visible-message projection (written by ``_projection``).

Every conversation read is bounded: a positive limit and an optional stable cursor
``(created_ts, logical_event_id)``; no read materialises a whole room. A body-cleared
row (a redacted visible revision, an unresolved preview) is never served: a page
reports it as a refresh debt instead, for the point refetch to repair.
"""

from __future__ import annotations

from typing import Any

from gapline.journal._types import (
    ConversationKey,
    ConversationPage,
    ConversationRow,
    Coverage,
    Cursor,
    RefreshDebt,
    decode_thread_id,
    encode_thread_id,
)
from gapline.storage import Tx

__all__ = ["conversation_page", "conversation_rows", "coverage", "message", "refresh_debt"]


def conversation_rows(
    tx: Tx, p: str, room_id: str, thread_id: str | None, limit: int, before: Cursor | None
) -> list[tuple[Any, ...]]:
    """The newest ``limit`` rows strictly before ``before``, newest first (the raw rows:
    :func:`conversation_page` turns them into a page off the database thread)."""
    params: tuple[Any, ...] = (p, room_id, encode_thread_id(thread_id))
    sql = (
        "SELECT created_ts, logical_event_id, sender, body, edited, rev_event_id, refresh_token"
        " FROM journal_messages WHERE principal_id = ? AND room_id = ? AND thread_id = ?"
    )
    if before is not None:
        # A row-value comparison, so the index bounds the scan; the disjunctive form
        # filters instead (77 s against 0.38 s at 10^6 rows on SQLite, measured).
        sql += " AND (created_ts, logical_event_id) < (?, ?)"
        params += (before.created_ts, before.logical_event_id)
    sql += " ORDER BY created_ts DESC, logical_event_id DESC LIMIT ?"
    params += (limit,)
    return tx.all(sql, params)


def conversation_page(
    rows: list[tuple[Any, ...]], room_id: str, thread_id: str | None, limit: int
) -> ConversationPage:
    """The page of :func:`conversation_rows`: oldest first, body-cleared rows owed."""
    visible: list[ConversationRow] = []
    owed: list[RefreshDebt] = []
    for created_ts, event_id, sender, body, edited, rev_event_id, token in reversed(rows):
        if token is not None or body is None:
            owed.append(RefreshDebt(room_id, event_id, int(created_ts), str(token)))
            continue
        visible.append(
            ConversationRow(
                event_id=event_id,
                room_id=room_id,
                thread_id=thread_id,
                sender=sender,
                created_ts=int(created_ts),
                body=body,
                edited=bool(edited),
                revision_event_id=rev_event_id or event_id,
            )
        )
    next_before = Cursor(int(rows[-1][0]), rows[-1][1]) if len(rows) == limit else None
    return ConversationPage(tuple(visible), tuple(owed), next_before)


def message(tx: Tx, p: str, room_id: str, logical_event_id: str) -> ConversationRow | None:
    """One logical message, or None when absent, tombstoned or body-cleared."""
    row = tx.one(
        "SELECT thread_id, created_ts, sender, body, edited, rev_event_id, refresh_token"
        " FROM journal_messages WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?",
        (p, room_id, logical_event_id),
    )
    if row is None or row[3] is None or row[6] is not None:
        return None
    thread, created_ts, sender, body, edited, rev_event_id, _ = row
    return ConversationRow(
        event_id=logical_event_id,
        room_id=room_id,
        thread_id=decode_thread_id(thread),
        sender=sender,
        created_ts=int(created_ts),
        body=body,
        edited=bool(edited),
        revision_event_id=rev_event_id or logical_event_id,
    )


def coverage(tx: Tx, p: str, key: ConversationKey) -> Coverage | None:
    """What hydration published for this conversation, if anything."""
    row = tx.one(
        "SELECT epoch, reached_start, messages FROM journal_coverage"
        " WHERE principal_id = ? AND room_id = ? AND thread_id = ?",
        (p, key.room_id, encode_thread_id(key.thread_id)),
    )
    return None if row is None else Coverage(int(row[0]), bool(row[1]), int(row[2]))


def refresh_debt(tx: Tx, p: str, room_id: str, logical_event_id: str) -> RefreshDebt | None:
    """The refresh the logical message owes (its exact token), or None."""
    row = tx.one(
        "SELECT created_ts, refresh_token FROM journal_messages WHERE principal_id = ?"
        " AND room_id = ? AND logical_event_id = ? AND refresh_token IS NOT NULL",
        (p, room_id, logical_event_id),
    )
    return None if row is None else RefreshDebt(room_id, logical_event_id, int(row[0]), row[1])
