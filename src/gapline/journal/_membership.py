"""Membership epochs and the durable set of owed departure reports.

Every derived or pending fact is fenced by the room's membership epoch: a departure
advances it, and the advance drops or settles what was derived under the old one.

Each departure is applied exactly once, durably rather than in process: a LOCAL leave
advances the epoch and records one owed report in the same transaction; its REPORTED
echo retires one owed report instead of advancing again; a REPORTED departure with
nothing owed advances. An advance that raises rolls back whole (nothing owed is
recorded, so the echo advances), a restart finds the owed rows, and two leaves before
one echo owe two reports.

Every write that checks the epoch first takes the room's shared membership lock and
an advance takes it exclusively (``_locks``: PostgreSQL only, SQLite has one writer).

:class:`MembershipView` is the collaborator's slice (the eleventh view, beside the ten
of ``_views``): it lives with the rule it fences.
"""

from __future__ import annotations

from typing import Protocol

from gapline.journal import _approvals, _relations
from gapline.journal._locks import lock_room
from gapline.journal._sealing import Sealing
from gapline.journal._types import DepartureOutcome, DepartureSource
from gapline.storage import Tx

_CLEAR = Sealing()

__all__ = [
    "INTERACTIVE_REACTION",
    "MembershipView",
    "advance_epoch",
    "fence_departure",
    "retire_owed_departure_reports",
    "rooms_owing_departure_reports",
]

# Semantic consumer whose claimed reactions a fence sweeps with the turn-backed events.
INTERACTIVE_REACTION = "interactive_reaction"


class MembershipView(Protocol):
    """Membership fences, each departure applied exactly once across restarts."""

    async def epoch(self, room_id: str) -> int: ...

    async def fence_departure(
        self, room_id: str, *, source: DepartureSource, report_id: str | None = None
    ) -> DepartureOutcome: ...

    async def rooms_owing_departure_reports(self, limit: int = 1000) -> tuple[str, ...]: ...

    async def retire_owed_departure_reports(self, room_id: str) -> int: ...


def advance_epoch(tx: Tx, p: str, room_id: str, seal: Sealing = _CLEAR) -> int:
    """Advance the room's epoch and drop or settle every fact derived under the old one.

    The caller holds the exclusive room lock. Attempted-but-unacknowledged deliveries
    survive on purpose: their outcome is unknown, and keeping the frozen payload and
    transaction id makes a retry collapse onto the same event. Approval cards and
    continuations are reconciled across the principals holding them, the room's cards
    tombstoned and their fully acknowledged deliveries retired (``_approvals``), and
    interactive targets dropped (``_relations``).
    """
    row = tx.one(
        "INSERT INTO journal_membership (principal_id, room_id, epoch) VALUES (?, ?, 1)"
        " ON CONFLICT (principal_id, room_id) DO UPDATE SET epoch = journal_membership.epoch + 1"
        " RETURNING epoch",
        (p, room_id),
    )
    assert row is not None
    params = (p, room_id)
    tx.execute("DELETE FROM journal_messages WHERE principal_id = ? AND room_id = ?", params)
    tx.execute("DELETE FROM journal_held_edits WHERE principal_id = ? AND room_id = ?", params)
    tx.execute("DELETE FROM journal_coverage WHERE principal_id = ? AND room_id = ?", params)
    tx.execute(
        "DELETE FROM journal_outbox WHERE principal_id = ? AND room_id = ?"
        " AND acked_event_id IS NULL AND attempted = 0",
        params,
    )
    _approvals.reconcile_departure(tx, p, room_id, seal)
    _relations.drop_interactive(tx, p, room_id)
    # Force-settle turn-backed sources (and claimed interactive reactions) so the worker
    # does not offer them forever only for enqueue to refuse. Other kinds (redactions
    # above all) still owe real work and are left pending.
    tx.execute(
        "UPDATE journal_events SET settled = 2, source = NULL, consumer = NULL"
        " WHERE principal_id = ? AND settled = 0 AND room_id = ?"
        " AND (kind = 'actionable' OR (kind = 'reaction' AND consumer = ?))",
        (p, room_id, INTERACTIVE_REACTION),
    )
    return int(row[0])


def fence_departure(
    tx: Tx,
    p: str,
    room_id: str,
    source: DepartureSource,
    report_id: str | None = None,
    seal: Sealing = _CLEAR,
) -> DepartureOutcome:
    """Apply one departure. ``report_id`` (REPORTED only) is the event that reported it:
    recorded in this transaction, so a redelivery of that event does nothing."""
    lock_room(tx, p, room_id, exclusive=True)
    if report_id is not None:
        if source is not DepartureSource.REPORTED:
            raise ValueError("only a reported departure has a reporting event")
        fresh = tx.one(
            "INSERT INTO journal_reported_departures (principal_id, room_id, event_id)"
            " VALUES (?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1",
            (p, room_id, report_id),
        )
        if fresh is None:
            return DepartureOutcome.ALREADY_REPORTED
    if source is DepartureSource.REPORTED:
        owed = tx.one(
            "SELECT epoch FROM journal_owed_departures WHERE principal_id = ? AND room_id = ?"
            " ORDER BY epoch LIMIT 1",
            (p, room_id),
        )
        if owed is not None:
            tx.execute(
                "DELETE FROM journal_owed_departures"
                " WHERE principal_id = ? AND room_id = ? AND epoch = ?",
                (p, room_id, owed[0]),
            )
            return DepartureOutcome.ECHO_RETIRED
        advance_epoch(tx, p, room_id, seal)
        return DepartureOutcome.ADVANCED
    epoch = advance_epoch(tx, p, room_id, seal)
    tx.execute(
        "INSERT INTO journal_owed_departures (principal_id, room_id, epoch) VALUES (?, ?, ?)",
        (p, room_id, epoch),
    )
    return DepartureOutcome.ADVANCED_OWING_REPORT


def rooms_owing_departure_reports(tx: Tx, p: str, limit: int) -> tuple[str, ...]:
    """Rooms with a LOCAL departure whose REPORTED echo has not been seen."""
    rows = tx.all(
        "SELECT DISTINCT room_id FROM journal_owed_departures WHERE principal_id = ?"
        " ORDER BY room_id LIMIT ?",
        (p, limit),
    )
    return tuple(r[0] for r in rows)


def retire_owed_departure_reports(tx: Tx, p: str, room_id: str) -> int:
    """Drop every owed report for the room (its echo will never come); return how many."""
    return tx.execute(
        "DELETE FROM journal_owed_departures WHERE principal_id = ? AND room_id = ?",
        (p, room_id),
    )
