"""Decryption failures: retained until their room key arrives, then upgraded once.

An ``m.room.encrypted`` event the bot cannot decrypt is admitted with kind
``DECRYPTION_FAILURE``: journaled (so a redelivery deduplicates), not projected, and
stored with ``settled = AWAITING_KEY`` and its ciphertext as the source. It is not
pending: it enqueues no answer, and a membership fence does not retire it.

When the key arrives, :func:`upgrade` rewrites that same row (same event id, same
receipt order) into what the event is, in one transaction: kind, type, thread and the
decrypted source, ``upgraded_from = 'decryption_failure'``, then the projection and
(when it owes an answer) the pending wake-up, exactly as admission would have done.
The guard is the row's own state: only a row still awaiting its key is upgraded, so a
second key, a redelivered sync or a restart finds nothing to do (``DUPLICATE``).

A failure admitted from before our join (``before_join``: ``settled =
AWAITING_KEY_BEFORE_JOIN``) is upgraded as context whatever its decrypted kind: the
joining sync's earlier timeline is context, and a late key does not change that.

A row whose room was fenced since it was admitted (its admission epoch is not the
room's current one) is upgraded force-settled: it is recorded as what it is, never
projected into the new membership and never answered (``STALE_EPOCH``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gapline.journal._admission import project_admitted
from gapline.journal._epochs import current_epoch
from gapline.journal._events import (
    AWAITING_KEY,
    AWAITING_KEY_BEFORE_JOIN,
    EVENT_COLUMNS,
    pending_event,
)
from gapline.journal._locks import lock_messages
from gapline.journal._projection import ParsedEvent, lock_ids
from gapline.journal._types import AdmitOutcome, EventKind, InboundEvent, encode_thread_id
from gapline.storage import Tx

__all__ = ["undecrypted", "upgrade"]


def undecrypted(
    tx: Tx, p: str, room_ids: Sequence[str] | None, limit: int
) -> tuple[InboundEvent, ...]:
    """Retained decryption failures (their ciphertext as ``content``), oldest first; of
    ``room_ids`` only, or of every room when None. Index-covered (one partial index per
    awaiting state, so one query per state)."""
    rows = []
    for state in (AWAITING_KEY, AWAITING_KEY_BEFORE_JOIN):
        if room_ids is None:
            rows.extend(
                tx.all(
                    f"SELECT {EVENT_COLUMNS} FROM journal_events"
                    " WHERE principal_id = ? AND settled = ? ORDER BY seq LIMIT ?",
                    (p, state, limit),
                )
            )
            continue
        for room_id in dict.fromkeys(room_ids):
            rows.extend(
                tx.all(
                    f"SELECT {EVENT_COLUMNS} FROM journal_events WHERE principal_id = ?"
                    " AND room_id = ? AND settled = ? ORDER BY seq LIMIT ?",
                    (p, room_id, state, limit),
                )
            )
    rows.sort(key=lambda r: int(r[0]))
    return tuple(pending_event(r).event for r in rows[:limit])


def upgrade(
    tx: Tx, p: str, event: InboundEvent, parsed: ParsedEvent, pending_channel: str
) -> AdmitOutcome:
    """Turn the retained failure ``event.event_id`` into ``event`` (decrypted), once."""
    if event.kind is EventKind.DECRYPTION_FAILURE:
        raise ValueError("an upgrade needs the decrypted event's own kind")
    lock_messages(tx, p, event.room_id, lock_ids(parsed, event.event_id), room_shared=True)
    row = tx.one(
        "SELECT seq, epoch, settled FROM journal_events WHERE principal_id = ?"
        " AND event_id = ? AND settled IN (?, ?)",
        (p, event.event_id, AWAITING_KEY, AWAITING_KEY_BEFORE_JOIN),
    )
    if row is None:
        return AdmitOutcome.DUPLICATE
    seq, admitted_epoch = int(row[0]), int(row[1])
    if int(row[2]) == AWAITING_KEY_BEFORE_JOIN and event.kind is EventKind.ACTIONABLE:
        event = replace(event, kind=EventKind.CONTEXT_ONLY)
    fenced = current_epoch(tx, p, event.room_id) != admitted_epoch
    context_only = event.kind is EventKind.CONTEXT_ONLY
    keep = not (context_only or fenced)
    content = event.content
    source = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    thread = encode_thread_id(event.thread_id)
    tx.execute(
        "UPDATE journal_events SET thread_id = ?, type = ?, kind = ?, redacts = ?,"
        " resolved_text = ?, source = ?, settled = ?, upgraded_from = ?"
        " WHERE principal_id = ? AND seq = ?",
        (
            thread,
            event.type,
            event.kind.value,
            event.redacts,
            event.resolved_text if keep else None,
            source if keep else None,
            2 if fenced else (1 if context_only else 0),
            EventKind.DECRYPTION_FAILURE.value,
            p,
            seq,
        ),
    )
    if fenced:
        return AdmitOutcome.STALE_EPOCH
    project_admitted(tx, p, event, parsed, thread, seq)
    if not context_only:
        tx.notify(pending_channel, str(seq))
    return AdmitOutcome.ADMITTED
