"""Admission: journal (or deduplicate), epoch-check and project one event, in one
transaction.

The caller returns to the sync loop only once that transaction committed, so a crash
in the gap redelivers the event rather than losing it. The membership-epoch check
rides in the journal insert; only a refused insert pays a second query, to tell a
stale epoch from a duplicate. A context-only event is projected here, from the
in-memory event, and journaled only as the identity needed to deduplicate. An event
that becomes pending wakes the pending worker, transactionally.

Two forms, one rule: :func:`admit_in_steps` (every event on SQLite; edits and
redactions on PostgreSQL) and its twin ``_sql_postgres.admit_in_one_statement``
(originals and unprojected events on PostgreSQL: one round trip).
"""

from __future__ import annotations

from typing import Any

from gapline.journal._epochs import current_epoch
from gapline.journal._events import EPOCH_CHECKED_INSERT, journal_insert
from gapline.journal._locks import lock_messages
from gapline.journal._projection import ParsedEvent, ParsedKind, apply_projection, lock_ids
from gapline.journal._sql_postgres import admit_in_one_statement
from gapline.journal._types import AdmitOutcome, InboundEvent
from gapline.storage import Dialect, Tx

__all__ = ["admit", "admit_in_steps", "project_admitted"]


def admit(
    tx: Tx, p: str, event: InboundEvent, epoch: int, parsed: ParsedEvent, pending_channel: str
) -> AdmitOutcome:
    """Admit ``event`` (``parsed`` is ``_projection.parse_inbound`` of it) under ``epoch``."""
    thread, params, wake = journal_insert(p, event, epoch)
    if tx.dialect is Dialect.POSTGRES and parsed.kind in (ParsedKind.ORIGINAL, ParsedKind.OTHER):
        seq = admit_in_one_statement(tx, p, event, parsed, thread, params, pending_channel, wake)
    else:
        seq = admit_in_steps(tx, p, event, parsed, thread, params, pending_channel, wake)
    if seq is None:
        if current_epoch(tx, p, event.room_id) != epoch:
            return AdmitOutcome.STALE_EPOCH
        return AdmitOutcome.DUPLICATE
    return AdmitOutcome.ADMITTED


def admit_in_steps(
    tx: Tx,
    p: str,
    event: InboundEvent,
    parsed: ParsedEvent,
    thread: str,
    journal_params: tuple[Any, ...],
    pending_channel: str,
    wake: bool,
) -> int | None:
    """The generic form: locks, epoch-checked insert, projection, wake-up. The receipt
    order, or None when the insert was refused.

    Twin: ``_sql_postgres.admit_in_one_statement``, with the same arguments.
    """
    lock_messages(tx, p, event.room_id, lock_ids(parsed, event.event_id), room_shared=True)
    row = tx.one(EPOCH_CHECKED_INSERT, journal_params)
    if row is None:
        return None
    seq = int(row[0])
    project_admitted(tx, p, event, parsed, thread, seq)
    if wake:
        tx.notify(pending_channel, str(seq))
    return seq


def project_admitted(
    tx: Tx, p: str, event: InboundEvent, parsed: ParsedEvent, thread: str, seq: int
) -> None:
    """The projection step of an admission (also of a decryption failure's upgrade):
    the event's refresh token derives from its receipt order."""
    if parsed.kind is not ParsedKind.OTHER:
        apply_projection(
            tx,
            p,
            event_id=event.event_id,
            room_id=event.room_id,
            thread_id=thread,
            sender=event.sender,
            origin_server_ts=event.origin_server_ts,
            parsed=parsed,
            token=f"r{seq}",
        )
