"""The store's approval, relation and read contracts, run unchanged on every backend.

``ApprovalContract`` is subclassed with a backend mixin in ``test_sqlite.py`` and
``test_postgres.py``. Each rule of approvals (exact-call cards, one decision, who may
decide, deadlines, reconciliation on departure across principals), interactive targets,
thread roots, forward pages and history recovery records is its own test.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gapline.journal import (
    AckOutcome,
    ApprovalAnswer,
    ApprovalRequest,
    ConversationKey,
    Cursor,
    Decision,
    Delivery,
    DeliveryPurpose,
    DeliveryStage,
    DepartureSource,
    EventKind,
    EventRoleKind,
    InboundEvent,
    JournalStore,
    PrincipalJournal,
    ToolCall,
    approval_id_for,
)
from gapline.journal._approval_cards import card_content
from gapline.storage import Backend
from tests.journal.contract import (
    ALICE,
    BOT,
    MALLORY,
    ROOM,
    JournalFixtures,
    edit,
    message,
    raw,
    redaction,
)

COORDINATOR = "@coordinator:example.org"
FAR = 2**62  # a deadline nobody reaches
CALL = ToolCall("delete_file", {"path": "/tmp/x", "force": True})


def request(
    turn_id: str,
    call: ToolCall = CALL,
    *,
    principal: str = BOT,
    approvers: frozenset[str] = frozenset({ALICE}),
    expires_at: int = FAR,
    ordinal: int = 0,
) -> ApprovalRequest:
    approval_id = approval_id_for(principal, turn_id, ordinal, call)
    content = card_content(approval_id, call, approvers, source_event_id=turn_id, thread_id=None)
    return ApprovalRequest(approval_id, turn_id, call, approvers, expires_at, json.dumps(content))


def answer(event_id: str, card: str, body: str, *, sender: str = ALICE) -> InboundEvent:
    content = {
        "msgtype": "m.text",
        "body": body,
        "m.relates_to": {"m.in_reply_to": {"event_id": card}},
    }
    return InboundEvent(
        event_id, ROOM, None, sender, 5000, "m.room.message", json.dumps(content),
        EventKind.APPROVAL_REPLY,
    )  # fmt: skip


def content_of(delivery: Delivery) -> dict[str, Any]:
    return json.loads(delivery.content)


class ApprovalContract(JournalFixtures):
    @staticmethod
    def stored_text(value: str) -> str:
        """A text column as the journal wrote it, opened (a sealed run overrides this)."""
        return value

    @staticmethod
    async def turn(bot: PrincipalJournal, source: str = "$q") -> str:
        await bot.admit(
            message(source, "please delete /tmp/x", ts=100), epoch=await bot.epoch(ROOM)
        )
        await bot.begin_turn(source)
        return source

    @staticmethod
    async def posted(bot: PrincipalJournal, req: ApprovalRequest, card_event: str) -> Delivery:
        """Open the approval and deliver its card (claim, acknowledge) as the worker would."""
        opened = await bot.open_approval(req)
        assert opened is not None and opened.decision is None
        (card,) = await bot.claim(10)
        assert card.purpose is DeliveryPurpose.APPROVAL_CARD and card.stage is DeliveryStage.INITIAL
        assert await bot.acknowledge(card, card_event) is AckOutcome.ACKNOWLEDGED
        return card

    # -- one exact call, one card, one decision ---------------------------------------------

    async def test_an_approval_is_approved_once_and_its_card_resolved(
        self, bot: PrincipalJournal
    ) -> None:
        turn = await self.turn(bot)
        req = request(turn)
        opened = await bot.open_approval(req)
        assert opened is not None
        assert (opened.call, opened.approvers, opened.card_event_id) == (CALL, (ALICE,), None)
        # Until the card has its event id, any answer in the room may be one to it.
        role = await bot.event_role(ROOM, "$whatever")
        assert role is not None and role.kind is EventRoleKind.CARD_IN_FLIGHT
        (card,) = await bot.claim(10)
        assert content_of(card)["io.gapline.approval"]["arguments"] == {
            "force": True,
            "path": "/tmp/x",
        }
        await bot.acknowledge(card, "$card")
        role = await bot.event_role(ROOM, "$card")
        assert role is not None and role.kind is EventRoleKind.APPROVAL_CARD
        assert role.approval_id == req.approval_id and role.turn_id == turn
        assert await bot.event_role(ROOM, "$whatever") is None
        # The card's acknowledgement is the card's, never the turn's placeholder.
        record = await bot.turn(turn)
        assert record is not None and record.initial_event_id is None

        await bot.admit(answer("$yes", "$card", "approve"), epoch=0)
        outcome = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$yes"
        )
        assert outcome.answer is ApprovalAnswer.RECORDED
        assert outcome.approval is not None and outcome.approval.approved
        assert outcome.approval.decided_by == ALICE
        assert "$yes" not in {p.event.event_id for p in await bot.pending(10)}  # handed off
        stored = await bot.approval(req.approval_id)
        assert stored is not None and stored.decision is Decision.APPROVED
        (resolution,) = await bot.claim(10)
        assert (
            resolution.stage is DeliveryStage.FINAL
            and resolution.purpose is DeliveryPurpose.APPROVAL_CARD
        )
        edit_content = content_of(resolution)
        assert edit_content["m.relates_to"] == {"rel_type": "m.replace", "event_id": "$card"}
        assert edit_content["m.new_content"]["body"].startswith(
            f"Approved by {ALICE}: delete_file("
        )

    async def test_a_denial_is_the_decision(self, bot: PrincipalJournal) -> None:
        req = request(await self.turn(bot))
        await self.posted(bot, req, "$card")
        await bot.admit(answer("$no", "$card", "deny"), epoch=0)
        outcome = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.DENIED, approver=ALICE, answer_event_id="$no"
        )
        assert outcome.answer is ApprovalAnswer.RECORDED
        stored = await bot.approval(req.approval_id)
        assert stored is not None and stored.decision is Decision.DENIED and not stored.approved
        (resolution,) = await bot.claim(10)
        assert content_of(resolution)["m.new_content"]["body"].startswith(f"Denied by {ALICE}")

    async def test_answered_twice_the_first_decision_stands(self, bot: PrincipalJournal) -> None:
        req = request(await self.turn(bot))
        await self.posted(bot, req, "$card")
        first = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$a1"
        )
        second = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.DENIED, approver=ALICE, answer_event_id="$a2"
        )
        assert (first.answer, second.answer) == (
            ApprovalAnswer.RECORDED,
            ApprovalAnswer.ALREADY_DECIDED,
        )
        assert second.approval is not None and second.approval.decision is Decision.APPROVED
        assert len(await bot.claim(10)) == 1  # one resolution edit

    async def test_concurrent_answers_record_one_decision(self, bot: PrincipalJournal) -> None:
        req = request(await self.turn(bot))
        await self.posted(bot, req, "$card")
        outcomes = await asyncio.gather(
            *(
                bot.resolve_approval(
                    ROOM, "$card", decision=d, approver=ALICE, answer_event_id=f"$c{i}"
                )
                for i, d in enumerate([Decision.APPROVED, Decision.DENIED] * 4)
            )
        )
        answers = [o.answer for o in outcomes]
        assert answers.count(ApprovalAnswer.RECORDED) == 1
        assert answers.count(ApprovalAnswer.ALREADY_DECIDED) == 7
        winner = outcomes[answers.index(ApprovalAnswer.RECORDED)].approval
        stored = await bot.approval(req.approval_id)
        assert winner is not None and stored is not None and stored.decision is winner.decision
        assert len(await bot.claim(10)) == 1

    async def test_a_non_approver_is_ignored(self, bot: PrincipalJournal) -> None:
        req = request(await self.turn(bot))
        await self.posted(bot, req, "$card")
        await bot.admit(answer("$evil", "$card", "approve", sender=MALLORY), epoch=0)
        outcome = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=MALLORY, answer_event_id="$evil"
        )
        assert outcome.answer is ApprovalAnswer.NOT_APPROVER
        stored = await bot.approval(req.approval_id)
        assert stored is not None and stored.decision is None
        assert "$evil" not in {p.event.event_id for p in await bot.pending(10)}  # ignored
        assert await bot.claim(10) == ()  # no resolution
        outcome = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$ok"
        )
        assert outcome.answer is ApprovalAnswer.RECORDED

    async def test_an_answer_after_the_deadline_expires_the_approval(
        self, bot: PrincipalJournal
    ) -> None:
        req = request(await self.turn(bot), expires_at=10_000)
        await self.posted(bot, req, "$card")
        outcome = await bot.resolve_approval(
            ROOM,
            "$card",
            decision=Decision.APPROVED,
            approver=ALICE,
            answer_event_id="$late",
            now=20_000,
        )
        assert outcome.answer is ApprovalAnswer.EXPIRED
        assert outcome.approval is not None and outcome.approval.decision is Decision.EXPIRED
        (resolution,) = await bot.claim(10)
        assert content_of(resolution)["m.new_content"]["body"].startswith("Expired")
        # Expiring again changes nothing; an undecided one expires only past its deadline.
        again = await bot.expire_approval(req.approval_id, now=30_000)
        assert again is not None and again.decision is Decision.EXPIRED
        other = request("$q", ToolCall("other"), expires_at=10_000, ordinal=1)
        await bot.open_approval(other)
        early = await bot.expire_approval(other.approval_id, now=9_999)
        assert early is not None and early.decision is None
        late = await bot.expire_approval(other.approval_id, now=10_000)
        assert late is not None and late.decision is Decision.EXPIRED

    async def test_opening_is_idempotent_by_exact_call(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        turn = await self.turn(bot)
        first = await bot.open_approval(request(turn))
        again = await bot.open_approval(request(turn))
        assert first == again
        other = await bot.open_approval(
            request(turn, ToolCall("delete_file", {"path": "/tmp/y", "force": True}))
        )
        assert first is not None and other is not None
        assert other.approval_id != first.approval_id
        rows = await raw(
            journal_backend, "SELECT call_digest, arguments FROM approval_cards ORDER BY arguments"
        )
        assert sorted(self.stored_text(r[1]) for r in rows) == [
            '{"force":true,"path":"/tmp/x"}',
            '{"force":true,"path":"/tmp/y"}',
        ]
        assert len(await bot.claim(10)) == 2  # two cards, never three

    def test_exact_call_identity_is_the_name_and_canonical_arguments(self) -> None:
        a = ToolCall("f", {"b": 1, "a": [1, "é"]})
        b = ToolCall("f", {"a": [1, "é"], "b": 1})
        assert a.canonical_arguments() == b.canonical_arguments() == '{"a":[1,"é"],"b":1}'
        assert approval_id_for(BOT, "$t", 0, a) == approval_id_for(BOT, "$t", 0, b)
        assert len({
            approval_id_for(BOT, "$t", 0, a),
            approval_id_for(BOT, "$t", 1, a),
            approval_id_for(BOT, "$u", 0, a),
            approval_id_for(BOT, "$t", 0, ToolCall("f", {"b": 2, "a": [1, "é"]})),
            approval_id_for(BOT, "$t", 0, ToolCall("g", {"b": 1, "a": [1, "é"]})),
        }) == 5  # fmt: skip
        for bad in ({"x": object()}, {"x": float("nan")}):
            with pytest.raises(ValueError):
                ToolCall("f", bad)

    # -- membership fences ----------------------------------------------------------------

    async def test_a_departure_cancels_tombstones_and_retires_acknowledged_cards(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        turn = await self.turn(bot)
        req = request(turn)
        await self.posted(bot, req, "$card")
        in_flight = request(turn, ToolCall("second"), ordinal=1)
        await bot.open_approval(in_flight)
        (attempted,) = await bot.claim(10)  # attempted, outcome unknown
        never = request(turn, ToolCall("third"), ordinal=2)
        await bot.open_approval(never)  # never attempted
        await bot.admit(answer("$yes", "$card", "approve"), epoch=0)  # pending when we leave
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)

        for approval_id in (req.approval_id, in_flight.approval_id, never.approval_id):
            stored = await bot.approval(approval_id)
            assert stored is not None and stored.decision is Decision.CANCELLED
        cards = await raw(
            journal_backend, "SELECT approval_id, tombstoned, card_event_id FROM approval_cards"
        )
        assert {(r[0], r[1]) for r in cards} == {
            (req.approval_id, 1), (in_flight.approval_id, 1), (never.approval_id, 1)
        }  # fmt: skip
        assert ("$card",) in {(r[2],) for r in cards}  # the event id is kept: the tombstone
        outbox = await raw(journal_backend, "SELECT delivery_id, stage FROM journal_outbox")
        # The acknowledged card is retired, the unattempted one removed, the attempted
        # one kept: its retry must collapse onto whatever the server made of it.
        assert outbox == [(in_flight.approval_id, "initial")]
        (survivor,) = await bot.claim(10)
        assert survivor == attempted
        # The answer is not swept by the fence; it finds the card tombstoned, and is settled.
        assert "$yes" in {p.event.event_id for p in await bot.pending(10)}
        outcome = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$yes"
        )
        assert outcome.answer is ApprovalAnswer.TOMBSTONED
        assert "$yes" not in {p.event.event_id for p in await bot.pending(10)}
        # A turn of the old membership cannot open another.
        assert await bot.open_approval(request(turn, ToolCall("later"), ordinal=3)) is None

    async def test_reconciliation_crosses_the_principals_holding_card_and_turn(
        self, store: JournalStore, bot: PrincipalJournal
    ) -> None:
        coordinator = store.principal(COORDINATOR)
        turn = await self.turn(bot)
        req = request(turn)
        opened = await store.open_delegated_approval(COORDINATOR, BOT, req)
        assert opened is not None
        assert await bot.claim(10) == ()  # the card is the coordinator's to send
        (card,) = await coordinator.claim(10)
        await coordinator.acknowledge(card, "$card")
        # The bot (the turn's principal) leaves: the coordinator, still in the room, resolves
        # its card as cancelled instead of leaving it answerable.
        await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
        stored = await bot.approval(req.approval_id)
        assert stored is not None and stored.decision is Decision.CANCELLED
        (resolution,) = await coordinator.claim(10)
        assert resolution.stage is DeliveryStage.FINAL
        assert content_of(resolution)["m.new_content"]["body"].startswith("Cancelled")
        await coordinator.acknowledge(resolution, "$resolved")
        outcome = await coordinator.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$late"
        )
        assert outcome.answer in (ApprovalAnswer.ALREADY_DECIDED, ApprovalAnswer.STALE_EPOCH)

        # The other way round: the coordinator leaves, and the turn waiting on its card is
        # cancelled (nobody can answer a card whose bot left).
        second_turn = await self.turn(bot, "$q2")
        second = request(second_turn)
        await store.open_delegated_approval(COORDINATOR, BOT, second)
        (card2,) = await coordinator.claim(10)
        await coordinator.acknowledge(card2, "$card2")
        await coordinator.fence_departure(ROOM, source=DepartureSource.REPORTED)
        stored = await bot.approval(second.approval_id)
        assert stored is not None and stored.decision is Decision.CANCELLED
        assert await coordinator.claim(10) == ()  # the departed coordinator sends nothing
        outcome = await coordinator.resolve_approval(
            ROOM, "$card2", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$x"
        )
        assert outcome.answer is ApprovalAnswer.TOMBSTONED

    # -- interactive targets ------------------------------------------------------------

    async def test_interactive_targets_are_derived_under_a_membership(
        self, bot: PrincipalJournal
    ) -> None:
        turn = await self.turn(bot)
        assert await bot.offer_reactions(turn, "$answer", ["👍", "👎"]) is True
        role = await bot.event_role(ROOM, "$answer")
        assert role is not None and role.kind is EventRoleKind.INTERACTIVE
        assert role.turn_id == turn and role.keys == ("👍", "👎")
        with pytest.raises(ValueError):
            await bot.offer_reactions(turn, "$answer", [])
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        assert await bot.event_role(ROOM, "$answer") is None
        assert await bot.offer_reactions(turn, "$answer", ["👍"]) is False

    # -- reads: thread roots, forward pages, history recovery records ---------------------

    async def test_a_thread_page_carries_its_root_over_and_above_the_limit(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$root", "what about lunch?", ts=1), epoch=0)
        for i in range(3):
            await bot.admit(message(f"$r{i}", f"reply {i}", ts=10 + i, thread="$root"), epoch=0)
        page = await bot.read_conversation(ROOM, "$root", 2)
        assert page.root is not None and page.root.body == "what about lunch?"
        assert page.root.thread_id is None  # its own row is the room timeline's
        assert [r.body for r in page.rows] == ["reply 1", "reply 2"]
        older = await bot.read_conversation(ROOM, "$root", 2, before=page.next_before)
        assert older.root == page.root and [r.body for r in older.rows] == ["reply 0"]
        assert (await bot.read_conversation(ROOM, None, 10)).root is None
        # A body-cleared root is owed like any row, never served.
        await bot.admit(edit("$fix", "$root", "lunch at 1?", ts=50), epoch=0)
        await bot.admit(redaction("$red", "$fix"), epoch=0)
        damaged = await bot.read_conversation(ROOM, "$root", 2)
        assert damaged.root is None
        assert [d.logical_event_id for d in damaged.owing_refresh] == ["$root"]

    async def test_forward_pages_walk_the_conversation_from_its_start(
        self, bot: PrincipalJournal
    ) -> None:
        for i, ts in enumerate([5, 1, 3, 3, 9, 7, 2]):
            await bot.admit(message(f"$f{i}", f"m{i}", ts=ts), epoch=0)
        seen: list[str] = []
        cursor: Cursor | None = Cursor.start()
        pages = 0
        while cursor is not None:
            page = await bot.read_conversation(ROOM, None, 3, after=cursor)
            seen.extend(r.event_id for r in page.rows)
            assert page.next_before is None
            cursor = page.next_after
            pages += 1
        backwards = await bot.read_conversation(ROOM, None, 100)
        assert seen == [r.event_id for r in backwards.rows]
        assert pages == 3
        with pytest.raises(ValueError):
            await bot.read_conversation(
                ROOM, None, 3, before=Cursor(1, "$f0"), after=Cursor.start()
            )

    async def test_a_history_gap_record_makes_the_room_cold(self, bot: PrincipalJournal) -> None:
        for thread in (None, "$root"):
            key = ConversationKey(ROOM, thread)
            assert await bot.publish_coverage(key, reached_start=True, messages=3, expected_epoch=0)
        await bot.publish_coverage(
            ConversationKey("!other:x"), reached_start=True, messages=1, expected_epoch=0
        )
        assert await bot.record_history_gap(ROOM) == 2
        assert await bot.coverage(ConversationKey(ROOM)) is None
        assert await bot.coverage(ConversationKey(ROOM, "$root")) is None
        assert await bot.coverage(ConversationKey("!other:x")) is not None
