"""What the turn runner does with each pending event, and which turns may start.

Routing (:func:`route`): a pending event is a turn (a message someone wrote to us, or a
reaction a turn asked for with ``accept_reactions``), an answer to one of our approval
cards, something to hold back for a moment (a reply or reaction in a room where a card
still awaits its event id: it may be an answer to it), or something to settle (its
projection work was done at admission: redactions, other reactions, decryption
failures, a card reply that decides nothing).

Order (:func:`due_turns`): turns in one room run one at a time, in receipt order;
different rooms run concurrently. The unit is the room rather than the thread because
a room's main timeline and its threads share one membership and one reader's attention:
answering a later message first would show the room an answer out of the order the
messages came in. Answers to cards are never queued behind the room's turns: the turn
at the head of the room may be the one waiting on that very answer. A turn whose
handler failed steps aside during its retry pause, so one broken message does not
silence its room; it is retried after the messages behind it (the one case of order
given up, and logged).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gapline.journal._approval_cards import RelatedAnswer, related_answer
from gapline.journal._projection import parse_content
from gapline.journal._types import EventKind, EventRole, EventRoleKind, PendingEvent
from gapline.journal._views import RelationView

__all__ = ["Route", "Routed", "due_turns", "route"]


class Route(enum.Enum):
    TURN = "turn"  # a message to answer
    REACTION_TURN = "reaction_turn"  # a reaction a turn asked for: claimed, then answered
    APPROVAL_ANSWER = "approval_answer"  # an answer to one of our cards
    DEFER = "defer"  # may answer a card whose event id is not known yet: look again later
    SETTLE = "settle"  # nothing more to do


TURN_ROUTES = frozenset({Route.TURN, Route.REACTION_TURN})


@dataclass(frozen=True, slots=True)
class Routed:
    pending: PendingEvent
    route: Route
    answer: RelatedAnswer | None = None
    role: EventRole | None = None

    @property
    def room_id(self) -> str:
        return self.pending.event.room_id


def _content(pending: PendingEvent) -> Mapping[str, Any]:
    return parse_content(pending.event.content) or {}


def _normalised(key: str) -> str:
    return key.replace("\ufe0f", "")


async def route(pending: PendingEvent, principal_id: str, relations: RelationView) -> Routed:
    """Where ``pending`` goes (reads the journal only for replies and reactions)."""
    event = pending.event
    kind = event.kind
    if kind not in (EventKind.ACTIONABLE, EventKind.REACTION, EventKind.APPROVAL_REPLY):
        return Routed(pending, Route.SETTLE)
    answer = related_answer(event.type, _content(pending))
    if kind is EventKind.APPROVAL_REPLY:
        return Routed(pending, Route.APPROVAL_ANSWER if answer else Route.SETTLE, answer)
    if answer is None or event.sender == principal_id:
        return Routed(pending, Route.TURN if kind is EventKind.ACTIONABLE else Route.SETTLE)
    role = await relations.event_role(event.room_id, answer.target_event_id)
    if role is not None and role.kind is EventRoleKind.APPROVAL_CARD:
        return Routed(pending, Route.APPROVAL_ANSWER, answer, role)
    if role is not None and role.kind is EventRoleKind.CARD_IN_FLIGHT:
        return Routed(pending, Route.DEFER, answer, role)
    if kind is EventKind.REACTION:
        keys = {_normalised(k) for k in role.keys} if role is not None else set()
        if (
            role is not None
            and role.kind is EventRoleKind.INTERACTIVE
            and _normalised(answer.text) in keys
        ):
            return Routed(pending, Route.REACTION_TURN, answer, role)
        return Routed(pending, Route.SETTLE, answer, role)
    return Routed(pending, Route.TURN, answer, role)


def due_turns(
    routed: Sequence[Routed],
    *,
    busy_rooms: Collection[str],
    stepping_aside: Callable[[str], bool],
    free: int,
) -> list[Routed]:
    """The turns to start now, at most ``free``: per room, the first turn-backed event
    in receipt order that is not stepping aside (its retry pause), and only in a room
    where no turn runs and no event is held back (``DEFER``) before it. ``routed`` is in
    receipt order."""
    chosen: list[Routed] = []
    started: set[str] = set()
    for item in routed:
        if len(chosen) >= free:
            break
        room = item.room_id
        if item.route is Route.DEFER:
            started.add(room)  # what may answer a card holds the room's later turns back
            continue
        if item.route not in TURN_ROUTES:
            continue
        if room in busy_rooms or room in started:
            continue
        if stepping_aside(item.pending.event.event_id):
            continue
        started.add(room)
        chosen.append(item)
    return chosen
