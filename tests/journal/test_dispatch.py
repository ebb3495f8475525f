"""Routing pending events and choosing the turns to start (pure, with a stub relation view),
and how an answer to an approval card reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gapline.journal import (
    Decision,
    EventKind,
    EventRole,
    EventRoleKind,
    InboundEvent,
    PendingEvent,
)
from gapline.journal._approval_cards import decision_of, related_answer
from gapline.journal._dispatch import Route, Routed, due_turns, route

BOT = "@bot:example.org"
ALICE = "@alice:example.org"


def pending(
    seq: int, room: str = "!a:x", *, kind: EventKind = EventKind.ACTIONABLE, **content: Any
) -> PendingEvent:
    event_type = "m.reaction" if kind is EventKind.REACTION else "m.room.message"
    body = {"msgtype": "m.text", "body": f"m{seq}", **content}
    event = InboundEvent(f"$e{seq}", room, None, ALICE, seq, event_type, json.dumps(body), kind)
    return PendingEvent(seq, event, 0)


class Roles:
    """A RelationView over a fixed map of event roles."""

    def __init__(self, roles: dict[str, EventRole]) -> None:
        self.roles = roles
        self.asked: list[str] = []

    async def event_role(self, room_id: str, event_id: str) -> EventRole | None:
        self.asked.append(event_id)
        return self.roles.get(event_id)


def reply_to(target: str) -> dict[str, Any]:
    return {"m.relates_to": {"m.in_reply_to": {"event_id": target}}}


def reaction(target: str, key: str) -> dict[str, Any]:
    return {"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}}


async def test_routes_follow_what_the_target_is() -> None:
    roles = Roles({
        "$card": EventRole(EventRoleKind.APPROVAL_CARD, approval_id="ap1", turn_id="$t"),
        "$poll": EventRole(EventRoleKind.INTERACTIVE, turn_id="$t", keys=("👍\ufe0f",)),
        "$early": EventRole(EventRoleKind.CARD_IN_FLIGHT, approval_id="ap2"),
    })  # fmt: skip
    cases = [
        (pending(1), Route.TURN),
        (pending(2, **reply_to("$card")), Route.APPROVAL_ANSWER),
        (pending(3, **reply_to("$early")), Route.DEFER),
        (pending(4, **reply_to("$unrelated")), Route.TURN),
        (pending(5, kind=EventKind.REACTION, **reaction("$poll", "👍")), Route.REACTION_TURN),
        (pending(6, kind=EventKind.REACTION, **reaction("$poll", "👎")), Route.SETTLE),
        (pending(7, kind=EventKind.REACTION, **reaction("$card", "✅")), Route.APPROVAL_ANSWER),
        (pending(8, kind=EventKind.REACTION, **reaction("$other", "👍")), Route.SETTLE),
        (pending(9, kind=EventKind.REDACTION), Route.SETTLE),
        (pending(10, kind=EventKind.APPROVAL_REPLY, **reply_to("$card")), Route.APPROVAL_ANSWER),
        (pending(11, kind=EventKind.DECRYPTION_FAILURE), Route.SETTLE),
    ]
    for item, expected in cases:
        assert (await route(item, BOT, roles)).route is expected, item.event.event_id
    # A plain message asks the journal nothing.
    roles.asked.clear()
    await route(pending(12), BOT, roles)
    assert roles.asked == []


def test_one_turn_per_room_in_receipt_order_rooms_concurrently() -> None:
    items = [Routed(pending(i, room), Route.TURN) for i, room in enumerate("aabbcab")]

    def chosen(**kw: Any) -> list[int]:
        args: dict[str, Any] = {"busy_rooms": set(), "stepping_aside": lambda _e: False, "free": 8}
        args.update(kw)
        return [r.pending.seq for r in due_turns(items, **args)]

    assert chosen() == [0, 2, 4]  # the first of each room
    assert chosen(busy_rooms={"a"}) == [2, 4]  # a room with a running turn waits
    assert chosen(free=2) == [0, 2]
    # A failed turn steps aside during its pause: the room's next one goes.
    assert chosen(stepping_aside=lambda e: e == "$e0") == [1, 2, 4]
    # Something held back (it may answer a card) holds back the room's later turns.
    held = [Routed(pending(9, "a"), Route.DEFER), *items]
    assert [
        r.pending.seq
        for r in due_turns(held, busy_rooms=set(), stepping_aside=lambda _e: False, free=8)
    ] == [2, 4]


@pytest.mark.parametrize(
    ("text", "decision"),
    [
        ("approve", Decision.APPROVED),
        ("Yes, go ahead", Decision.APPROVED),
        ("OK.", Decision.APPROVED),
        ("✅", Decision.APPROVED),
        ("👍\ufe0f", Decision.APPROVED),
        ("> <@bot:x> Approval needed: echo(...)\n\ndeny", Decision.DENIED),
        ("no", Decision.DENIED),
        ("❌", Decision.DENIED),
        ("what does it do?", None),
        ("", None),
    ],
)
def test_an_answer_reads_its_first_word_past_the_quoted_fallback(
    text: str, decision: Decision | None
) -> None:
    assert decision_of(text) is decision


def test_a_thread_message_is_no_reply_to_the_event_its_fallback_names() -> None:
    fallback = {
        "body": "approve",
        "m.relates_to": {
            "rel_type": "m.thread",
            "event_id": "$root",
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": "$card"},
        },
    }
    assert related_answer("m.room.message", fallback) is None
    real = {**fallback, "m.relates_to": {**fallback["m.relates_to"], "is_falling_back": False}}
    answer = related_answer("m.room.message", real)
    assert answer is not None and (answer.target_event_id, answer.reaction) == ("$card", False)
    edit = {"m.relates_to": {"rel_type": "m.replace", "event_id": "$card"}}
    assert related_answer("m.room.message", edit) is None
    react = related_answer("m.reaction", reaction("$card", "✅"))
    assert react is not None and react.reaction and react.text == "✅"
