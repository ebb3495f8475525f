"""Serialising one principal's rooms and logical messages across PostgreSQL sessions.

Several processes may write for one principal at once on PostgreSQL, and READ COMMITTED
lets two transactions each miss what the other is writing. Two transaction-scoped
advisory locks close that:

- the room's membership lock, on (principal, room): every write that checks the epoch
  (admission, hydration chunks, refetch installs, enqueue, consumer claims, coverage)
  takes it shared, an epoch advance takes it exclusively, so an admission that read the
  old epoch can never commit a projection row after the advance dropped them;
- one lock per logical message, on (principal, room, event id): an original and its
  early edit can otherwise each miss the other and leave the edit held forever. They
  are taken in sorted key order, so two transactions never wait on each other in
  opposite orders.

SQLite needs neither: its single writer already runs one write transaction at a time,
so every function here returns without a statement there.
"""

from __future__ import annotations

from collections.abc import Iterable

from gapline.storage import Dialect, Tx

__all__ = ["lock_messages", "lock_room", "message_lock_statements"]

# The statements hash a text key into PostgreSQL's 64-bit advisory lock space.
_SHARED = "pg_advisory_xact_lock_shared(hashtextextended(?, 0))"
_EXCLUSIVE = "pg_advisory_xact_lock(hashtextextended(?, 0))"
_BATCH = 500  # locks per statement: a hydration chunk may name thousands


def _room_key(p: str, room_id: str) -> str:
    return f"m {p} {room_id}"


def lock_room(tx: Tx, p: str, room_id: str, *, exclusive: bool) -> None:
    """The room's membership lock: shared to check the epoch, exclusive to advance it."""
    if tx.dialect is not Dialect.POSTGRES:
        return
    tx.one(f"SELECT {_EXCLUSIVE if exclusive else _SHARED}", (_room_key(p, room_id),))


def lock_messages(
    tx: Tx, p: str, room_id: str, event_ids: Iterable[str], *, room_shared: bool = False
) -> None:
    """The locks of these logical messages (and first, with ``room_shared``, the room's
    shared membership lock).

    They must be statements of their own: a READ COMMITTED statement's snapshot predates
    any lock it waits for, so the checks that rely on the locks come in later statements
    (``tx.one_after`` may still carry both in one round trip: see
    :func:`message_lock_statements`).
    """
    if tx.dialect is not Dialect.POSTGRES:
        return
    for statement in message_lock_statements(p, room_id, event_ids, room_shared=room_shared):
        tx.one(*statement)


def message_lock_statements(
    p: str, room_id: str, event_ids: Iterable[str], *, room_shared: bool = False
) -> list[tuple[str, tuple[str, ...]]]:
    """The PostgreSQL statements :func:`lock_messages` runs, for ``tx.one_after``."""
    calls: list[str] = []
    keys: list[str] = []
    if room_shared:
        calls.append(_SHARED)
        keys.append(_room_key(p, room_id))
    for key in sorted({f"e {p} {room_id} {e}" for e in event_ids}):
        calls.append(_EXCLUSIVE)
        keys.append(key)
    return [
        ("SELECT " + ", ".join(calls[start : start + _BATCH]), tuple(keys[start : start + _BATCH]))
        for start in range(0, len(calls), _BATCH)
    ]
