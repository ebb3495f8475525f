"""The history cache's contract (``CacheStore`` with the rules ``Sections`` applies), run on
every backend: dedup, joins only on overlap, cursors never dropped, durability across reopen.

``CacheStoreContract`` is not collected by itself (its name does not start with
``Test``); ``test_cache_sqlite.py`` and ``test_cache_postgres.py`` subclass it with
a ``dsn`` fixture and then delete the name so it is not collected twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gapline.history._aggregates import Aggregate
from gapline.history._cache_schema import HISTORY_MIGRATIONS
from gapline.history._cache_store import CacheStore
from gapline.history._decryption import MARK
from gapline.history._healing import (
    UTD_MIGRATIONS,
    UTD_SCHEMA,
    drop_entries,
    index_undecrypted,
    pending_heal,
    retained_chunk,
)
from gapline.history._sections import Sections
from gapline.history._types import GapLifecycle
from gapline.history._updates import (
    AggregateChanged,
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRemoved,
    ReceiptsChanged,
    RelationIndexed,
    Room,
)
from gapline.history._walk_state import WalkState
from gapline.matrix import ClientEvent
from gapline.storage import Backend, Dialect, KdfParams, open_backend, open_cipher

ROOM = "!room:example.org"

OpenStore = Callable[[], Awaitable[CacheStore]]
"""Open the cache on the test's database (again: a reopen reads what was committed)."""


def ev(n: int | str, kind: str = "m.room.message") -> ClientEvent:
    return ClientEvent(
        event_id=f"$e{n}",
        type=kind,
        sender="@a:example.org",
        origin_server_ts=int(n) if isinstance(n, int) else 0,
        content={"body": f"b{n}"},
    )


async def write(store: CacheStore, fn: Callable[[Sections], Any]) -> Any:
    def op(tx):
        sections = Sections(store, tx, ROOM)
        return fn(sections), sections.updates

    return await store.backend.write(op)


async def ids(store: CacheStore) -> list[str]:
    return [e.event_id for e in await store.all_events(ROOM)]


def react(target: str, n: int) -> ClientEvent:
    return ClientEvent(
        event_id=f"$r{n}",
        type="m.reaction",
        sender="@a:example.org",
        origin_server_ts=100 + n,
        content={"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": "+1"}},
    )


async def reactions_placed(store: CacheStore, event: ClientEvent) -> list[str]:
    """The reaction keys ``event``'s row gets when a later sync places it."""
    _, updates = await write(store, lambda s: s.ingest_sync([event], limited=False, prev_batch="p"))
    [item] = [
        i
        for u in updates
        if isinstance(u, EventsAdded) and u.items is not None
        for i in u.items
        if i.event_id == event.event_id
    ]
    return [r.key for r in item.reactions]


def room_in(store: CacheStore, tx: Any) -> Room:
    """The test room's row (it must be known by now)."""
    room = store.find_room(tx, ROOM)
    assert room is not None
    return room


async def seen(store: CacheStore, event_ids: list[str]) -> set[str]:
    """Those of ``event_ids`` the relation index says were seen (in a write, as the rules
    ask)."""

    def op(tx: Any) -> set[str]:
        room = room_in(store, tx)
        return set(store.relations.indexed(tx, room, event_ids))

    return await store.backend.write(op)


async def open_cache(dsn: str) -> CacheStore:
    backend = await open_backend(dsn)
    cipher = await open_cipher(backend, "pw", kdf_cost=KdfParams.cheap())
    return await CacheStore.open(backend, cipher)


def history_indexes(tx: Any) -> set[str]:
    """The names of the history tables' indexes, as this backend's catalogue lists them."""
    if tx.dialect is Dialect.SQLITE:
        sql = "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'history%'"
    else:
        sql = (
            "SELECT indexname FROM pg_indexes"
            " WHERE schemaname = current_schema() AND indexname LIKE 'history%'"
        )
    return {str(row[0]) for row in tx.all(sql, ())}


