"""The pending worker's side of the journal: receipt order, consumer claims, settlement.

Committed events are offered in durable receipt order (``seq``) and stay pending until
terminally settled; cancellation or failure leaves them pending, so a restart offers
them again. Settlement clears the replay input.

A semantic consumer (an interactive reaction, say) claims a pending event first; the
claim is fenced by the membership epoch the event was admitted under.
"""

from __future__ import annotations

from gapline.journal._epochs import current_epoch
from gapline.journal._events import EVENT_COLUMNS, pending_event
from gapline.journal._locks import lock_room
from gapline.journal._types import ConsumerClaim, PendingEvent, UnknownEvent
from gapline.storage import Tx

__all__ = ["claim_consumer", "pending", "settle"]


def pending(tx: Tx, p: str, limit: int, after: int | None) -> tuple[PendingEvent, ...]:
    """Up to ``limit`` unsettled events in durable receipt order, after ``after``."""
    if after is None:
        rows = tx.all(
            f"SELECT {EVENT_COLUMNS} FROM journal_events"
            " WHERE principal_id = ? AND settled = 0 ORDER BY seq LIMIT ?",
            (p, limit),
        )
    else:
        rows = tx.all(
            f"SELECT {EVENT_COLUMNS} FROM journal_events"
            " WHERE principal_id = ? AND settled = 0 AND seq > ? ORDER BY seq LIMIT ?",
            (p, after, limit),
        )
    return tuple(pending_event(r) for r in rows)


def settle(tx: Tx, p: str, event_id: str) -> bool:
    """Terminal settlement: clears the replay input. False if already settled or unknown."""
    return (
        tx.execute(
            "UPDATE journal_events SET settled = 1, source = NULL, consumer = NULL"
            " WHERE principal_id = ? AND event_id = ? AND settled = 0",
            (p, event_id),
        )
        == 1
    )


def claim_consumer(tx: Tx, p: str, event_id: str, consumer: str) -> ConsumerClaim:
    """Claim a pending event for a semantic consumer (e.g. ``interactive_reaction``).

    A claim racing after a departure is rejected and settles the stale event against
    the new epoch, so it is not offered again.
    """
    row = tx.one(
        "SELECT room_id, epoch, settled FROM journal_events WHERE principal_id = ? AND event_id = ?",
        (p, event_id),
    )
    if row is None:
        raise UnknownEvent(event_id)
    room_id, epoch, settled = row
    if settled != 0:
        return ConsumerClaim.ALREADY_SETTLED
    lock_room(tx, p, room_id, exclusive=False)
    if current_epoch(tx, p, room_id) != int(epoch):
        tx.execute(
            "UPDATE journal_events SET settled = 2, source = NULL, consumer = NULL"
            " WHERE principal_id = ? AND event_id = ?",
            (p, event_id),
        )
        return ConsumerClaim.STALE_EPOCH
    tx.execute(
        "UPDATE journal_events SET consumer = ? WHERE principal_id = ? AND event_id = ?",
        (consumer, p, event_id),
    )
    return ConsumerClaim.CLAIMED
