"""Events of ours that expect answers by relation: approval cards, interactive messages.

A reply or a reaction is an ordinary event until it relates to one of these; then it
is an answer to a card, or a reaction a turn asked for (``INTERACTIVE_REACTION``).
:func:`event_role` says which, for ingress (to admit an answer to a card as
``APPROVAL_REPLY``) and for the dispatcher (to route it). An unknown target in a room
where a card still waits for its event id is reported as such, so an answer that
raced its card's acknowledgement is held back rather than taken for a new message.

Interactive targets are derived under a membership: ``offer_reactions`` is refused
for a turn of an older epoch, and an epoch advance drops the room's targets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from gapline.journal._epochs import current_epoch
from gapline.journal._locks import lock_room
from gapline.journal._outbox import load_turn
from gapline.journal._types import EventRole, EventRoleKind, UnknownTurn
from gapline.storage import Tx

__all__ = ["drop_interactive", "event_role", "offer_reactions"]


def event_role(tx: Tx, p: str, room_id: str, event_id: str) -> EventRole | None:
    """What ``event_id`` is to ``p``: one of its cards, an interactive message, or None."""
    card = tx.one(
        "SELECT approval_id, turn_id FROM approval_cards"
        " WHERE principal_id = ? AND room_id = ? AND card_event_id = ?",
        (p, room_id, event_id),
    )
    if card is not None:
        return EventRole(EventRoleKind.APPROVAL_CARD, approval_id=card[0], turn_id=card[1])
    target = tx.one(
        "SELECT turn_id, keys FROM journal_interactive"
        " WHERE principal_id = ? AND room_id = ? AND target_event_id = ?",
        (p, room_id, event_id),
    )
    if target is not None:
        return EventRole(
            EventRoleKind.INTERACTIVE, turn_id=target[0], keys=tuple(json.loads(target[1]))
        )
    in_flight = tx.one(
        "SELECT c.approval_id FROM approval_cards c JOIN approval_continuations k"
        " ON k.principal_id = c.continuation_principal_id AND k.approval_id = c.approval_id"
        " WHERE c.principal_id = ? AND c.room_id = ? AND c.card_event_id IS NULL"
        " AND c.tombstoned = 0 AND k.decision IS NULL LIMIT 1",
        (p, room_id),
    )
    if in_flight is not None:
        return EventRole(EventRoleKind.CARD_IN_FLIGHT, approval_id=in_flight[0])
    return None


def offer_reactions(
    tx: Tx, p: str, turn_id: str, target_event_id: str, keys: Sequence[str]
) -> bool:
    """Make ``target_event_id`` (a message of the turn's) interactive for ``keys``.

    False, with nothing written, when the turn's membership ended.
    """
    turn = load_turn(tx, p, turn_id)
    if turn is None:
        raise UnknownTurn(turn_id)
    lock_room(tx, p, turn.room_id, exclusive=False)
    if current_epoch(tx, p, turn.room_id) != turn.epoch:
        return False
    tx.execute(
        "INSERT INTO journal_interactive (principal_id, room_id, target_event_id, turn_id, keys)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (principal_id, room_id, target_event_id)"
        " DO UPDATE SET turn_id = excluded.turn_id, keys = excluded.keys",
        (p, turn.room_id, target_event_id, turn_id, json.dumps(list(keys), ensure_ascii=False)),
    )
    return True


def drop_interactive(tx: Tx, p: str, room_id: str) -> None:
    """An epoch advance: the room's interactive targets belonged to the old membership."""
    tx.execute(
        "DELETE FROM journal_interactive WHERE principal_id = ? AND room_id = ?", (p, room_id)
    )
