"""Encrypted rooms in the engine: decrypted on sync, honest UTD rows, healing in place.

The peer is a bare `CryptoMachine` behind the in-memory key server
(``e2ee_support``); the engine is the real one on SQLite.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from gapline.history import (
    Engine,
    EventItem,
    Ok,
    OpenRoom,
    OpenThread,
    SendMessage,
    SendStateKind,
    Set,
    TimelineChanged,
    TimelineReset,
    Undecrypted,
    UtdReason,
    to_wire,
)
from gapline.matrix import ClientEvent
from gapline.storage import KdfParams
from tests.e2ee.harness import Room
from tests.history.e2ee_support import MEGOLM, ROOM, Homeserver, Scene, alice_client, scene


def _events(rows):
    return [r for r in rows if isinstance(r, EventItem)]


async def test_an_encrypted_message_decrypts_on_sync(tmp_path) -> None:
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        event = s.encrypted("hello, privately")
        await s.sync(event)
        await s.engine.flush_history(ROOM)
        [row] = [r for r in _events(s.rows()) if r.event_id == event.event_id]
        assert row.body == "hello, privately"
        assert row.event_type == "m.room.message"
        assert row.encrypted and row.decryption is None
        wire = to_wire(row)["Event"]
        assert wire["encrypted"] is True and wire["decryption"] is None


async def test_a_message_without_its_key_is_a_utd_row_that_heals_by_one_set(tmp_path) -> None:
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        s.server.hold_to_device = True  # the room key is late
        first, second = s.encrypted("one"), s.encrypted("two")
        await s.sync(first, second)
        await s.engine.flush_history(ROOM)
        rows = {r.event_id: r for r in _events(s.rows())}
        for e in (first, second):
            row = rows[e.event_id]
            assert row.body is None and row.encrypted
            assert row.decryption == Undecrypted(
                e.content["session_id"], UtdReason.MISSING_ROOM_KEY
            )
            assert to_wire(row)["Event"]["decryption"] == {
                "UnableToDecrypt": {
                    "session_id": e.content["session_id"],
                    "reason": "MissingRoomKey",
                }
            }
        ids_before = [r.id for r in s.rows()]
        s.sink.events.clear()
        s.server.release_to_device()
        await s.sync()  # only to-device: the key arrives (the sync shows what healed)
        assert [r.id for r in s.rows()] == ids_before
        rows = {r.event_id: r for r in _events(s.rows())}
        assert rows[first.event_id].body == "one" and rows[second.event_id].body == "two"
        assert rows[first.event_id].decryption is None and rows[first.event_id].encrypted
        diffs = [d for e in s.sink.events if isinstance(e, TimelineChanged) for d in e.diffs]
        assert not any(isinstance(e, TimelineReset) for e in s.sink.events)
        sets = [d for d in diffs if isinstance(d, Set)]
        assert len(diffs) == len(sets) == 2
        assert {getattr(d.value, "event_id", None) for d in sets} == {
            first.event_id,
            second.event_id,
        }


async def test_a_forged_mark_from_the_server_is_dropped(tmp_path) -> None:
    import msgspec

    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        plain = s.state("m.room.message", "", {"msgtype": "m.text", "body": "clear"})
        plain = msgspec.structs.replace(
            plain, state_key=None, unsigned={"io.gapline.decryption": {}}
        )
        await s.sync(plain)
        await s.engine.flush_history(ROOM)
        [row] = [r for r in _events(s.rows()) if r.event_id == plain.event_id]
        assert row.body == "clear" and not row.encrypted


async def test_older_pages_decrypt_and_their_utds_heal(tmp_path) -> None:
    """The recent load's pages pass the same decryption as a sync's timeline."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        old = [s.encrypted(f"old {i}") for i in range(3)]
        s.hs.older.extend(old)
        newest = s.encrypted("newest")
        await s.sync(newest, prev_batch="p1")  # a gap before the newest event
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.wait_idle(ROOM)
        rows = {r.event_id: r for r in _events(s.rows())}
        assert all(rows[e.event_id].decryption is not None for e in old)
        s.server.release_to_device()
        await s.sync()
        await s.engine.flush_history(ROOM)
        rows = {r.event_id: r for r in _events(s.rows())}
        assert [rows[e.event_id].body for e in old] == ["old 0", "old 1", "old 2"]
        assert rows[newest.event_id].body == "newest"


