"""The visible-message projection: one row per logical message, latest visible body.

Pure parsing (:func:`parse_event`) plus the operations that write the projection inside
a transaction: admission (:func:`apply_projection`), hydration (:func:`project_chunk`,
:func:`publish_coverage`) and the point refetch (:func:`install_refetched`) all go
through this one reducer. Its reads are in ``_projection_reads``. The rules:

- a same-sender edit replaces the row only when ``(origin_server_ts, event_id)`` is
  newer than the current replacement identity (row-value comparison in SQL);
- an edit that precedes its original is held, one per (target, sender), so another
  sender's edit can never evict the author's; when the original arrives only its own
  sender's held edit may apply, then every held edit for the target is deleted;
- every redaction target is tombstoned before projection, so nothing arriving later
  resurrects it; redacting the original deletes the logical message; redacting the
  visible replacement clears the body and sets a refresh token in the same transaction
  (a redacted revision is never readable); a superseded replacement changes nothing;
- the bot's own streaming progress edits are never projected (progress is transport);
- a sidecar preview without its resolved full text is stored as a refresh debt, never
  as the body: the preview is no revision anyone wrote.

On PostgreSQL every operation on a logical message holds that message's lock (see
``_locks``); :func:`lock_ids` names the ones an event needs. Admission of an original
on PostgreSQL runs the same rule in one statement: ``_sql_postgres.ADMIT_ORIGINAL``,
twin of :data:`PROJECT_ORIGINAL` and :data:`SWEEP_HELD_EDITS` here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gapline.journal._epochs import current_epoch
from gapline.journal._locks import lock_messages, lock_room
from gapline.journal._progress import is_streaming_progress
from gapline.journal._sidecar import SIDECAR_KEY
from gapline.journal._types import (
    ChunkOutcome,
    ConversationKey,
    InboundEvent,
    Revision,
    encode_thread_id,
)
from gapline.storage import Tx

__all__ = [
    "APPLY_HELD_EDIT",
    "MAX_CHUNK_EVENTS",
    "PROJECT_ORIGINAL",
    "SWEEP_HELD_EDITS",
    "ParsedEvent",
    "ParsedKind",
    "apply_authors_held_edit",
    "apply_projection",
    "install_refetched",
    "lock_ids",
    "parse_content",
    "parse_event",
    "parse_inbound",
    "project_chunk",
    "publish_coverage",
    "refetched_body",
    "visible_body",
]

MAX_CHUNK_EVENTS = 1000
"""Bound of one :func:`project_chunk` transaction: hydration commits in bounded steps."""

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
    """The text the projection may store: for a sidecar preview, its resolved full text
    only (None, a refresh debt, while unresolved)."""
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


def parse_inbound(principal_id: str, event: InboundEvent) -> ParsedEvent:
    """:func:`parse_event` of an inbound envelope."""
    return parse_event(
        principal_id,
        sender=event.sender,
        type=event.type,
        content=event.content,
        redacts=event.redacts,
        resolved_text=event.resolved_text,
    )


# -- the reducer -----------------------------------------------------------------------


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


PROJECT_ORIGINAL = (
    "INSERT INTO journal_messages (principal_id, room_id, thread_id, created_ts,"
    " logical_event_id, sender, body, edited, rev_ts, rev_event_id, refresh_token)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, 0, 0, '', ? WHERE NOT EXISTS (SELECT 1 FROM journal_tombstones"
    " WHERE principal_id = ? AND room_id = ? AND event_id = ?) ON CONFLICT DO NOTHING"
)
"""An original's row, unless its event is tombstoned (the check rides in the insert:
one statement on the hot path) or already projected (hydration and sync both deliver).
PostgreSQL twin: the ``m`` step of ``_sql_postgres.ADMIT_ORIGINAL``."""

SWEEP_HELD_EDITS = (
    "DELETE FROM journal_held_edits WHERE principal_id = ? AND room_id = ? AND target_event_id = ?"
    " RETURNING sender, edit_ts, edit_event_id, body, refresh_token"
)
"""Every held edit of an original that was just projected goes, whoever sent it; the
rows come back for :func:`apply_authors_held_edit`. PostgreSQL twin: the ``h`` step of
``_sql_postgres.ADMIT_ORIGINAL``."""

APPLY_HELD_EDIT = (
    "UPDATE journal_messages SET body = ?, edited = 1, rev_ts = ?, rev_event_id = ?,"
    " refresh_token = ? WHERE principal_id = ? AND room_id = ? AND logical_event_id = ?"
)
"""The author's held edit becomes the visible revision (both admission forms run it)."""


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
    inserted = tx.execute(
        PROJECT_ORIGINAL,
        (p, room_id, thread_id, ts, event_id, sender, parsed.body, debt, p, room_id, event_id),
    )
    if inserted != 1:
        return
    held = tx.all(SWEEP_HELD_EDITS, (p, room_id, event_id))
    apply_authors_held_edit(tx, p, room_id, event_id, sender, held)


