"""The bot's runtime contracts, in-process on the fake homeserver, on every backend.

``RuntimeContract`` is subclassed with a backend mixin in ``test_sqlite.py`` and
``test_postgres.py``: approvals (approved, denied, answered twice, by a non-approver,
after the bot left), an interactive reaction dispatched once, one turn per room in
receipt order with rooms concurrent, a thread read holding its root, a strict read
after a failed hydration, and an export of a 10,000-message cold thread. Waits are on
what the bot does (``tests.activity``), never on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from gapline.journal import (
    APPROVAL_KEY,
    Approval,
    Bot,
    Conversation,
    ConversationKey,
    ConversationNotReady,
    ConversationReader,
    ConversationRow,
    Decision,
    Final,
    Handler,
    HandlerStream,
    Hydrator,
    JournalStore,
    PointRefetcher,
    PrincipalJournal,
    Progress,
    TriggerMessage,
    Turn,
    TurnState,
    approve,
    echo,
    export_conversation,
)
from gapline.matrix import ClientEvent
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import Backend
from tests.activity import Activity
from tests.journal.bots import bot_running
from tests.journal.contract import JournalFixtures

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, within: float = 30) -> T:
    return await Activity.current().until(probe, what=what, within=within)


def edit_of(target: str, body: str) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


def as_line(row: ConversationRow) -> dict[str, Any]:
    """A row as `journal export --format jsonl` writes it."""
    return {
        "event_id": row.event_id,
        "sender": row.sender,
        "created_ts": row.created_ts,
        "thread_id": row.thread_id,
        "body": row.body,
        "edited": row.edited,
    }


class RuntimeContract(JournalFixtures):
    @pytest.fixture
    def fake(self) -> FakeHomeserver:
        fake = FakeHomeserver()
        for name in ("alice", "bot", "mallory"):
            fake.register(name)
        return fake

    @staticmethod
    def running(
        fake: FakeHomeserver, backend: Backend, *, handler: Handler = echo, **config: Any
    ) -> contextlib.AbstractAsyncContextManager[Bot]:
        return bot_running(fake, backend, handler=handler, **config)

    @staticmethod
    def room(fake: FakeHomeserver, *members: str) -> str:
        return fake.create_room(fake.user_id("alice"), members=[fake.user_id(m) for m in members])

    # -- helpers over the fake's rooms ------------------------------------------------------

    @staticmethod
    def cards(fake: FakeHomeserver, room: str) -> list[ClientEvent]:
        return [
            e
            for e in fake.events(room)
            if e.sender == fake.user_id("bot")
            and APPROVAL_KEY in e.content
            and "m.new_content" not in e.content
        ]

    @staticmethod
    def resolutions(fake: FakeHomeserver, room: str, card: str) -> list[str]:
        return [
            e.content["m.new_content"]["body"]
            for e in fake.events(room)
            if e.content.get("m.relates_to", {}).get("rel_type") == "m.replace"
            and e.content["m.relates_to"].get("event_id") == card
        ]

    async def resolved(self, fake: FakeHomeserver, room: str, card: str) -> list[str] | None:
        """The card's resolution edits, once there is one (a probe)."""
        return self.resolutions(fake, room, card) or None

    @staticmethod
    def reply(fake: FakeHomeserver, who: str, room: str, target: str, body: str) -> str:
        content = {
            "msgtype": "m.text",
            "body": body,
            "m.relates_to": {"m.in_reply_to": {"event_id": target}},
        }
        return fake.send_event(who, room, "m.room.message", content)

    @staticmethod
    def in_thread(fake: FakeHomeserver, who: str, room: str, root: str, body: str) -> str:
        content = {
            "msgtype": "m.text",
            "body": body,
            "m.relates_to": {"rel_type": "m.thread", "event_id": root},
        }
        return fake.send_event(who, room, "m.room.message", content)

    @staticmethod
    def react(fake: FakeHomeserver, who: str, room: str, target: str, key: str) -> str:
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}}
        return fake.send_event(who, room, "m.reaction", content)

    @staticmethod
    def final_body(fake: FakeHomeserver, room: str, turn_final: str) -> str:
        (event,) = [e for e in fake.events(room) if e.event_id == turn_final]
        return str(event.content["m.new_content"]["body"])

    @staticmethod
    async def delivered(bot: Bot | PrincipalJournal, source: str) -> str | None:
        """The final answer's event id once ``source``'s turn is delivered (a probe)."""
        journal = bot.journal if isinstance(bot, Bot) else bot
        assert journal is not None
        turn = await journal.turn(source)
        return (
            turn.final_event_id if turn is not None and turn.state is TurnState.DELIVERED else None
        )

    async def card_of(self, fake: FakeHomeserver, room: str) -> ClientEvent:
        async def posted() -> ClientEvent | None:
            cards = self.cards(fake, room)
            return cards[0] if cards else None

        return await eventually(posted, "the approval card")

    # -- approvals -----------------------------------------------------------------------

    async def test_an_approval_approved_then_answered(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        async with self.running(fake, journal_backend, handler=approve) as bot:
            assert bot.journal is not None
            source = fake.send_text("alice", room, "hello")
            card = await self.card_of(fake, room)
            assert card.content[APPROVAL_KEY]["tool"] == "echo"
            assert card.content[APPROVAL_KEY]["arguments"] == {"text": "hello"}
            assert card.content["m.relates_to"]["m.in_reply_to"]["event_id"] == source
            assert await self.delivered(bot, source) is None  # it waits for the decision
            self.reply(fake, "alice", room, card.event_id, "approve")
            final = await eventually(lambda: self.delivered(bot, source), "the answer")
            assert self.final_body(fake, room, final) == "echo: hello"
            await eventually(lambda: self.resolved(fake, room, card.event_id), "the card resolved")
        assert len(self.cards(fake, room)) == 1
        (resolution,) = self.resolutions(fake, room, card.event_id)
        assert resolution.startswith(f"Approved by {fake.user_id('alice')}")

    async def test_an_approval_denied(self, fake: FakeHomeserver, journal_backend: Backend) -> None:
        room = self.room(fake, "bot")
        async with self.running(fake, journal_backend, handler=approve) as bot:
            assert bot.journal is not None
            source = fake.send_text("alice", room, "drop the table")
            card = await self.card_of(fake, room)
            react = self.react(fake, "alice", room, card.event_id, "❌")
            final = await eventually(lambda: self.delivered(bot, source), "the refusal")
            assert self.final_body(fake, room, final).startswith("not approved (denied)")
            assert bot.journal is not None
            assert react not in {p.event.event_id for p in await bot.journal.pending(50)}

    async def test_answered_twice_one_decision(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        async with self.running(fake, journal_backend, handler=approve) as bot:
            assert bot.journal is not None
            source = fake.send_text("alice", room, "twice")
            card = await self.card_of(fake, room)
            self.reply(fake, "alice", room, card.event_id, "yes")
            self.react(fake, "alice", room, card.event_id, "👎")
            final = await eventually(lambda: self.delivered(bot, source), "the answer")
            assert self.final_body(fake, room, final) == "echo: twice"

            async def all_settled() -> bool:
                assert bot.journal is not None
                return not [p for p in await bot.journal.pending(50) if p.event.room_id == room]

            await eventually(all_settled, "both answers settled")
            await eventually(lambda: self.resolved(fake, room, card.event_id), "the resolution")
        assert len(self.resolutions(fake, room, card.event_id)) == 1

    async def test_a_non_approver_is_ignored(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot", "mallory")
        async with self.running(fake, journal_backend, handler=approve) as bot:
            journal = bot.journal
            assert journal is not None
            source = fake.send_text("alice", room, "guarded")
            card = await self.card_of(fake, room)
            approval_id = card.content[APPROVAL_KEY]["approval_id"]
            evil = self.reply(fake, "mallory", room, card.event_id, "approve")

            async def ignored() -> bool:
                return evil not in {p.event.event_id for p in await journal.pending(50)}

            await eventually(ignored, "mallory's answer settled")
            approval = await journal.approval(approval_id)
            assert approval is not None and approval.decision is None
            assert await self.delivered(journal, source) is None
            self.reply(fake, "alice", room, card.event_id, "ok")
            final = await eventually(lambda: self.delivered(journal, source), "the answer")
            assert self.final_body(fake, room, final) == "echo: guarded"

    async def test_an_approval_after_the_bot_left_is_reconciled(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        async with self.running(fake, journal_backend, handler=approve) as bot:
            journal = bot.journal
            assert journal is not None
            source = fake.send_text("alice", room, "too late")
            card = await self.card_of(fake, room)
            approval_id = card.content[APPROVAL_KEY]["approval_id"]

            async def card_acknowledged() -> bool:
                approval = await journal.approval(approval_id)
                return approval is not None and approval.card_event_id == card.event_id

            await eventually(card_acknowledged, "the card's acknowledgement")
            await bot.leave(room)

            async def cancelled() -> Approval | None:
                approval = await journal.approval(approval_id)
                return approval if approval is not None and approval.decision else None

            approval = await eventually(cancelled, "the approval reconciled")
            assert approval.decision is Decision.CANCELLED
            tombstoned = await journal_backend.read(
                lambda tx: tx.all(
                    "SELECT tombstoned FROM approval_cards WHERE approval_id = ?", (approval_id,)
                )
            )
            assert tombstoned == [(1,)]
            retired = await journal_backend.read(
                lambda tx: tx.all(
                    "SELECT stage FROM journal_outbox WHERE delivery_id = ?", (approval_id,)
                )
            )
            assert retired == []  # the acknowledged card's delivery is retired

            async def abandoned() -> bool:
                turn = await journal.turn(source)
                return turn is not None and turn.state is TurnState.COMPLETED

            await eventually(abandoned, "the turn to finish without an answer")
        assert await self.delivered(journal, source) is None

    # -- interactive reactions ------------------------------------------------------------

    async def test_an_interactive_reaction_is_claimed_and_dispatched_once(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        reactions: list[TriggerMessage] = []

        async def poll(
            conversation: Conversation, message: TriggerMessage, turn: Turn
        ) -> HandlerStream:
            if message.reaction is None:
                await turn.accept_reactions("👍")
                yield Final(f"react 👍 to: {message.body}")
            else:
                reactions.append(message)
                yield Progress("counting")
                yield Final(f"thanks for {message.reaction.key}")

        async with self.running(fake, journal_backend, handler=poll) as bot:
            journal = bot.journal
            assert journal is not None
            source = fake.send_text("alice", room, "lunch at noon?")
            await eventually(lambda: self.delivered(journal, source), "the question")
            turn = await journal.turn(source)
            assert turn is not None and turn.initial_event_id is not None
            answer = turn.initial_event_id
            other = self.react(fake, "alice", room, answer, "👎")  # not one it asked for
            vote = self.react(fake, "alice", room, answer, "👍")
            final = await eventually(lambda: self.delivered(journal, vote), "the reaction's turn")
            assert self.final_body(fake, room, final) == "thanks for 👍"
            pending = {p.event.event_id for p in await journal.pending(50)}
            assert other not in pending and vote not in pending
            assert await journal.turn(other) is None
        assert [(r.event_id, r.reaction.key if r.reaction else None) for r in reactions] == [
            (vote, "👍")
        ]
        vote_turn = await journal.turn(vote)
        assert vote_turn is not None
        (reply,) = [e for e in fake.events(room) if e.event_id == vote_turn.initial_event_id]
        assert reply.content["m.relates_to"]["m.in_reply_to"]["event_id"] == answer
        # A restart finds the reaction settled: it is never dispatched again.
        async with self.running(fake, journal_backend, handler=poll) as again:
            assert again.journal is not None
            later = fake.send_text("alice", room, "after the restart")
            await eventually(lambda: self.delivered(again, later), "the next answer")
        assert len(reactions) == 1

    # -- order ------------------------------------------------------------------------------

    async def test_a_burst_in_one_room_is_answered_in_order_and_rooms_run_concurrently(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        busy, other = self.room(fake, "bot"), self.room(fake, "bot")
        seen: list[tuple[str, str, str]] = []
        running: dict[str, int] = {}
        overlap: list[int] = []
        other_started = asyncio.Event()

        async def ordered(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
            room = message.room_id
            running[room] = running.get(room, 0) + 1
            overlap.append(running[room])
            seen.append(("start", room, message.body))
            if room == other:
                other_started.set()
            elif message.body == "burst 0":
                # The busy room's first turn waits for the other room's: were rooms run one
                # after another, this would never finish.
                async with asyncio.timeout(30):
                    await other_started.wait()
            await conversation.read(limit=1)  # a real await in the middle of the turn
            yield Progress("…")
            seen.append(("end", room, message.body))
            running[room] -= 1
            yield Final(f"echo: {message.body}")

        async with self.running(fake, journal_backend, handler=ordered) as bot:
            journal = bot.journal
            assert journal is not None
            bodies = [f"burst {i}" for i in range(20)]
            sources = fake.send_messages("alice", busy, bodies)
            (elsewhere,) = fake.send_messages("alice", other, ["meanwhile"])

            async def all_answered() -> list[str] | None:
                finals = [await self.delivered(bot, s) for s in [*sources, elsewhere]]
                return None if None in finals else [f for f in finals if f is not None]

            finals = await eventually(all_answered, "21 answers", within=60)
        assert max(overlap) == 1  # never two turns of one room at once
        in_busy = [(kind, body) for kind, room, body in seen if room == busy]
        assert in_busy == [(kind, b) for b in bodies for kind in ("start", "end")]
        # The answers reached the room in the order of the messages.
        order = {e.event_id: i for i, e in enumerate(fake.events(busy))}
        assert [order[f] for f in finals[:20]] == sorted(order[f] for f in finals[:20])

    # -- reads ----------------------------------------------------------------------------

    async def test_a_thread_read_contains_its_root(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        seen: list[list[str]] = []

        async def recall(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
            rows = await conversation.read(limit=5, strict=True)
            seen.append([r.body for r in rows])
            yield Final(f"{len(rows)} rows")

        async with self.running(fake, journal_backend, handler=recall) as bot:
            assert bot.journal is not None
            root = fake.send_text("alice", room, "the thread is about this")
            await eventually(lambda: self.delivered(bot, root), "the root's answer")
            replies = [
                self.in_thread(fake, "alice", room, root, f"in thread {i}") for i in range(7)
            ]
            await eventually(lambda: self.delivered(bot, replies[-1]), "the last answer")
        # Every turn in the thread saw the root first, over and above its 5 rows.
        in_thread = seen[1:]
        assert len(in_thread) == 7
        assert all(rows[0] == "the thread is about this" for rows in in_thread)
        assert all(len(rows) <= 6 for rows in in_thread)
        assert all(rows.count("the thread is about this") == 1 for rows in in_thread)
        assert "in thread 6" in in_thread[0]  # the messages of one sync were all admitted

    async def test_a_strict_read_after_a_failed_hydration_raises(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        fake.send_messages("alice", room, [f"old {i}" for i in range(5)])
        journal = (await JournalStore.open(journal_backend)).principal(fake.user_id("bot"))
        session = fake.register("bot")
        failing = fake.fail("messages", status=403, errcode="M_FORBIDDEN", times=None)
        async with fake.client(session) as client:
            hydrator = Hydrator(journal, client, session.user_id)
            reader = ConversationReader(journal, hydrator=hydrator)
            key = ConversationKey(room)
            with pytest.raises(ConversationNotReady) as raised:
                await reader.read(key, limit=10, strict=True)
            assert raised.value.key == key
            page = await reader.read(key, limit=10)  # non-strict: what is projected, said so
            assert page.rows == () and page.not_ready is not None
            assert failing.fired >= 2
            fake.clear_faults()
            page = await reader.read(key, limit=10, strict=True)  # the next read retries
            assert [r.body for r in page.rows] == [f"old {i}" for i in range(5)]
            assert page.not_ready is None
            await hydrator.aclose()

    @pytest.mark.slow
    async def test_an_export_of_a_cold_10000_message_thread_is_the_prompt_readers_view(
        self, fake: FakeHomeserver, journal_backend: Backend
    ) -> None:
        room = self.room(fake, "bot")
        root = fake.send_text("alice", room, "the root")
        expected = ["the root"]
        for i in range(10_000):
            sender = "alice" if i % 3 else "mallory"
            reply = self.in_thread(fake, sender, room, root, f"reply {i}")
            body = f"reply {i}"
            if i % 1000 == 7:  # an edit: the export shows the latest revision
                body = f"reply {i}, edited"
                fake.send_event(sender, room, "m.room.message", edit_of(reply, body))
            if i == 4242:  # a redacted message is not exported
                fake.redact("alice", room, reply)
                continue
            expected.append(body)
        journal = (await JournalStore.open(journal_backend)).principal(fake.user_id("bot"))
        session = fake.register("bot")
        async with fake.client(session) as client:
            hydrator = Hydrator(journal, client, session.user_id)
            refetcher = PointRefetcher(journal, client, session.user_id)
            reader = ConversationReader(journal, refetcher=refetcher, hydrator=hydrator)
            key = ConversationKey(room, root)
            lines: list[str] = []
            summary = await export_conversation(reader, key, lines.append, strict=True)
            await hydrator.aclose()
            await refetcher.aclose()
        rows = [json.loads(line) for line in "".join(lines).splitlines()]
        assert summary.messages == len(rows) == len(expected) == 10_000
        assert summary.reached_start is True and summary.omitted == 0
        assert [r["body"] for r in rows] == expected
        # The prompt reader's view of the same thread, paged backwards a window at a time.
        prompt = ConversationReader(journal)
        pages: list[dict[str, Any]] = []
        before = None
        while True:
            page = await prompt.read(key, limit=50, before=before, strict=True)
            pages[:0] = [as_line(r) for r in page.rows]
            if page.next_before is None:
                assert page.root is not None
                pages.insert(0, as_line(page.root))
                break
            before = page.next_before
        assert pages == rows
        # And a handler's prompt window is the export's tail, root first.
        window = await prompt.bind(key).read(limit=50)
        assert [r.body for r in window] == [expected[0], *expected[-50:]]
