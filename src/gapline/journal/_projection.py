"""The visible-message projection: one row per logical message, latest visible body.

Pure parsing (:func:`parse_event`) plus operations on an open transaction, shared by
admission, hydration and the point refetch so there is exactly one reducer. The rules
are the seed's "Visible-message projection" and "Redaction" sections:

- a same-sender edit replaces the row only when ``(origin_server_ts, event_id)`` is
  newer than the current replacement identity (row-value comparison in SQL);
- an edit that precedes its original is held, one per (target, sender); when the
  original arrives only its own sender's held edit may apply, then every held edit for
  the target is deleted;
- every redaction target is tombstoned before projection; redacting the original
  deletes the logical message; redacting the visible replacement clears the body and
  sets a refresh token in the same transaction; a superseded replacement changes nothing;
- a self-authored streaming progress edit is never projected (contract 4);
- a sidecar preview without resolved text is stored as a refresh debt (contract 10).

Concurrency on PostgreSQL: several processes may admit for one principal at once, and
READ COMMITTED would let an original and its early edit each miss the other (the edit
held forever). Every operation on a logical message therefore takes a transaction-scoped
advisory lock keyed by (principal, room, event id), in sorted key order so two
transactions never wait on each other in opposite orders. SQLite has one writer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgspec

from gapline.journal._progress import is_streaming_progress
from gapline.storage import Dialect, Tx

__all__ = [
    "SIDECAR_KEY",
    "ParsedEvent",
    "ParsedKind",
    "apply_projection",
    "install_revision",
    "lock_ids",
    "lock_messages",
    "parse_content",
    "parse_event",
    "visible_body",
]

SIDECAR_KEY = "io.gapline.sidecar"
"""Key in visible content marking a preview whose full text lives in a sidecar."""

_decoder = msgspec.json.Decoder()


class ParsedKind(enum.Enum):
    ORIGINAL = "original"
    EDIT = "edit"
    REDACTION = "redaction"
    OTHER = "other"  # journaled, never projected (reactions, state, progress edits, junk)


@dataclass(frozen=True, slots=True)
class ParsedEvent:
    kind: ParsedKind
    target: str | None = None  # edit or redaction target
    body: str | None = None  # visible body; None means a refresh debt (unresolved sidecar)


_OTHER = ParsedEvent(ParsedKind.OTHER)


def parse_content(content: str | bytes) -> dict[str, Any] | None:
    """Matrix content as a dict, or None when it is not a JSON object."""
    try:
        value = _decoder.decode(content)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def visible_body(visible: dict[str, Any], resolved_text: str | None) -> str | None:
    """The text the projection may store: resolved full text only (contract 10)."""
    if SIDECAR_KEY in visible:
        return resolved_text
    body = visible.get("body")
    return body if isinstance(body, str) else ""


def parse_event(
    principal_id: str,
    *,
    sender: str,
    type: str,
    content: str | bytes,
    redacts: str | None,
    resolved_text: str | None,
) -> ParsedEvent:
    """Classify one event for the projection (pure)."""
    if type == "m.room.redaction":
        target = redacts
        if target is None:
            parsed = parse_content(content)
            candidate = parsed.get("redacts") if parsed is not None else None
            target = candidate if isinstance(candidate, str) else None
        return ParsedEvent(ParsedKind.REDACTION, target=target) if target else _OTHER
    if type != "m.room.message":
        return _OTHER
    parsed = parse_content(content)
    if parsed is None:
        return _OTHER
    relation = parsed.get("m.relates_to")
    rel_type = relation.get("rel_type") if isinstance(relation, dict) else None
    if rel_type == "m.replace":
        target = relation.get("event_id") if isinstance(relation, dict) else None
        visible = parsed.get("m.new_content")
        if not isinstance(target, str) or not isinstance(visible, dict):
            return _OTHER
        if is_streaming_progress(
            principal_id=principal_id, sender=sender, rel_type=rel_type, visible_content=visible
        ):
            return _OTHER
        return ParsedEvent(
            ParsedKind.EDIT, target=target, body=visible_body(visible, resolved_text)
        )
    return ParsedEvent(ParsedKind.ORIGINAL, body=visible_body(parsed, resolved_text))


# -- transaction operations -------------------------------------------------------------


def lock_ids(parsed: ParsedEvent, event_id: str) -> tuple[str, ...]:
    """The logical-message locks projecting this event needs."""
    if parsed.kind is ParsedKind.ORIGINAL:
        return (event_id,)
    if parsed.kind is ParsedKind.EDIT:
        assert parsed.target is not None
        return (parsed.target, event_id)
    if parsed.kind is ParsedKind.REDACTION:
        assert parsed.target is not None
        return (parsed.target,)
    return ()


def lock_messages(
    tx: Tx,
    principal_id: str,
    room_id: str,
    event_ids: tuple[str, ...],
    *,
    room_shared: bool = False,
) -> None:
    """Serialise operations on these logical messages across PostgreSQL sessions.

    One round trip: with ``room_shared`` it first takes the room's shared membership
    lock (see ``_membership.lock_room``), then the message locks in sorted key order.
    It must be its own statement: a READ COMMITTED statement's snapshot predates any
    lock it waits for, so the checks that rely on the lock come in later statements
    (``tx.one_after`` may still carry both in one round trip).
    """
    if tx.dialect is not Dialect.POSTGRES:
        return
    for statement in lock_statements(principal_id, room_id, event_ids, room_shared=room_shared):
        tx.one(*statement)


def lock_statements(
    principal_id: str,
    room_id: str,
    event_ids: tuple[str, ...],
    *,
    room_shared: bool = False,
) -> list[tuple[str, tuple[str, ...]]]:
    """The PostgreSQL statements :func:`lock_messages` runs, for ``tx.one_after``."""
    calls: list[str] = []
    keys: list[str] = []
    if room_shared:
        calls.append("pg_advisory_xact_lock_shared(hashtextextended(?, 0))")
        keys.append(f"m {principal_id} {room_id}")
    for key in sorted({f"e {principal_id} {room_id} {e}" for e in event_ids}):
        calls.append("pg_advisory_xact_lock(hashtextextended(?, 0))")
        keys.append(key)
    return [  # a hydration chunk may name thousands
        ("SELECT " + ", ".join(calls[start : start + 500]), tuple(keys[start : start + 500]))
        for start in range(0, len(calls), 500)
    ]


def _tombstoned(tx: Tx, p: str, room_id: str, *event_ids: str) -> bool:
    if len(event_ids) == 1:
        sql = "SELECT 1 FROM journal_tombstones WHERE principal_id = ? AND room_id = ? AND event_id = ?"
    else:
        marks = ", ".join("?" for _ in event_ids)
        sql = f"SELECT 1 FROM journal_tombstones WHERE principal_id = ? AND room_id = ? AND event_id IN ({marks}) LIMIT 1"
    return tx.one(sql, (p, room_id, *event_ids)) is not None


def apply_projection(
    tx: Tx,
    p: str,
    *,
    event_id: str,
    room_id: str,
    thread_id: str,
    sender: str,
    origin_server_ts: int,
    parsed: ParsedEvent,
    token: str,
) -> None:
    """Apply one parsed event to the projection inside ``tx``.

    The caller holds the locks ``lock_ids(parsed, event_id)`` names (PostgreSQL).

    ``thread_id`` is the storage form. ``token`` is this event's refresh token, derived
    from its receipt order: set on a row whose visible revision it redacts, or that it
    leaves with an unresolved preview.
    """
    if parsed.kind is ParsedKind.ORIGINAL:
        _apply_original(
            tx, p, event_id, room_id, thread_id, sender, origin_server_ts, parsed, token
        )
    elif parsed.kind is ParsedKind.EDIT:
        assert parsed.target is not None
        _apply_edit(
            tx, p, event_id, room_id, sender, origin_server_ts, parsed.target, parsed.body, token
        )
    elif parsed.kind is ParsedKind.REDACTION:
        assert parsed.target is not None
        _apply_redaction(tx, p, event_id, room_id, parsed.target, token)


def _apply_original(
    tx: Tx,
    p: str,
    event_id: str,
    room_id: str,
    thread_id: str,
    sender: str,
    ts: int,
    parsed: ParsedEvent,
    token: str,
) -> None:
    debt = None if parsed.body is not None else token
    # The tombstone check rides in the insert: one statement on the hot path.
    inserted = tx.execute(
        "INSERT INTO journal_messages (principal_id, room_id, thread_id, created_ts,"
        " logical_event_id, sender, body, edited, rev_ts, rev_event_id, refresh_token)"
        " SELECT ?, ?, ?, ?, ?, ?, ?, 0, 0, '', ? WHERE NOT EXISTS (SELECT 1 FROM journal_tombstones"
        " WHERE principal_id = ? AND room_id = ? AND event_id = ?) ON CONFLICT DO NOTHING",
        (p, room_id, thread_id, ts, event_id, sender, parsed.body, debt, p, room_id, event_id),
    )
    if inserted != 1:
        return  # redacted already, or already projected (hydration and sync both deliver)
    # Every held edit for this target goes, whoever sent it: only the author's may apply.
    held = tx.all(
        "DELETE FROM journal_held_edits WHERE principal_id = ? AND room_id = ? AND target_event_id = ?"
        " RETURNING sender, edit_ts, edit_event_id, body, refresh_token",
        (p, room_id, event_id),
    )
    for held_sender, edit_ts, edit_id, body, held_token in held:
        if held_sender == sender:
            tx.execute(
                "UPDATE journal_messages SET body = ?, edited = 1, rev_ts = ?, rev_event_id = ?,"
                " refresh_token = ? WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?",
                (body, edit_ts, edit_id, held_token, p, room_id, event_id),
            )


def _apply_edit(
    tx: Tx,
    p: str,
    event_id: str,
    room_id: str,
    sender: str,
    ts: int,
    target: str,
    body: str | None,
    token: str,
) -> None:
    if _tombstoned(tx, p, room_id, target, event_id):
        return
    debt = None if body is not None else token
    row = tx.one(
        "SELECT sender FROM journal_messages"
        " WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?",
        (p, room_id, target),
    )
    if row is not None:
        if row[0] != sender:
            return  # edits by another sender never change a message
        tx.execute(
            "UPDATE journal_messages SET body = ?, edited = 1, rev_ts = ?, rev_event_id = ?,"
            " refresh_token = ? WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?"
            " AND (rev_ts, rev_event_id) < (?, ?)",
            (body, ts, event_id, debt, p, room_id, target, ts, event_id),
        )
        return
    tx.execute(
        "INSERT INTO journal_held_edits (principal_id, room_id, target_event_id, sender,"
        " edit_ts, edit_event_id, body, refresh_token) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (principal_id, room_id, target_event_id, sender) DO UPDATE SET"
        " edit_ts = excluded.edit_ts, edit_event_id = excluded.edit_event_id,"
        " body = excluded.body, refresh_token = excluded.refresh_token"
        " WHERE (journal_held_edits.edit_ts, journal_held_edits.edit_event_id)"
        " < (excluded.edit_ts, excluded.edit_event_id)",
        (p, room_id, target, sender, ts, event_id, body, debt),
    )


def _apply_redaction(
    tx: Tx, p: str, redaction_id: str, room_id: str, target: str, token: str
) -> None:
    # The tombstone comes first: a later original or edit of the target finds it.
    tx.execute(
        "INSERT INTO journal_tombstones (principal_id, room_id, event_id, redaction_event_id)"
        " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (p, room_id, target, redaction_id),
    )
    # The original: the logical message is gone.
    tx.execute(
        "DELETE FROM journal_messages WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?",
        (p, room_id, target),
    )
    tx.execute(
        "DELETE FROM journal_held_edits WHERE principal_id = ? AND room_id = ? AND target_event_id = ?",
        (p, room_id, target),
    )
    # A held (early) edit: it may never apply.
    tx.execute(
        "DELETE FROM journal_held_edits WHERE principal_id = ? AND room_id = ? AND edit_event_id = ?",
        (p, room_id, target),
    )
    # The visible replacement: clear the body now, owe a refresh. A superseded
    # replacement is no row's rev_event_id, so this changes nothing for it.
    tx.execute(
        "UPDATE journal_messages SET body = NULL, refresh_token = ?"
        " WHERE principal_id = ? AND room_id = ? AND rev_event_id = ? AND edited = 1",
        (token, p, room_id, target),
    )


def install_revision(
    tx: Tx,
    p: str,
    *,
    room_id: str,
    logical_event_id: str,
    revision_event_id: str | None,
    revision_ts: int,
    body: str | None,
    expected_token: str,
) -> bool:
    """Install a refetched revision if the row still owes exactly ``expected_token``.

    ``revision_event_id`` None means the server holds no visible revision: the logical
    message is tombstoned. The caller has checked the membership epoch.
    """
    lock_messages(tx, p, room_id, (logical_event_id,))
    row = tx.one(
        "SELECT refresh_token FROM journal_messages"
        " WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?",
        (p, room_id, logical_event_id),
    )
    if row is None or row[0] != expected_token:
        return False
    if revision_event_id is None:
        tx.execute(
            "INSERT INTO journal_tombstones (principal_id, room_id, event_id, redaction_event_id)"
            " VALUES (?, ?, ?, '') ON CONFLICT DO NOTHING",
            (p, room_id, logical_event_id),
        )
        tx.execute(
            "DELETE FROM journal_messages WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?",
            (p, room_id, logical_event_id),
        )
        return True
    if body is None or _tombstoned(tx, p, room_id, revision_event_id):
        return False  # still unresolved, or a revision this journal saw redacted
    edited = revision_event_id != logical_event_id
    return (
        tx.execute(
            "UPDATE journal_messages SET body = ?, edited = ?, rev_ts = ?, rev_event_id = ?,"
            " refresh_token = NULL WHERE principal_id = ? AND room_id = ?"
            " AND logical_event_id = ? AND refresh_token = ?",
            (
                body,
                1 if edited else 0,
                revision_ts if edited else 0,
                revision_event_id if edited else "",
                p,
                room_id,
                logical_event_id,
                expected_token,
            ),
        )
        == 1
    )
