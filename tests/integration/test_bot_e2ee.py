"""The bot in encrypted rooms against a real Synapse, with matrix-nio (its own crypto) as
the peer, on SQLite and PostgreSQL: it joins, decrypts, answers encrypted, journals what
it cannot decrypt as a decryption failure and answers it exactly once when the key
arrives late; nothing goes into the room in the clear."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from gapline.journal import EventKind, JournalStore, TurnState
from gapline.journal._sealing import SealedContent, open_sealing
from gapline.matrix import ClientEvent
from gapline.storage import open_backend
from tests.e2ee.synapse_peers import ENCRYPTION, NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    eventually,
    make_bot_user,
    room_events,
    running_bot,
    wait_joined,
)
from tests.integration.e2ee_rooms import PASSPHRASE, in_room

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(params=["sqlite", "postgres"])
def store_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "journal.sqlite3")
    return request.getfixturevalue("postgres_dsn")


async def journal_query(store: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    backend = await open_backend(store)
    try:
        await JournalStore.open(backend)
        return await backend.read(lambda tx: tx.all(sql, params))
    finally:
        await backend.close()


async def turn_states(store: str, principal: str, sources: list[str]) -> dict[str, Any]:
    """The turn state of each source (read by SQL: the turn's result is sealed)."""
    out: dict[str, Any] = {}
    for source in sources:
        rows = await journal_query(
            store,
            "SELECT state FROM journal_turns WHERE principal_id = ? AND source_event_id = ?",
            (principal, source),
        )
        out[source] = TurnState(rows[0][0]) if rows else None
    return out


async def answered(store: str, principal: str, event_id: str) -> bool:
    states = await turn_states(store, principal, [event_id])
    return states[event_id] is TurnState.DELIVERED


async def journal_row(store: str, principal: str, event_id: str) -> tuple[Any, ...] | None:
    """(kind, settled, upgraded_from) of one journaled event."""
    rows = await journal_query(
        store,
        "SELECT kind, settled, upgraded_from FROM journal_events"
        " WHERE principal_id = ? AND event_id = ?",
        (principal, event_id),
    )
    return rows[0] if rows else None


async def delivery_rows(store: str, principal: str, turn_id: str) -> list[tuple[Any, ...]]:
    return await journal_query(
        store,
        "SELECT stage, event_type, acked_event_id FROM journal_outbox"
        " WHERE principal_id = ? AND turn_id = ? ORDER BY seq",
        (principal, turn_id),
    )


async def projected_bodies(store: str, principal: str, room_id: str) -> list[str]:
    """The room's projected conversation, read with the passphrase (its bodies are
    sealed); without it the read is refused."""
    backend = await open_backend(store)
    try:
        journal_store = await JournalStore.open(backend)
        with pytest.raises(SealedContent):
            await journal_store.principal(principal).read_conversation(room_id, None, 50)
        sealing = await open_sealing(backend, PASSPHRASE)
        page = await journal_store.principal(principal, sealing=sealing).read_conversation(
            room_id, None, 50
        )
        return [row.body for row in page.rows]
    finally:
        await backend.close()


async def hold_back_next_key(nio: NioDevice, room_id: str) -> tuple[dict[str, Any], str]:
    """Make nio's next messages use a fresh session whose key it believes it shared, but
    whose to-device messages are held by the test (returned, with the session id)."""
    c = nio.client
    olm = nio.olm
    missing = c.get_missing_sessions(room_id)
    if missing:
        await c.keys_claim(missing)
    if room_id in olm.outbound_group_sessions:
        olm.rotate_outbound_group_session(room_id)
    sharing_with, to_device = olm.share_group_session(
        room_id, list(c.rooms[room_id].users), ignore_unverified_devices=True
    )
    outbound = olm.outbound_group_sessions[room_id]
    outbound.users_shared_with.update(sharing_with)
    outbound.shared = True
    return to_device["messages"], outbound.id


def store_bytes(store: str) -> bytes | None:
    """Every file of a SQLite store (the database, its WAL and shared memory); None on
    PostgreSQL (its files are the cluster's, grepped by nobody here)."""
    if store.startswith("postgresql"):
        return None
    path = Path(store)
    return b"".join(
        p.read_bytes() for p in sorted(path.parent.iterdir()) if p.name.startswith(path.name)
    )


def nothing_in_the_clear(events: list[ClientEvent], bot_id: str) -> None:
    """Every message-like event the bot sent into the room is ciphertext."""
    sent = [e for e in events if e.sender == bot_id and e.state_key is None]
    assert sent, "the bot sent nothing"
    assert {e.type for e in sent} == {"m.room.encrypted"}, {e.type for e in sent}


def echoes_of(nio: NioDevice, body: str) -> list[str]:
    """nio's decrypted final edits answering ``body``."""
    return [eid for eid, text in nio.bodies.items() if text == f"* echo: {body}"]


async def test_nio_and_the_bot_talk_encrypted_and_a_late_key_heals_exactly_once(
    synapse_kit: SynapseKit, tmp_path: Path, store_dsn: str
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    nio = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")
    try:
        async with synapse_kit.client(alice) as client:
            room = await client.create_room(
                preset="private_chat", initial_state=[ENCRYPTION], invite=[bot.user_id]
            )
            async with running_bot(
                synapse_kit.base_url,
                bot.user_id,
                store_dsn,
                allow=frozenset({alice.user_id}),
                passphrase=PASSPHRASE,
            ) as running:
                await wait_joined(client, room, bot.user_id)
                assert running.crypto is not None
                bot_device = running.crypto.machine.device_id
                await nio.wait_until(lambda: in_room(nio, room, bot.user_id))
                await nio.keys()

                # A message whose key nio holds back: journaled as a decryption failure.
                held, session_id = await hold_back_next_key(nio, room)
                late = await nio.send_text(room, "you will read this later")

                async def journaled_as_failure() -> bool:
                    row = await journal_row(store_dsn, bot.user_id, late)
                    return row is not None and row[0] == EventKind.DECRYPTION_FAILURE.value

                await eventually(journaled_as_failure, what="the UTD journaled")
                assert await turn_states(store_dsn, bot.user_id, [late]) == {late: None}

                # The key arrives: the same row is upgraded and answered, once.
                async with synapse_kit.client(nio.session) as as_nio:
                    await as_nio.send_to_device("m.room.encrypted", held, "late-key")

                await eventually(
                    lambda: answered(store_dsn, bot.user_id, late),
                    within=90,
                    what="the late answer",
                )
                row = await journal_row(store_dsn, bot.user_id, late)
                assert row is not None
                assert (row[0], row[2]) == ("actionable", "decryption_failure")

                # A message in the same (now shared) session, decrypted on arrival.
                hello = await nio.send_text(room, "hello encrypted")
                await eventually(
                    lambda: answered(store_dsn, bot.user_id, hello), within=90, what="the answer"
                )
                await nio.wait_until(
                    lambda: (
                        bool(echoes_of(nio, "hello encrypted"))
                        and bool(echoes_of(nio, "you will read this later"))
                    )
                )
                for source in (late, hello):
                    rows = await delivery_rows(store_dsn, bot.user_id, source)
                    assert [(r[0], r[1]) for r in rows] == [
                        ("initial", "m.room.encrypted"),
                        ("final", "m.room.encrypted"),
                    ]
                    assert all(r[2] for r in rows)
                assert session_id
                nio_key = nio.olm.outbound_group_sessions[room].session_key
                bot_key = running.crypto.machine.outbound._sessions[room].session.session_key
                secrets = [
                    b"you will read this later",
                    b"hello encrypted",
                    str(nio_key).encode()
                    if isinstance(nio_key, str)
                    else nio_key.to_base64().encode(),
                    bot_key.to_base64().encode(),
                ]
                data_open = store_bytes(store_dsn)
            events = await room_events(client, room)
        nothing_in_the_clear(events, bot.user_id)
        bodies = await projected_bodies(store_dsn, bot.user_id, room)
        for body in ("you will read this later", "hello encrypted"):
            assert body in bodies and f"echo: {body}" in bodies, bodies
        assert len(echoes_of(nio, "you will read this later")) == 1
        assert len(echoes_of(nio, "hello encrypted")) == 1
        bot_devices = {
            e.content.get("device_id") for e in events if e.sender == bot.user_id and e.content
        }
        assert bot_devices <= {bot_device, None}
        if data_open is not None:  # SQLite: the database and its WAL, open and closed
            data = data_open + (store_bytes(store_dsn) or b"")
            assert len(data) > 10_000 and b"m.room.encrypted" in data  # rows are there
            for secret in secrets:
                assert secret not in data, secret[:24]
    finally:
        await nio.close()


async def test_the_bot_rotates_its_session_per_the_rooms_settings(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    """``rotation_period_msgs`` of the room's ``m.room.encryption``: no session of the bot
    carries more messages than that, none is used again after it was replaced, and nio
    reads every answer across the rotations."""
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    store = str(tmp_path / "journal.sqlite3")
    nio = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")
    settings: dict[str, Any] = {
        "type": "m.room.encryption",
        "state_key": "",
        "content": {"algorithm": "m.megolm.v1.aes-sha2", "rotation_period_msgs": 6},
    }
    bodies = ["first", "second", "third"]
    try:
        async with synapse_kit.client(alice) as client:
            room = await client.create_room(
                preset="private_chat", initial_state=[settings], invite=[bot.user_id]
            )
            async with running_bot(
                synapse_kit.base_url,
                bot.user_id,
                store,
                allow=frozenset({alice.user_id}),
                passphrase=PASSPHRASE,
            ):
                await wait_joined(client, room, bot.user_id)
                await nio.wait_until(lambda: in_room(nio, room, bot.user_id))

                for body in bodies:  # 4 events per answer (placeholder, 2 progress, final)
                    source = await nio.send_text(room, body)
                    await eventually(
                        lambda s=source: answered(store, bot.user_id, s), what=f"{body} answered"
                    )
                await nio.wait_until(lambda: all(echoes_of(nio, b) for b in bodies))
            events = await room_events(client, room)
        nothing_in_the_clear(events, bot.user_id)
        sessions: list[str] = [
            e.content["session_id"]
            for e in events
            if e.sender == bot.user_id and e.type == "m.room.encrypted"
        ]
        runs = [len(list(group)) for _, group in itertools.groupby(sessions)]
        assert len(sessions) == 12 and max(runs) <= 6, runs
        assert len(set(sessions)) == len(runs) >= 2, runs  # never a session used again
        for body in bodies:
            assert len(echoes_of(nio, body)) == 1
    finally:
        await nio.close()


@pytest.mark.parametrize("with_passphrase", [True, False])
async def test_a_room_that_becomes_encrypted_is_never_answered_in_the_clear(
    synapse_kit: SynapseKit, tmp_path: Path, with_passphrase: bool
) -> None:
    """``m.room.encryption`` arriving mid-session is honoured: with a passphrase the next
    answer is encrypted (and nio reads it); without one nothing more is sent at all, the
    answer's row stays unsent (fail closed), and a message nio encrypts is journaled as a
    decryption failure and never answered."""
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    store = str(tmp_path / "journal.sqlite3")
    nio = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")
    try:
        async with synapse_kit.client(alice) as client:
            room = await client.create_room(preset="private_chat", invite=[bot.user_id])
            async with running_bot(
                synapse_kit.base_url,
                bot.user_id,
                store,
                allow=frozenset({alice.user_id}),
                passphrase=PASSPHRASE if with_passphrase else None,
            ):
                await wait_joined(client, room, bot.user_id)

                plain = await client.send_text(room, "before")
                await eventually(
                    lambda: answered(store, bot.user_id, plain), what="the plaintext answer"
                )
                switched = await client.put_state(
                    room, "m.room.encryption", {"algorithm": "m.megolm.v1.aes-sha2"}
                )
                # alice's plain client still sends in the clear: the bot's answer must not.
                after = await client.send_text(room, "after the switch")

                async def rows_for_after() -> list[tuple[Any, ...]] | None:
                    rows = await delivery_rows(store, bot.user_id, after)
                    return rows or None

                if with_passphrase:
                    await eventually(
                        lambda: answered(store, bot.user_id, after), what="the encrypted answer"
                    )
                    await nio.wait_until(lambda: bool(echoes_of(nio, "after the switch")))
                else:
                    rows = await eventually(rows_for_after, what="the answer's row")
                    nio_event = await nio.send_text(room, "encrypted by nio")

                    async def journaled_as_failure() -> bool:
                        row = await journal_row(store, bot.user_id, nio_event)
                        return row is not None and row[0] == EventKind.DECRYPTION_FAILURE.value

                    await eventually(journaled_as_failure, what="nio's message, undecryptable")
                    rows = await delivery_rows(store, bot.user_id, after)
                    assert rows and all(r[2] is None for r in rows), rows  # never sent
                    assert await turn_states(store, bot.user_id, [nio_event]) == {nio_event: None}
            events = await room_events(client, room)
        at = next(i for i, e in enumerate(events) if e.event_id == switched)
        sent_after = [e for e in events[at:] if e.sender == bot.user_id and e.state_key is None]
        if with_passphrase:
            assert sent_after and {e.type for e in sent_after} == {"m.room.encrypted"}
        else:
            assert sent_after == []
    finally:
        await nio.close()


async def test_a_member_leaving_rotates_the_bots_session(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    """bob (a nio device) reads the bot's answers while he is in the room; once he left,
    the bot's next answer goes out under a new session (never one bob holds), which
    alice's device reads."""
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    bot = await make_bot_user(synapse_kit)
    store = str(tmp_path / "journal.sqlite3")
    nio = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")
    bob_nio = await NioDevice.login(synapse_kit.base_url, bob.user_id, tmp_path / "bob-nio")
    try:
        async with synapse_kit.client(alice) as client:
            room = await client.create_room(
                preset="private_chat",
                initial_state=[ENCRYPTION],
                invite=[bob.user_id, bot.user_id],
            )
            await bob_nio.client.join(room)
            async with running_bot(
                synapse_kit.base_url,
                bot.user_id,
                store,
                allow=frozenset({alice.user_id}),
                passphrase=PASSPHRASE,
            ):
                await wait_joined(client, room, bot.user_id)
                await nio.wait_until(lambda: in_room(nio, room, bot.user_id))
                await bob_nio.step()

                first = await nio.send_text(room, "while bob is here")
                await eventually(
                    lambda: answered(store, bot.user_id, first), what="the first answer"
                )
                await bob_nio.wait_until(lambda: bool(echoes_of(bob_nio, "while bob is here")))
                await bob_nio.client.room_leave(room)
                await nio.wait_until(lambda: bob.user_id not in nio.client.rooms[room].users)
                second = await nio.send_text(room, "bob is gone")
                await eventually(
                    lambda: answered(store, bot.user_id, second), what="the second answer"
                )
                await nio.wait_until(lambda: bool(echoes_of(nio, "bob is gone")))
            events = await room_events(client, room)
        left = next(
            i
            for i, e in enumerate(events)
            if e.type == "m.room.member"
            and e.state_key == bob.user_id
            and e.content.get("membership") == "leave"
        )

        def bot_sessions(part: list[ClientEvent]) -> set[str]:
            return {
                e.content["session_id"]
                for e in part
                if e.sender == bot.user_id and e.type == "m.room.encrypted"
            }

        before, after = bot_sessions(events[:left]), bot_sessions(events[left:])
        assert before and after and not (before & after), (before, after)
    finally:
        await nio.close()
        await bob_nio.close()
