"""Healing beyond a timeline's own rows: quotes fetched on their own, events stored before
the crypto machine existed, and heals of many rows in chunks.

The peer is a bare `CryptoMachine` behind the in-memory key server
(``e2ee_support``); the engine is the real one on SQLite.
"""

from __future__ import annotations

from typing import Any

import pytest

from gapline.e2ee import export_room_keys, import_room_keys, save_changes
from gapline.history import EventItem, OpenRoom, ReplyStatus, Set, TimelineChanged, _heal_pass
from gapline.history._cache_store import rows_by_event_sql
from tests.history.e2ee_support import ROOM, scene


def _events(rows):
    return {r.event_id: r for r in rows if isinstance(r, EventItem)}


def _set_ids(published: list[Any]) -> list[str]:
    """The event ids of the rows changed in place (``Set``) in what was published."""
    return [
        d.value.event_id
        for e in published
        if isinstance(e, TimelineChanged)
        for d in e.diffs
        if isinstance(d, Set) and isinstance(d.value, EventItem)
    ]


async def test_a_quoted_event_fetched_undecryptable_heals_when_its_key_arrives(tmp_path) -> None:
    """A reply quotes an event the cache does not hold; ``/context`` returns it encrypted
    before its key is here (a UTD quote). When the key arrives the quote shows its text."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True  # the session's key is late
        quoted = s.encrypted("the quoted words")
        s.hs.context[quoted.event_id] = quoted  # never in a sync: only /context has it
        relates = {"m.in_reply_to": {"event_id": quoted.event_id}}
        reply = s.encrypted("my answer", **{"m.relates_to": relates})
        await s.sync(reply, prev_batch="p1")  # a gap before the reply
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.wait_quotes()
        await s.engine.flush_history(ROOM)
        row = _events(s.rows())[reply.event_id]
        assert row.body is None  # the reply itself waits for the key too
        assert row.in_reply_to is not None and row.in_reply_to.body is None
        s.server.release_to_device()
        await s.sync()  # the key arrives
        await s.engine.flush_history(ROOM)
        row = _events(s.rows())[reply.event_id]
        assert row.body == "my answer"
        quote = row.in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Ready
        assert quote.body == "the quoted words"


async def test_events_stored_before_encryption_was_on_heal_once_the_key_is_known(
    tmp_path,
) -> None:
    """An engine without a crypto machine keeps encrypted events as they came (unmarked).
    When the machine first opens on that store it indexes them, so a key imported later
    heals them at the next start like any retained undecryptable event."""
    async with scene(tmp_path, e2ee=False) as s:
        await s.join_encrypted_room()
        early = s.encrypted("sent before this device decrypted anything")
        await s.sync(early)
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.flush_history(ROOM)
        assert _events(s.rows())[early.event_id].body is None
        server, bob = s.server, s.bob
    async with scene(tmp_path, server, bob) as s:
        await s.sync()  # the machine opens: the old ciphertext is indexed
        crypto = s.engine.crypto
        assert crypto is not None and crypto.driver is not None
        machine = crypto.driver.machine
        text = export_room_keys(bob.machine, "file secret", room_ids=[ROOM], rounds=1000)
        report = import_room_keys(machine, text, "file secret")  # as `gapline keys import`
        assert report.imported
        changes = machine.take_changes()
        await s.engine.store.backend.write(lambda tx: save_changes(tx, changes))
    async with scene(tmp_path, server, bob) as s:
        await s.sync()  # the start-up sweep heals what the imported key decrypts
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.flush_history(ROOM)
        row = _events(s.rows())[early.event_id]
        assert row.body == "sent before this device decrypted anything"
        assert row.encrypted and row.decryption is None


async def test_a_heal_of_many_rows_in_chunks_changes_each_loaded_row_once(
    tmp_path, monkeypatch
) -> None:
    """A session's rows heal in several chunks (each its own write): every row changes
    by one ``Set``, in place, and none is left a hole."""
    monkeypatch.setattr(_heal_pass, "CHUNK", 3)
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        s.server.hold_to_device = True
        events = [s.encrypted(f"message {i}") for i in range(10)]
        await s.sync(*events)
        await s.engine.flush_history(ROOM)
        ids_before = [r.id for r in s.rows()]
        s.sink.events.clear()
        s.server.release_to_device()
        await s.sync()
        assert [r.id for r in s.rows()] == ids_before
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in events] == [f"message {i}" for i in range(10)]
        assert sorted(_set_ids(s.sink.events)) == sorted(e.event_id for e in events)


@pytest.mark.parametrize("plain_between", [1, 3])
async def test_a_chunk_read_as_a_range_heals_only_its_own_rows(
    tmp_path, monkeypatch, plain_between: int
) -> None:
    """A chunk's rows are read as the range of positions they span when they are dense
    (one plaintext row after each), else by their event ids (three after each): either
    way only the session's rows heal, and the plaintext ones between are left as they
    were (no ``Set``)."""
    monkeypatch.setattr(_heal_pass, "CHUNK", 4)
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        s.server.hold_to_device = True
        events, plain = [], []
        for i in range(9):
            events.append(s.encrypted(f"message {i}"))
            plain.extend(s.plain(f"plain {i}.{j}") for j in range(plain_between))
        mixed = [
            e
            for i, e in enumerate(events)
            for e in (e, *plain[i * plain_between : (i + 1) * plain_between])
        ]
        await s.sync(*mixed)
        await s.engine.flush_history(ROOM)
        s.sink.events.clear()
        s.server.release_to_device()
        await s.sync()
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in events] == [f"message {i}" for i in range(9)]
        assert [rows[e.event_id].body for e in plain] == [e.content["body"] for e in plain]
        assert sorted(_set_ids(s.sink.events)) == sorted(e.event_id for e in events)


@pytest.mark.parametrize("failing_chunk", [0, 1])
async def test_a_heal_interrupted_between_chunks_is_finished_at_the_next_start(
    tmp_path, monkeypatch, failing_chunk: int
) -> None:
    """The key is committed before its rows heal: a write that fails mid-heal leaves the
    healed chunks healed and the rest indexed, and the next start finishes the heal."""
    monkeypatch.setattr(_heal_pass, "CHUNK", 4)
    heal = _heal_pass.heal
    calls = []

    def failing(store, tx, room_id, healed, entries):
        calls.append(len(healed))
        if len(calls) == failing_chunk + 1:
            raise OSError("the disk went away")
        return heal(store, tx, room_id, healed, entries)

    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        events = [s.encrypted(f"message {i}") for i in range(10)]
        await s.sync(*events)
        s.server.release_to_device()
        monkeypatch.setattr(_heal_pass, "heal", failing)
        with pytest.raises(OSError, match="disk went away"):
            await s.sync()
        monkeypatch.setattr(_heal_pass, "heal", heal)
        server, bob = s.server, s.bob
    async with scene(tmp_path, server, bob) as s:
        await s.sync()  # the sweep finds the committed key and its rows still indexed
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in events] == [f"message {i}" for i in range(10)]


async def test_a_heal_reads_its_rows_through_the_event_index_on_sqlite(tmp_path) -> None:
    """The heal's read of a chunk of rows by their event hashes goes through the
    ``(room, event)`` index: SQLite's plan for a long ``IN`` list otherwise scans the
    whole room for every chunk. Read back, the rows are the ones asked for."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        events = [s.encrypted(f"message {i}") for i in range(5)]
        await s.sync(*events)
        store = s.engine.store
        asked = [store.event_key(e.event_id) for e in events[1:4]]
        wanted = [*asked, *(bytes(16) for _ in range(400 - len(asked)))]

        def read(tx):
            room = store.find_room(tx, ROOM)
            assert room is not None
            sql = rows_by_event_sql(tx.dialect, len(wanted))
            plan = " ".join(str(row[-1]) for row in tx.all("EXPLAIN QUERY PLAN " + sql,
                                                            (room.rid, *wanted)))  # fmt: skip
            return plan, [bytes(row[2]) for row in tx.all(sql, (room.rid, *wanted))]

        plan, found = await store.backend.read(read)
        assert "USING INDEX history_event_by_id" in plan
        assert sorted(found) == sorted(asked)
