"""A room's membership epoch as every epoch-checked operation reads it.

Its own module because every rule module reads it (admission, projection, the
outbox, approvals, consumer claims) while only ``_membership`` advances it: the
readers must not import the module whose advance reconciles their own tables.
"""

from __future__ import annotations

from gapline.storage import Tx

__all__ = ["current_epoch"]


def current_epoch(tx: Tx, p: str, room_id: str) -> int:
    """The room's epoch for principal ``p`` (0 until its first departure)."""
    row = tx.one(
        "SELECT epoch FROM journal_membership WHERE principal_id = ? AND room_id = ?",
        (p, room_id),
    )
    return 0 if row is None else int(row[0])
