"""The journal's PostgreSQL-only statements: faster or stricter forms of generic rules.

Each statement here restates a rule whose generic form (run by SQLite, and by
PostgreSQL where no form here applies) lives in the module of that rule. Each names its
twin, and the twin names it back; ``tests/journal/test_sql_twins.py`` runs both forms
on PostgreSQL over the same inputs and fails when their results differ. Change one
twin, change the other.

- :data:`ADMIT_ORIGINAL` / :func:`admit_in_one_statement`: admission of an original (or
  of an event the projection ignores) in one statement. Twin: ``_admission.admit_in_steps``.
  Round trips, not CPU, bound PostgreSQL admission.
- :data:`CLAIM_DELIVERIES_FOR_UPDATE`: the outbox claim, locking the rows it picks so a
  concurrent fence either deletes a row before the claim locks it or finds it
  attempted. Twin: ``_outbox.CLAIM_DELIVERIES``.

The advisory locks that serialise PostgreSQL sessions have no generic twin (SQLite's
single writer serialises already): they are in ``_locks``.
"""

from __future__ import annotations

import json
from typing import Any

from gapline.journal._events import EPOCH_CHECKED_INSERT
from gapline.journal._locks import message_lock_statements
from gapline.journal._projection import (
    ParsedEvent,
    ParsedKind,
    apply_authors_held_edit,
    lock_ids,
)
from gapline.journal._types import InboundEvent
from gapline.storage import Tx

__all__ = ["ADMIT_ORIGINAL", "CLAIM_DELIVERIES_FOR_UPDATE", "admit_in_one_statement"]

ADMIT_ORIGINAL = (
    # j: the journal row, epoch-checked (the very statement the generic form runs)
    f"WITH j AS ({EPOCH_CHECKED_INSERT}),"
    # m: the projection row, for an original not tombstoned
    #    (twin: _projection.PROJECT_ORIGINAL, with its refresh debt derived from j.seq)
    " m AS ("
    " INSERT INTO journal_messages (principal_id, room_id, thread_id, created_ts,"
    " logical_event_id, sender, body, edited, rev_ts, rev_event_id, refresh_token)"
    " SELECT ?, ?, ?, ?, ?, ?, ?::text, 0, 0, '',"
    " CASE WHEN ?::text IS NULL THEN 'r' || j.seq::text END FROM j"
    " WHERE ?::boolean AND NOT EXISTS (SELECT 1 FROM journal_tombstones"
    " WHERE principal_id = ? AND room_id = ? AND event_id = ?)"
    " ON CONFLICT DO NOTHING RETURNING 1 AS one),"
    # h: every held edit of this target goes once the original is in
    #    (twin: _projection.SWEEP_HELD_EDITS)
    " h AS ("
    " DELETE FROM journal_held_edits WHERE principal_id = ? AND room_id = ?"
    " AND target_event_id = ? AND EXISTS (SELECT 1 FROM m)"
    " RETURNING sender, edit_ts, edit_event_id, body, refresh_token),"
    # n: the wake-up, for events that become pending (twin: tx.notify, which is
    #    pg_notify too: transactional, dropped with a rolled-back savepoint)
    " n AS (SELECT pg_notify(?, j.seq::text) FROM j WHERE ?::boolean)"
    " SELECT (SELECT seq FROM j), (SELECT count(*) FROM n),"
    " (SELECT json_agg(json_build_array(sender, edit_ts, edit_event_id, body,"
    " refresh_token)) FROM h)"
)
"""Journal insert, projection insert, held-edit sweep and wake-up in one statement
(data-modifying CTEs). Returns the receipt ``seq`` (NULL when refused), the number of
notifications, and the swept held edits as JSON."""


def admit_in_one_statement(
    tx: Tx,
    p: str,
    event: InboundEvent,
    parsed: ParsedEvent,
    thread: str,
    journal_params: tuple[Any, ...],
    pending_channel: str,
    wake: bool,
) -> int | None:
    """:data:`ADMIT_ORIGINAL`, behind the message locks and the deferred BEGIN/SAVEPOINT:
    one round trip. The receipt order, or None when the insert was refused.

    Only for an ``ORIGINAL`` or ``OTHER`` event (edits and redactions take the generic
    form). Twin: ``_admission.admit_in_steps``, with the same arguments.
    """
    assert parsed.kind in (ParsedKind.ORIGINAL, ParsedKind.OTHER)
    room_id = event.room_id
    # The locks are their own statements (see _locks.lock_messages), sent in the same
    # round trip: the CTE's snapshot is taken only after they were granted.
    row = tx.one_after(
        message_lock_statements(p, room_id, lock_ids(parsed, event.event_id), room_shared=True),
        ADMIT_ORIGINAL,
        (
            *journal_params,
            # m
            p,
            room_id,
            thread,
            event.origin_server_ts,
            event.event_id,
            event.sender,
            parsed.body,
            parsed.body,
            parsed.kind is ParsedKind.ORIGINAL,
            p,
            room_id,
            event.event_id,
            # h
            p,
            room_id,
            event.event_id,
            # n
            pending_channel,
            wake,
        ),
    )
    assert row is not None
    seq, _notified, held = row
    if seq is None:
        return None
    if held:
        held_rows = json.loads(held) if isinstance(held, str) else held
        apply_authors_held_edit(tx, p, room_id, event.event_id, event.sender, held_rows)
    return int(seq)


CLAIM_DELIVERIES_FOR_UPDATE = (
    "UPDATE journal_outbox SET attempted = 1 WHERE seq IN ("
    " SELECT seq FROM journal_outbox WHERE principal_id = ? AND acked_event_id IS NULL"
    " ORDER BY seq LIMIT ? FOR UPDATE) RETURNING seq, turn_id, delivery_id, stage, room_id,"
    " thread_id, event_type, content, txn_id, attempted, purpose"
)
"""Twin: ``_outbox.CLAIM_DELIVERIES`` (the same claim, without the row locks)."""