class CacheStoreContract:
    """Subclass with a ``dsn`` fixture naming a fresh database of one backend."""

    @pytest.fixture
    def dsn(self) -> str:
        raise NotImplementedError("a backend's test module provides the database")

    @pytest.fixture
    async def open_store(self, dsn: str) -> AsyncIterator[OpenStore]:
        opened: list[Backend] = []

        async def open_store() -> CacheStore:
            store = await open_cache(dsn)
            opened.append(store.backend)
            return store

        yield open_store
        for backend in opened:  # closing twice is harmless; a test may close early
            await backend.close()

    async def test_history_survives_reopen(self, open_store: OpenStore) -> None:
        store = await open_store()
        await write(
            store, lambda s: s.ingest_sync([ev(i) for i in range(5)], limited=True, prev_batch="p1")
        )
        await write(
            store,
            lambda s: s.ingest_sync([ev(i) for i in range(20, 25)], limited=True, prev_batch="p2"),
        )
        gaps_before = await store.all_gaps(ROOM)
        await store.backend.close()
        store = await open_store()
        assert await ids(store) == [f"$e{i}" for i in (*range(5), *range(20, 25))]
        assert await store.all_gaps(ROOM) == gaps_before
        [top, middle] = gaps_before
        assert (top.is_top, top.cursor) == (True, "p1")
        assert (middle.older_boundary, middle.newer_boundary, middle.cursor) == (
            "$e4",
            "$e20",
            "p2",
        )
        await store.backend.close()

    async def test_sync_dedups_and_appends_when_not_limited(self, open_store: OpenStore) -> None:
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1), ev(2)], limited=False, prev_batch="p"))
        _, updates = await write(
            store, lambda s: s.ingest_sync([ev(2), ev(3), ev(3)], limited=False, prev_batch="q")
        )
        assert await ids(store) == ["$e1", "$e2", "$e3"]
        assert [type(u) for u in updates] == [EventsAdded]
        # A limited sync whose oldest events overlap the newest retained one is continuous.
        _, updates = await write(
            store, lambda s: s.ingest_sync([ev(3), ev(4)], limited=True, prev_batch="r")
        )
        assert [type(u) for u in updates] == [EventsAdded]
        assert len(await store.all_gaps(ROOM)) == 1  # just the top
        await store.backend.close()

    async def test_walk_fills_then_joins_on_overlap_only(self, open_store: OpenStore) -> None:
        store = await open_store()
        await write(
            store, lambda s: s.ingest_sync([ev(i) for i in range(3)], limited=True, prev_batch="p")
        )
        await write(
            store,
            lambda s: s.ingest_sync([ev(i) for i in range(10, 12)], limited=True, prev_batch="c0"),
        )
        [_, gap] = await store.all_gaps(ROOM)
        # Page 1 (newest first): 9..6, nothing retained: the gap stays, its boundary moves.
        result, updates = await write(
            store,
            lambda s: s.walk_page(
                WalkState(None, gap.gap_id), [ev(i) for i in range(9, 5, -1)], "c1"
            ),
        )
        assert (result.inserted, result.joined, result.start_reached) == (4, False, False)
        assert [type(u) for u in updates] == [EventsAdded, GapChanged]
        [_, gap] = await store.all_gaps(ROOM)
        assert (gap.newer_boundary, gap.cursor) == ("$e6", "c1")
        # Page 2: 5..3 new, then 2 is retained below: joined, gap removed.
        result, updates = await write(
            store, lambda s: s.walk_page(result.state, [ev(i) for i in range(5, 0, -1)], "c2")
        )
        assert (result.inserted, result.joined) == (3, True)
        assert [type(u) for u in updates] == [EventsAdded, GapRemoved]
        assert await ids(store) == [f"$e{i}" for i in range(12)]
        assert [g.is_top for g in await store.all_gaps(ROOM)] == [True]
        await store.backend.close()

    async def test_walk_reaching_creation_makes_gap_unavailable(
        self, open_store: OpenStore
    ) -> None:
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev("x")], limited=False, prev_batch=None))
        await write(store, lambda s: s.ingest_sync([ev(10)], limited=True, prev_batch="c0"))
        [_, gap] = await store.all_gaps(ROOM)
        result, _ = await write(
            store,
            lambda s: s.walk_page(
                WalkState(None, gap.gap_id), [ev(9), ev(8, "m.room.create")], "still-a-token"
            ),
        )
        assert result.start_reached and not result.joined
        [_, gap] = await store.all_gaps(ROOM)
        assert (gap.lifecycle, gap.cursor) == (GapLifecycle.Unavailable, None)
        await store.backend.close()

    async def test_recent_walk_creates_a_section_and_gap_in_one_page(
        self, open_store: OpenStore
    ) -> None:
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1), ev(2)], limited=True, prev_batch="p"))
        result, updates = await write(
            store, lambda s: s.walk_page(WalkState(), [ev(i) for i in range(60, 50, -1)], "c1")
        )
        assert [type(u) for u in updates] == [EventsAdded, GapAdded]
        gap = result.gap
        assert gap is not None and (gap.older_boundary, gap.newer_boundary, gap.cursor) == (
            "$e2",
            "$e51",
            "c1",
        )
        # A later recent walk meeting the newest event walks on to that gap: the cursor of a
        # page that ended above the gap's boundary is not the gap's cursor.
        result, updates = await write(store, lambda s: s.walk_page(WalkState(), [ev(60)], "z"))
        assert not result.joined and updates == []
        assert result.state.anchor == (gap.newer_ord, -9)
        assert [g.cursor for g in await store.all_gaps(ROOM)] == ["p", "c1"]

    async def test_recent_walk_meeting_continuous_history_is_done(
        self, open_store: OpenStore
    ) -> None:
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1), ev(2)], limited=True, prev_batch="p"))
        result, updates = await write(
            store, lambda s: s.walk_page(WalkState(), [ev(2), ev(1)], "z")
        )
        assert result.joined and updates == []
        await store.backend.close()

    async def test_sync_after_a_recent_load_places_older_events_before_shared_ones(
        self, open_store: OpenStore
    ) -> None:
        """A recent load committed the newest events first; the first (limited) sync then
        brings older events followed by those same events. The older ones go *before* them,
        and the sync's prev_batch becomes the cursor of the gap below (the top here)."""
        store = await open_store()
        await write(
            store, lambda s: s.walk_page(WalkState(), [ev(i) for i in range(9, 4, -1)], "w1")
        )
        await write(
            store,
            lambda s: s.ingest_sync([ev(i) for i in range(1, 10)], limited=True, prev_batch="p"),
        )
        assert await ids(store) == [f"$e{i}" for i in range(1, 10)]
        [top] = await store.all_gaps(ROOM)
        assert (top.is_top, top.newer_boundary, top.cursor) == (True, "$e1", "p")
        await store.backend.close()

    async def test_sync_neighbours_across_a_gap_close_it(self, open_store: OpenStore) -> None:
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1), ev(2)], limited=True, prev_batch="p"))
        await write(store, lambda s: s.ingest_sync([ev(5), ev(6)], limited=True, prev_batch="q"))
        assert len(await store.all_gaps(ROOM)) == 2
        # A later sync shows 2, 3, 4, 5 in a row: 3 and 4 fill the gap, which is proven closed.
        _, updates = await write(
            store,
            lambda s: s.ingest_sync([ev(i) for i in range(2, 7)], limited=True, prev_batch="r"),
        )
        assert await ids(store) == [f"$e{i}" for i in range(1, 7)]
        assert [g.is_top for g in await store.all_gaps(ROOM)] == [True]
        assert [type(u) for u in updates] == [EventsAdded, GapChanged, GapRemoved]
        await store.backend.close()

    async def test_reads_writes_receipts_and_the_sync_token(self, open_store: OpenStore) -> None:
        """Windows, older rows, a walk that joins, receipts and the sync token, end to end."""
        store = await open_store()
        await write(
            store, lambda s: s.ingest_sync([ev(i) for i in range(3)], limited=True, prev_batch="p")
        )
        await write(
            store,
            lambda s: s.ingest_sync([ev(i) for i in range(10, 12)], limited=True, prev_batch="c0"),
        )
        [_, gap] = await store.all_gaps(ROOM)
        result, _ = await write(
            store,
            lambda s: s.walk_page(
                WalkState(None, gap.gap_id), [ev(i) for i in range(9, 5, -1)], "c1"
            ),
        )
        assert not result.joined
        window = await store.load_window(ROOM, 100)
        assert [e.event_id for e in window.events] == [
            f"$e{i}" for i in (0, 1, 2, 6, 7, 8, 9, 10, 11)
        ]
        assert [(g.older_boundary, g.newer_boundary, g.cursor) for g in window.gaps] == [
            ("$e2", "$e6", "c1")
        ]
        older = await store.load_older(ROOM, window.events[3].key, 2)
        assert [e.event_id for e in older.events] == ["$e1", "$e2"]
        result, _ = await write(
            store, lambda s: s.walk_page(result.state, [ev(5), ev(4), ev(3), ev(2)], "c2")
        )
        assert result.joined
        assert await ids(store) == [f"$e{i}" for i in range(12)]
        await write(store, lambda s: s.set_receipts({"@b:x": "$e3"}, "$e4"))
        assert (await store.load_window(ROOM, 5)).receipts == {"@b:x": "$e3"}
        await store.backend.write(lambda tx: store.put_sync_token(tx, "s9"))
        assert await store.sync_token() == "s9"

    async def test_sync_receipts_merge_and_emit_only_when_something_moved(
        self, open_store: OpenStore
    ) -> None:
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1), ev(2)], limited=False, prev_batch=None))
        _, updates = await write(
            store, lambda s: s.ingest_receipts({"$e1": {"m.read": {"@b:x": {"ts": 1}}}}, None)
        )
        assert updates == [ReceiptsChanged((("@b:x", "$e1"),), None)]
        # Another reader, and @b moves on: merged with what was retained.
        _, updates = await write(
            store,
            lambda s: s.ingest_receipts({"$e2": {"m.read": {"@b:x": {}, "@c:x": {}}}}, "$e2"),
        )
        assert updates == [ReceiptsChanged((("@b:x", "$e2"), ("@c:x", "$e2")), "$e2")]
        window = await store.load_window(ROOM, 5)
        assert (window.receipts, window.fully_read) == ({"@b:x": "$e2", "@c:x": "$e2"}, "$e2")
        # The same again moves nothing; a receipt of another type is not a read receipt.
        _, updates = await write(
            store,
            lambda s: s.ingest_receipts(
                {"$e2": {"m.read": {"@c:x": {}}}, "$e1": {"m.read.private": {"@d:x": {}}}}, "$e2"
            ),
        )
        assert updates == []
        _, updates = await write(store, lambda s: s.ingest_receipts({}, None))
        assert updates == []

    async def test_relation_rules_hold_on_this_backend(self, open_store: OpenStore) -> None:
        """Edits, reactions, thread replies and a redaction through the relation tables,
        durable across a reopen (every statement of the rules runs on this backend)."""
        store = await open_store()

        def rel(n: int, kind: str, content: dict[str, Any]) -> ClientEvent:
            return ClientEvent(
                event_id=f"$r{n}", type=kind, sender="@a:example.org",
                origin_server_ts=100 + n, content=content,
            )  # fmt: skip

        edit = {
            "msgtype": "m.text", "body": "* new", "m.new_content": {"body": "new"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$e1"},
        }  # fmt: skip
        react = {"m.relates_to": {"rel_type": "m.annotation", "event_id": "$e1", "key": "k"}}
        thread = {"body": "t", "m.relates_to": {"rel_type": "m.thread", "event_id": "$e2"}}
        events = [
            ev(1), ev(2), rel(1, "m.room.message", edit), rel(2, "m.reaction", react),
            rel(3, "m.room.message", thread), rel(4, "m.room.redaction", {"redacts": "$e2"}),
        ]  # fmt: skip
        await write(store, lambda s: s.ingest_sync(events, limited=True, prev_batch="p"))
        await store.backend.close()
        store = await open_store()
        window = await store.load_window(ROOM, 10)
        assert window.items is not None
        assert [e.event_id for e in window.events] == ["$e1", "$e2"]  # relations are no rows
        first, second = window.items
        assert (first.body, first.edited, [r.key for r in first.reactions]) == ("new", True, ["k"])
        assert (second.redacted, second.body) == (True, None)
        assert second.thread_summary is not None and second.thread_summary.count == 1
        await store.backend.close()

    async def test_a_store_written_with_the_by_target_index_loses_only_that_index(
        self, dsn: str, open_store: OpenStore
    ) -> None:
        """Migration 4 on a store at version 3: that index goes, every other stays, and
        the relation rules run as before."""
        backend = await open_backend(dsn)
        await backend.migrate("history", HISTORY_MIGRATIONS[:3])
        before = await backend.read(history_indexes)
        await backend.close()
        assert "history_relation_by_target" in before
        store = await open_store()
        assert await store.backend.read(history_indexes) == before - {"history_relation_by_target"}
        edit = ClientEvent(
            event_id="$r1", type="m.room.message", sender="@a:example.org", origin_server_ts=200,
            content={
                "body": "* new", "m.new_content": {"body": "new"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": "$e1"},
            },
        )  # fmt: skip
        await write(store, lambda s: s.ingest_sync([ev(1), edit], limited=True, prev_batch="p"))
        window = await store.load_window(ROOM, 10)
        assert window.items is not None
        assert [(i.body, i.edited) for i in window.items] == [("new", True)]

    async def test_a_relation_in_a_later_transaction_finds_what_an_earlier_one_wrote(
        self, open_store: OpenStore
    ) -> None:
        """The per-room key sets (``_key_sets``) never hide a row: an aggregate written
        before its target arrives, and a relation event seen before, are found by a later
        transaction, in the same store and after a reopen."""
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1)], limited=False, prev_batch="p"))
        await write(
            store, lambda s: s.ingest_sync([react("$e9", 1)], limited=False, prev_batch="p")
        )
        assert await reactions_placed(store, ev(9)) == ["+1"]
        await write(
            store, lambda s: s.ingest_sync([react("$e8", 2)], limited=False, prev_batch="p")
        )
        await store.backend.close()
        store = await open_store()
        assert await seen(store, ["$r1", "$r2", "$r3"]) == {"$r1", "$r2"}
        assert await reactions_placed(store, ev(8)) == ["+1"]
        await store.backend.close()

    async def test_a_gap_is_read_from_the_last_write_only_while_nothing_moved_it(
        self, open_store: OpenStore
    ) -> None:
        """``gap`` answers from the last committed gap write without a read, and only
        while no gap write of the room has been made since: a rolled-back write, a later
        write and a reopen all make it read the row again, and every answer equals the
        row."""
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1)], limited=False, prev_batch=None))
        await write(store, lambda s: s.ingest_sync([ev(10)], limited=True, prev_batch="c0"))
        [_, made] = await store.all_gaps(ROOM)

        def row(tx: Any) -> Any:
            return store.gap_by_id(tx, room_in(store, tx), made.gap_id)

        reads = 0
        real_read = store.backend.read

        async def counted(op: Any) -> Any:
            nonlocal reads
            reads += 1
            return await real_read(op)

        setattr(store.backend, "read", counted)  # noqa: B010 - counts the reads
        assert await store.gap(ROOM, made.gap_id) == made
        assert reads == 0  # the limited sync's own write says what the row holds

        def moved_then_failed(s: Sections) -> None:
            s.set_gap_state(made.gap_id, GapLifecycle.Failed, "boom")
            raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            await write(store, moved_then_failed)
        assert await store.gap(ROOM, made.gap_id) == made  # the row, read back
        assert reads == 1
        assert await store.gap(ROOM, made.gap_id) == made
        assert reads == 2  # still read: nothing committed since the rollback

        await write(store, lambda s: s.set_gap_state(made.gap_id, GapLifecycle.Failed, "boom"))
        await write(store, lambda s: s.set_gap_state(made.gap_id, GapLifecycle.Paused))
        paused = await store.gap(ROOM, made.gap_id)
        assert reads == 2
        assert paused == await store.backend.write(row)
        assert paused is not None
        assert (paused.lifecycle, paused.failure) == (GapLifecycle.Paused, None)

        result, _ = await write(
            store, lambda s: s.walk_page(WalkState(None, made.gap_id), [ev(9), ev(8)], "c1")
        )
        walked = await store.gap(ROOM, made.gap_id)
        assert reads == 2
        assert walked == await store.backend.write(row) == result.gap
        assert walked is not None and (walked.cursor, walked.newer_boundary) == ("c1", "$e8")
        await write(store, lambda s: s.walk_page(result.state, [ev(7), ev(1)], "c2"))
        assert await store.gap(ROOM, made.gap_id) is None  # joined: the gap is gone
        assert reads == 3
        await store.backend.close()

        store = await open_store()  # a new process knows nothing of earlier writes
        assert await store.gap(ROOM, made.gap_id) is None
        assert [g.is_top for g in await store.all_gaps(ROOM)] == [True]
        await store.backend.close()

    async def test_a_load_of_a_rooms_keys_racing_a_write_hides_nothing(
        self, open_store: OpenStore
    ) -> None:
        """A read loads the room's keys while a write that already added its keys has not
        committed (so the read cannot see its rows): once it commits, neither its aggregate
        nor its relation is hidden from a later transaction."""
        store = await open_store()
        await write(store, lambda s: s.ingest_sync([ev(1)], limited=False, prev_batch="p"))
        await store.backend.close()
        store = await open_store()  # nothing known of the room's keys
        reached, go = threading.Event(), threading.Event()
        held = Aggregate(redacted_by="$x")

        def writes(tx: Any) -> None:
            room = room_in(store, tx)
            store.relations.write(tx, room, AggregateChanged((("$e9", held, False),)))
            store.relations.write(tx, room, RelationIndexed((("$r1", "$e9", "annotation"),)))
            reached.set()  # keys added, rows written, not committed
            assert go.wait(30)

        def loads(tx: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            room = room_in(store, tx)
            rel = store.relations
            return rel.aggregates(tx, room, ["$e9"]), rel.indexed(tx, room, ["$r1"])

        writer = asyncio.create_task(store.backend.write(writes))
        try:
            assert await asyncio.to_thread(reached.wait, 30)
            assert await store.backend.read(loads) == ({}, {})  # the load read no row
        finally:
            go.set()
        await writer
        assert await seen(store, ["$r1"]) == {"$r1"}

        def later(tx: Any) -> dict[str, Any]:
            room = room_in(store, tx)
            return store.relations.aggregates(tx, room, ["$e1", "$e9"])

        assert await store.backend.write(later) == {"$e9": held}
        await store.backend.close()

    async def test_a_heals_chunks_read_their_own_rows_and_drop_their_entries(
        self, open_store: OpenStore
    ) -> None:
        """The retained undecryptable rows of a session, read in chunks as a heal reads
        them: a dense chunk as the range of positions it spans (the plaintext rows
        between are not its own), a sparse one by event id; dropping a chunk's entries
        leaves the others'."""
        store = await open_store()
        await store.backend.migrate(UTD_SCHEMA, UTD_MIGRATIONS)

        def utd(n: int) -> ClientEvent:
            mark = {MARK: {"session_id": "s1", "reason": "missing_room_key"}}
            return ClientEvent(
                event_id=f"$u{n}",
                type="m.room.encrypted",
                sender="@a:example.org",
                origin_server_ts=n,
                content={"algorithm": "m.megolm.v1.aes-sha2", "session_id": "s1"},
                unsigned=mark,
            )

        # 6 UTD rows each followed by a plaintext row, then 3 each followed by five
        events = [e for n in range(6) for e in (utd(n), ev(100 + n))]
        events += [
            e for n in range(6, 9) for e in (utd(n), *(ev(200 + 10 * n + k) for k in range(5)))
        ]

        def ingest(s: Sections) -> None:
            s.ingest_sync(events, limited=True, prev_batch="p")
            index_undecrypted(store, s.tx, ROOM, events)

        await write(store, ingest)
        plan = await store.backend.read(lambda tx: pending_heal(store, tx, ROOM, ["s1"]))
        assert plan is not None and len(plan.rows) == 9
        dense, sparse = plan.rows[:6], plan.rows[6:]
        for part, expected in ((dense, range(6)), (sparse, range(6, 9))):
            found, stale = await store.backend.read(
                lambda tx, p=part: retained_chunk(store, tx, plan.room, p)
            )
            assert [s.event_id for s, _, _ in found] == [f"$u{n}" for n in expected]
            assert stale == []
        await store.backend.write(
            lambda tx: drop_entries(tx, plan.room, [(e, k) for _, _, e, k in dense])
        )
        left = await store.backend.read(lambda tx: pending_heal(store, tx, ROOM, ["s1"]))
        assert left is not None and left.rows == sparse
        await store.backend.close()