async def test_a_healed_edit_applies_to_its_row(tmp_path) -> None:
    """An edit that could not be decrypted changed nothing; decrypted, it edits its row."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        original = s.encrypted("draft")
        await s.sync(original)
        s.server.hold_to_device = True
        # New settings rotate bob's session: the edit comes in a session alice lacks.
        s.bob.machine.set_room_encryption(ROOM, {**MEGOLM, "rotation_period_msgs": 50})
        edit = s.encrypted(
            "* final",
            **{
                "m.new_content": {"msgtype": "m.text", "body": "final"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": original.event_id},
            },
        )
        await s.sync(edit)
        await s.engine.flush_history(ROOM)
        rows = {r.event_id: r for r in _events(s.rows())}
        assert rows[original.event_id].body == "draft" and edit.event_id not in rows
        s.server.release_to_device()
        await s.sync()
        await s.engine.flush_history(ROOM)
        rows = {r.event_id: r for r in _events(s.rows())}
        assert rows[original.event_id].body == "final" and rows[original.event_id].edited
        assert edit.event_id not in rows


async def test_a_message_into_an_encrypted_room_is_sent_encrypted_and_bob_reads_it(
    tmp_path,
) -> None:
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        assert await s.engine.execute(SendMessage(ROOM, "for bob only")) == Ok()
        await s.engine.send_queue.wait_sent(1)
        [(event_type, content)] = s.hs.sent
        assert event_type == "m.room.encrypted" and "for bob only" not in json.dumps(content)
        s.bob.sync()  # the room key, over Olm
        event = ClientEvent(
            event_id="$x", type=event_type, sender="@alice:x", origin_server_ts=1, content=content
        )
        assert s.bob.body(Room(ROOM), event) == "for bob only"


async def test_no_device_to_encrypt_to_fails_closed_and_sends_nothing(tmp_path) -> None:
    async with scene(tmp_path) as s:
        await s.sync(
            s.state("m.room.member", "@carol:x", {"membership": "join"}, sender="@carol:x"),
            s.state("m.room.encryption", "", MEGOLM, sender="@carol:x"),
            s.state("m.room.member", "@alice:x", {"membership": "join"}, sender="@alice:x"),
        )
        await s.engine.execute(OpenRoom(ROOM))
        # Queued (the answer), then refused by the encrypting layer: a Failed row.
        assert await s.engine.execute(SendMessage(ROOM, "into the void")) == Ok()
        await s.engine.send_queue.wait_failed(1)
        [row] = [r for r in _events(s.rows()) if r.send_state is not None]
        state = row.send_state
        assert (
            state.kind is SendStateKind.Failed and "cannot be encrypted to anyone" in state.message
        )
        assert row.body == "into the void"  # the text is kept
        assert s.hs.sent == []


async def test_a_room_the_machine_never_saw_encrypted_is_asked_of_the_server(tmp_path) -> None:
    async with scene(tmp_path) as s:
        await s.sync(
            s.state("m.room.member", "@bob:x", {"membership": "join"}),
            s.state("m.room.member", "@alice:x", {"membership": "join"}, sender="@alice:x"),
        )
        s.bob.sync()
        await s.engine.execute(OpenRoom(ROOM))
        s.hs.state["m.room.encryption"] = MEGOLM  # state the engine's syncs never showed
        assert await s.engine.execute(SendMessage(ROOM, "careful")) == Ok()
        await s.engine.send_queue.wait_sent(1)
        assert [t for t, _ in s.hs.sent] == ["m.room.encrypted"]


async def test_a_room_the_server_says_is_not_encrypted_gets_plaintext(tmp_path) -> None:
    async with scene(tmp_path) as s:
        await s.sync(
            s.state("m.room.member", "@alice:x", {"membership": "join"}, sender="@alice:x")
        )
        await s.engine.execute(OpenRoom(ROOM))
        assert await s.engine.execute(SendMessage(ROOM, "in the clear")) == Ok()
        await s.engine.send_queue.wait_sent(1)
        assert s.hs.sent == [("m.room.message", {"msgtype": "m.text", "body": "in the clear"})]


async def _key_saved_without_its_heal(s: Scene, monkeypatch, text: str) -> ClientEvent:
    """An encrypted event retained as a hole, then its key committed by a sync whose heal
    never lands (a crash between a request's answer and its heal)."""
    from gapline.history import _sync

    await s.join_encrypted_room()
    s.server.hold_to_device = True
    event = s.encrypted(text)
    await s.sync(event)
    s.server.release_to_device()
    healing = _sync.heal_sessions

    async def lost(*args):  # the heal never commits
        return []

    monkeypatch.setattr(_sync, "heal_sessions", lost)
    await s.sync()
    monkeypatch.setattr(_sync, "heal_sessions", healing)
    return event


async def test_a_key_saved_without_its_heal_heals_at_the_next_start(tmp_path, monkeypatch) -> None:
    """A key committed while the heal of its rows did not land (a crash between a request's
    answer and its heal) is found at the next start: the rows heal then."""
    async with scene(tmp_path) as s:
        event = await _key_saved_without_its_heal(s, monkeypatch, "survives a crash")
        await s.engine.execute(OpenRoom(ROOM))
        rows = {r.event_id: r for r in _events(s.rows())}
        assert rows[event.event_id].decryption is not None  # still a hole
        server, bob = s.server, s.bob
    async with scene(tmp_path, server, bob) as s:
        await s.sync()  # the first sync of the new process opens the machine and sweeps
        await s.engine.execute(OpenRoom(ROOM))
        rows = {r.event_id: r for r in _events(s.rows())}
        assert rows[event.event_id].body == "survives a crash"


@pytest.mark.parametrize("room_first", [False, True])
async def test_the_start_sweep_runs_whoever_opens_the_machine_first(
    tmp_path, monkeypatch, room_first: bool
) -> None:
    """Opening a room before the first sync opens the machine too; the sweep still runs
    at that first sync, so a key saved without its heal still heals."""
    async with scene(tmp_path) as s:
        event = await _key_saved_without_its_heal(s, monkeypatch, "opened first")
        server, bob = s.server, s.bob
    async with scene(tmp_path, server, bob) as s:
        if room_first:  # a page load opens the machine before any sync, as _walks does
            assert s.engine.crypto is not None and await s.engine.crypto.ensure() is not None
            await s.engine.execute(OpenRoom(ROOM))
        await s.sync()
        if not room_first:
            await s.engine.execute(OpenRoom(ROOM))
        await s.engine.flush_history(ROOM)
        rows = {r.event_id: r for r in _events(s.rows())}
        assert rows[event.event_id].body == "opened first"


async def test_a_thread_reply_heals_in_the_thread_it_was_kept_in(tmp_path) -> None:
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        root = s.encrypted("a thread starts here")
        await s.sync(root)
        await s.engine.execute(OpenRoom(ROOM))
        assert await s.engine.execute(OpenThread(ROOM, root.event_id)) == Ok()
        await s.engine.wait_idle(ROOM, root.event_id)
        s.server.hold_to_device = True
        s.bob.machine.set_room_encryption(ROOM, {**MEGOLM, "rotation_period_msgs": 50})
        relates = {"rel_type": "m.thread", "event_id": root.event_id, "is_falling_back": True,
                   "m.in_reply_to": {"event_id": root.event_id}}  # fmt: skip
        reply = s.encrypted("in the thread", **{"m.relates_to": relates})
        await s.sync(reply)
        copies = await s.engine.store.all_events(ROOM, thread_root=root.event_id)
        assert [c.event.type for c in copies if c.event_id == reply.event_id] == [
            "m.room.encrypted"
        ]
        s.server.release_to_device()
        await s.sync()
        copies = await s.engine.store.all_events(ROOM, thread_root=root.event_id)
        [copy] = [c for c in copies if c.event_id == reply.event_id]
        assert copy.event.type == "m.room.message"
        assert copy.event.content["body"] == "in the thread"
        rows = [r for r in s.engine.thread(ROOM, root.event_id).state.items
                if isinstance(r, EventItem) and r.event_id == reply.event_id]  # fmt: skip
        assert [r.body for r in rows] == ["in the thread"]
        [root_row] = [r for r in _events(s.rows()) if r.event_id == root.event_id]
        assert root_row.thread_summary is not None and root_row.thread_summary.count == 1
        latest = root_row.thread_summary.latest
        assert latest is not None and latest.body == "in the thread"  # the summary heals too


async def test_a_member_leaving_rotates_the_room_session_also_after_a_restart(
    tmp_path,
) -> None:
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        assert await s.engine.execute(SendMessage(ROOM, "before")) == Ok()
        await s.engine.send_queue.wait_sent(1)
        [(_, first)] = s.hs.sent
        server, bob = s.server, s.bob
    async with scene(tmp_path, server, bob) as s:  # members seen before the restart
        await s.sync(s.state("m.room.member", "@bob:x", {"membership": "leave"}))
        await s.sync(s.state("m.room.member", "@bob:x", {"membership": "join"}))
        await s.engine.execute(OpenRoom(ROOM))
        assert await s.engine.execute(SendMessage(ROOM, "after")) == Ok()
        await s.engine.send_queue.wait_sent(1)
        [(_, second)] = s.hs.sent
        assert first["session_id"] != second["session_id"]


async def test_a_store_of_another_device_stops_the_sync_with_a_clear_error(tmp_path) -> None:
    """The crypto state belongs to the device that made it: a login as another device
    on the same store does not sync encrypted rooms without their keys."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        server = s.server
    async with (
        alice_client(server, Homeserver(), ("@alice:x", "A2")) as client,
        Engine.open(tmp_path, client, passphrase="pw", sync=False, e2ee=True,
                    kdf_cost=KdfParams.cheap()) as engine,
    ):  # fmt: skip
        engine.start_sync()
        for _ in range(500):
            if engine.sync_error is not None:
                break
            await asyncio.sleep(0.01)
        assert engine.sync_error is not None
        assert "end-to-end encryption cannot start" in engine.sync_error
        assert "A1" in engine.sync_error or "device" in engine.sync_error
