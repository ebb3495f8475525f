"""History recovery records: a room whose recent history sync could not prove continuous.

When a limited sync left events out and the timeline completion could not page all of
them back (its request budget ran out, or the homeserver failed), ingress writes that
down before it moves the sync token past the hole. The record is the room's
conversations going cold again: their hydration coverage is dropped, so the next read
hydrates them through the shared, bounded hydrator. Nothing scans for holes and nothing
repairs in the background; the only repair of projected content stays the point refetch.
"""

from __future__ import annotations

from gapline.storage import Tx

__all__ = ["record_history_gap"]


def record_history_gap(tx: Tx, p: str, room_id: str) -> int:
    """Every conversation of the room is cold again; returns how many were covered."""
    return tx.execute(
        "DELETE FROM journal_coverage WHERE principal_id = ? AND room_id = ?", (p, room_id)
    )