def apply_authors_held_edit(
    tx: Tx, p: str, room_id: str, event_id: str, sender: str, held: Iterable[Sequence[Any]]
) -> None:
    """Of the swept held edits (``SWEEP_HELD_EDITS`` rows), only the original's own
    sender's may apply."""
    for held_sender, edit_ts, edit_id, body, held_token in held:
        if held_sender == sender:
            tx.execute(
                APPLY_HELD_EDIT, (body, int(edit_ts), edit_id, held_token, p, room_id, event_id)
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


# -- hydration -----------------------------------------------------------------------------


def project_chunk(
    tx: Tx,
    p: str,
    room_id: str,
    events: Sequence[tuple[InboundEvent, ParsedEvent]],
    locks: Iterable[str],
    expected_epoch: int,
) -> ChunkOutcome:
    """Project one bounded chunk of fetched history in one epoch-checked transaction,
    through the same reducer as admission. Nothing is journaled: hydrated history is
    projected, never kept raw.

    ``locks`` are every message lock of the chunk at once, taken in the one global
    (sorted) order admission also uses, so a chunk and an admission never deadlock.
    """
    lock_messages(tx, p, room_id, locks, room_shared=True)
    if current_epoch(tx, p, room_id) != expected_epoch:
        return ChunkOutcome.STALE_EPOCH
    for event, parsed in events:
        if parsed.kind is ParsedKind.OTHER:
            continue
        apply_projection(
            tx,
            p,
            event_id=event.event_id,
            room_id=room_id,
            thread_id=encode_thread_id(event.thread_id),
            sender=event.sender,
            origin_server_ts=event.origin_server_ts,
            parsed=parsed,
            token=f"h{event.event_id}",
        )
    return ChunkOutcome.PROJECTED


def publish_coverage(
    tx: Tx, p: str, key: ConversationKey, reached_start: bool, messages: int, expected_epoch: int
) -> bool:
    """Hydration's final transaction: the coverage marker, published only once every
    chunk committed. False (nothing written) if the epoch moved."""
    lock_room(tx, p, key.room_id, exclusive=False)
    if current_epoch(tx, p, key.room_id) != expected_epoch:
        return False
    tx.execute(
        "INSERT INTO journal_coverage (principal_id, room_id, thread_id, epoch,"
        " reached_start, messages) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (principal_id, room_id, thread_id) DO UPDATE SET"
        " epoch = excluded.epoch, reached_start = excluded.reached_start,"
        " messages = excluded.messages",
        (
            p,
            key.room_id,
            encode_thread_id(key.thread_id),
            expected_epoch,
            int(reached_start),
            messages,
        ),
    )
    return True


# -- the point refetch ---------------------------------------------------------------------


def refetched_body(revision: Revision | None) -> str | None:
    """The body a refetched revision may install (pure: parsed before the transaction)."""
    if revision is None:
        return None
    visible = parse_content(revision.content)
    return None if visible is None else visible_body(visible, revision.resolved_text)


def install_refetched(
    tx: Tx,
    p: str,
    room_id: str,
    logical_event_id: str,
    revision: Revision | None,
    body: str | None,
    expected_epoch: int,
    expected_refresh_token: str,
) -> bool:
    """Install the server's revision only if the epoch and the exact token still match;
    a newer edit or redaction changed the token, so an older refetch cannot win."""
    lock_room(tx, p, room_id, exclusive=False)
    if current_epoch(tx, p, room_id) != expected_epoch:
        return False
    return _install_revision(
        tx,
        p,
        room_id=room_id,
        logical_event_id=logical_event_id,
        revision_event_id=None if revision is None else revision.event_id,
        revision_ts=0 if revision is None else revision.origin_server_ts,
        body=body,
        expected_token=expected_refresh_token,
    )


def _install_revision(
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
