"""Approvals and interactive reactions against a real Synapse, answered by real accounts.

The bot asks (``--handler approve``) with an approval card for one exact call; a second
account answers by reply or by reaction; a third, who may not decide, is ignored. A
reaction a turn asked for is dispatched once. And the crash case: the bot is SIGKILLed
right after a decision committed, before the turn it resumes was delivered; the restart
answers exactly once, on both backends.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gapline.journal import (
    APPROVAL_KEY,
    ApprovalFaultPoint,
    Conversation,
    Final,
    HandlerStream,
    JournalStore,
    TriggerMessage,
    Turn,
    TurnState,
    approve,
)
from gapline.matrix import ClientEvent, MatrixClient
from gapline.storage import open_backend
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    answers_by_source,
    bot_process,
    delivered,
    eventually,
    make_bot_user,
    room_events,
    running_bot,
    turn_states,
    wait_joined,
)

pytestmark = pytest.mark.slow


async def card_for(client: MatrixClient, room: str, bot: str, source: str) -> ClientEvent:
    """The bot's approval card asking about ``source`` (once it is in the room)."""

    async def posted() -> ClientEvent | None:
        for event in await room_events(client, room):
            relates = event.content.get("m.relates_to") or {}
            if (
                event.sender == bot
                and APPROVAL_KEY in event.content
                and "m.new_content" not in event.content
                and (relates.get("m.in_reply_to") or {}).get("event_id") == source
            ):
                return event
        return None

    return await eventually(posted, what=f"the approval card for {source}")


async def reply_to(client: MatrixClient, room: str, target: str, body: str) -> str:
    content = {
        "msgtype": "m.text",
        "body": body,
        "m.relates_to": {"m.in_reply_to": {"event_id": target}},
    }
    return await client.send_event(room, "m.room.message", content)


async def react_to(client: MatrixClient, room: str, target: str, key: str) -> str:
    content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}}
    return await client.send_event(room, "m.reaction", content)


def answers(events: list[ClientEvent], bot: str) -> dict[str, Any]:
    """The bot's answers by source, its cards and their resolutions left out."""
    return answers_by_source([e for e in events if APPROVAL_KEY not in e.content], bot)


def resolutions(events: list[ClientEvent], card: str) -> list[str]:
    return [
        e.content["m.new_content"]["body"]
        for e in events
        if (e.content.get("m.relates_to") or {}).get("rel_type") == "m.replace"
        and e.content["m.relates_to"].get("event_id") == card
    ]


async def test_approvals_answered_by_real_accounts(synapse_kit: SynapseKit, tmp_path: Path) -> None:
    alice = await synapse_kit.user("alice")
    mallory = await synapse_kit.user("mallory")
    bot = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice, mallory)
    store = str(tmp_path / "journal.sqlite3")
    async with (
        running_bot(synapse_kit.base_url, bot.user_id, store, handler=approve),
        synapse_kit.client(alice) as client,
        synapse_kit.client(mallory) as other,
    ):
        await client.invite(room, bot.user_id)
        await wait_joined(client, room, bot.user_id)
        yes, no = await synapse_kit.send_messages(alice, room, ["ship it", "drop the table"])
        card_yes = await card_for(client, room, bot.user_id, yes)
        assert card_yes.content[APPROVAL_KEY]["arguments"] == {"text": "ship it"}
        # Mallory may not decide: ignored, the turn still waits.
        await reply_to(other, room, card_yes.event_id, "approve")
        await reply_to(client, room, card_yes.event_id, "approve")

        async def first_delivered() -> bool:
            return delivered(await turn_states(store, bot.user_id, [yes]))

        await eventually(first_delivered, within=90, what="the approved answer")
        # One turn at a time in the room: the second card comes after the first answer.
        card_no = await card_for(client, room, bot.user_id, no)
        await react_to(client, room, card_no.event_id, "❌")

        async def both_delivered() -> bool:
            return delivered(await turn_states(store, bot.user_id, [yes, no]))

        await eventually(both_delivered, within=90, what="the refusal")

        async def resolved() -> list[ClientEvent] | None:
            events = await room_events(client, room)
            done = all(resolutions(events, c.event_id) for c in (card_yes, card_no))
            return events if done else None

        events = await eventually(resolved, what="both cards resolved")
    by_source = answers(events, bot.user_id)
    assert [a.final_body for a in by_source[yes]] == ["echo: ship it"]
    assert [a.final_body for a in by_source[no]] == ["not approved (denied): echo 'drop the table'"]
    assert resolutions(events, card_yes.event_id) == [
        f'Approved by {alice.user_id}: echo({{"text":"ship it"}})'
    ]
    assert resolutions(events, card_no.event_id)[0].startswith(f"Denied by {alice.user_id}")


