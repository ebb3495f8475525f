"""The ``journal_events`` row: what admission writes and the pending worker reads back.

A context-only row keeps only the identity needed to deduplicate and is stored
settled: the journal is not a cache of raw history. An actionable row keeps its exact
replay input (``source``) until terminal settlement clears it.

``settled`` is 0 while pending, 1 once settled by its consumer, 2 once force-settled
by a membership fence, 3 for a decryption failure waiting for its room key (retained,
never pending: it enqueues no answer; ``_decryption`` upgrades it in place). There is no durable "running" state: a crash leaves the event
pending, so it is offered again.
"""

from __future__ import annotations

from typing import Any

from gapline.journal._types import (
    EventKind,
    InboundEvent,
    PendingEvent,
    Provenance,
    decode_thread_id,
    encode_thread_id,
)

__all__ = [
    "AWAITING_KEY",
    "AWAITING_KEY_BEFORE_JOIN",
    "EPOCH_CHECKED_INSERT",
    "EVENT_COLUMNS",
    "journal_insert",
    "pending_event",
]

AWAITING_KEY = 3
"""``settled`` of a retained decryption failure: not pending, its ciphertext kept."""
AWAITING_KEY_BEFORE_JOIN = 4
"""The same, for a failure from before our join: its upgrade is context only (the rule
that the joining sync's earlier timeline is context must hold when its key comes late)."""

EPOCH_CHECKED_INSERT = (
    "INSERT INTO journal_events (principal_id, event_id, room_id, thread_id, sender,"
    " origin_server_ts, type, kind, provenance, epoch, redacts, resolved_text, source,"
    " settled) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " WHERE COALESCE((SELECT epoch FROM journal_membership"
    " WHERE principal_id = ? AND room_id = ?), 0) = ?"
    " ON CONFLICT (principal_id, event_id) DO NOTHING RETURNING seq"
)
"""The journal insert with the membership-epoch check riding in it: one statement on
the hot path, returning the receipt order (``seq``), or no row when the epoch moved or
the event is a duplicate. Both admission forms run it (see ``_admission``); its
parameters come from :func:`journal_insert`."""


def _awaiting(event: InboundEvent) -> int:
    return AWAITING_KEY_BEFORE_JOIN if event.before_join else AWAITING_KEY


def journal_insert(p: str, event: InboundEvent, epoch: int) -> tuple[str, tuple[Any, ...], bool]:
    """What admitting ``event`` writes: its thread id in storage form, the parameters of
    :data:`EPOCH_CHECKED_INSERT`, and whether it becomes pending (and so wakes the
    pending worker). A context-only row is stored settled, without its payload."""
    thread = encode_thread_id(event.thread_id)
    context_only = event.kind is EventKind.CONTEXT_ONLY
    undecrypted = event.kind is EventKind.DECRYPTION_FAILURE
    content = event.content
    source = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    params = (
        p,
        event.event_id,
        event.room_id,
        thread,
        event.sender,
        event.origin_server_ts,
        event.type,
        event.kind.value,
        event.provenance.value,
        epoch,
        event.redacts,
        None if context_only else event.resolved_text,
        None if context_only else source,
        1 if context_only else (_awaiting(event) if undecrypted else 0),
        p,
        event.room_id,
        epoch,
    )
    return thread, params, not (context_only or undecrypted)


EVENT_COLUMNS = (
    "seq, event_id, room_id, thread_id, sender, origin_server_ts, type, kind, provenance,"
    " epoch, redacts, resolved_text, source"
)


def pending_event(row: tuple) -> PendingEvent:
    """A row of :data:`EVENT_COLUMNS` as the pending worker sees it."""
    (
        seq,
        event_id,
        room_id,
        thread,
        sender,
        ts,
        type_,
        kind,
        provenance,
        epoch,
        redacts,
        resolved,
        source,
    ) = row
    return PendingEvent(
        seq=int(seq),
        event=InboundEvent(
            event_id=event_id,
            room_id=room_id,
            thread_id=decode_thread_id(thread),
            sender=sender,
            origin_server_ts=int(ts),
            type=type_,
            content=b"" if source is None else bytes(source),
            kind=EventKind(kind),
            provenance=Provenance(provenance),
            redacts=redacts,
            resolved_text=resolved,
        ),
        epoch=int(epoch),
    )