async def test_an_interactive_reaction_from_a_real_account_is_answered_once(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    store = str(tmp_path / "journal.sqlite3")
    calls: list[str] = []

    async def poll(
        conversation: Conversation, message: TriggerMessage, turn: Turn
    ) -> HandlerStream:
        if message.reaction is None:
            await turn.accept_reactions("👍")
            yield Final(f"react 👍 to: {message.body}")
        else:
            calls.append(message.event_id)
            yield Final(f"thanks for {message.reaction.key}")

    async with (
        running_bot(synapse_kit.base_url, bot.user_id, store, handler=poll) as running,
        synapse_kit.client(alice) as client,
    ):
        assert running.journal is not None
        journal = running.journal
        await client.invite(room, bot.user_id)
        await wait_joined(client, room, bot.user_id)
        (question,) = await synapse_kit.send_messages(alice, room, ["lunch at noon?"])

        async def answered(source: str) -> str | None:
            turn = await journal.turn(source)
            done = turn is not None and turn.state is TurnState.DELIVERED
            return turn.initial_event_id if done and turn is not None else None

        answer = await eventually(lambda: answered(question), what="the question's answer")
        ignored = await react_to(client, room, answer, "👎")
        vote = await react_to(client, room, answer, "👍")
        await eventually(lambda: answered(vote), what="the reaction's answer")

        async def ignored_settled() -> bool:
            return ignored not in {p.event.event_id for p in await journal.pending(50)}

        await eventually(ignored_settled, what="the other reaction settled")
        events = await room_events(client, room)
    assert calls == [vote]
    by_source = answers(events, bot.user_id)
    assert [a.final_body for a in by_source[answer]] == ["thanks for 👍"]  # a reply to the answer
    assert await turn_states(store, bot.user_id, [ignored]) == {ignored: None}


@pytest.fixture(params=["sqlite", "postgres"])
def store_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "journal.sqlite3")
    return request.getfixturevalue("postgres_dsn")


async def test_sigkill_between_the_decision_and_the_continuation_then_one_answer(
    store_dsn: str, synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    log = tmp_path / "bot.log"
    boundary = ApprovalFaultPoint.AFTER_DECISION_BEFORE_CONTINUATION.value
    first = bot_process(
        synapse_kit.base_url,
        bot.user_id,
        store_dsn,
        fault=boundary,
        log_path=log,
        handler="approve",
    )
    second: subprocess.Popen[bytes] | None = None
    try:
        async with synapse_kit.client(alice) as client:
            await client.invite(room, bot.user_id)
            await wait_joined(client, room, bot.user_id)
            (source,) = await synapse_kit.send_messages(alice, room, ["deploy"])
            card = await card_for(client, room, bot.user_id, source)
            await reply_to(client, room, card.event_id, "approve")
            # The decision commits, then the process dies before the turn resumes.
            assert first.wait(timeout=60) == -signal.SIGKILL, log.read_text()[-3000:]
            second = bot_process(
                synapse_kit.base_url, bot.user_id, store_dsn, log_path=log, handler="approve"
            )

            async def answered() -> list[ClientEvent] | None:
                if not delivered(await turn_states(store_dsn, bot.user_id, [source])):
                    return None
                events = await room_events(client, room)
                return events if resolutions(events, card.event_id) else None

            events = await eventually(answered, within=90, what="the answer after the restart")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    by_source = answers(events, bot.user_id)
    assert len(by_source[source]) == 1
    (answer,) = by_source[source]
    assert answer.final_body == "echo: deploy" and answer.final_edits == 1
    cards = [e for e in events if APPROVAL_KEY in e.content and "m.new_content" not in e.content]
    assert [c.event_id for c in cards] == [card.event_id]  # the rerun asked again: no second card
    assert len(resolutions(events, card.event_id)) == 1
    backend = await open_backend(store_dsn)
    try:
        journal = (await JournalStore.open(backend)).principal(bot.user_id)
        turn = await journal.turn(source)
        assert turn is not None and turn.state is TurnState.DELIVERED
        decided = await backend.read(
            lambda tx: tx.all(
                "SELECT decision FROM approval_continuations WHERE principal_id = ?",
                (bot.user_id,),
            )
        )
        assert decided == [("approved",)]
    finally:
        await backend.close()
