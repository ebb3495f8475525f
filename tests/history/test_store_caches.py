"""What the cache store keeps in memory between transactions: member records and name
counts, room numbers (filled only by committed transactions, dropped when a member
changes, per room, fresh after a restart; an engine sees a member's new name between
two pages of a fill), and which rooms hold no aggregate at all (a reaction written in
the same transaction, an earlier one, or before a restart, still reaches its target), and
the last sealed value of each aggregate (sealed once for its table row and its row's copy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gapline.history import EngineConfig, FillGap, HistoryRepair
from gapline.history._cache_store import CacheStore
from gapline.history._sections import Sections
from gapline.history._types import GapLifecycle
from gapline.history._updates import EventsAdded, GapAdded, MemberRecord, MembersUpdated
from gapline.history._walk_state import WalkState
from gapline.matrix import ClientEvent
from tests.history.cache_contract import open_cache
from tests.history.relations_support import make_world, open_settled, reader, rows
from tests.history.test_engine_support import gap_rows

ROOM, OTHER = "!room:example.org", "!other:example.org"
BOB = "@bob:example.org"


class Boom(Exception):
    pass


def said(n: int, sender: str = BOB) -> ClientEvent:
    return ClientEvent(
        event_id=f"$m{n}",
        type="m.room.message",
        sender=sender,
        origin_server_ts=n,
        content={"msgtype": "m.text", "body": f"m{n}"},
    )


async def names(store: CacheStore, room: str, events: list[ClientEvent]) -> dict[str, Any]:
    """Names a backwards page would give ``events`` (in a write that stores nothing)."""

    def op(tx: Any) -> dict[str, Any]:
        return Sections(store, tx, room).members.backward(events)

    return await store.backend.write(op)


async def set_member(store: CacheStore, room: str, record: MemberRecord, *, fail=False) -> None:
    def op(tx: Any) -> None:
        sections = Sections(store, tx, room)
        sections.members.set(record)
        sections.flush_members()
        if fail:
            raise Boom

    await store.backend.write(op)


@pytest.fixture
async def store(tmp_path: Path):
    opened = await open_cache(str(tmp_path / "cache.db"))
    yield opened
    await opened.backend.close()


async def test_member_records_are_cached_per_room_and_dropped_on_change(store: CacheStore) -> None:
    await set_member(store, ROOM, MemberRecord(BOB, "Bob", "join"))
    await set_member(store, OTHER, MemberRecord(BOB, "Robert", "join"))
    assert await names(store, ROOM, [said(1)]) == {"$m1": "Bob"}
    assert await names(store, OTHER, [said(2)]) == {"$m2": "Robert"}
    cache = store.relations.member_cache
    found = await store.backend.read(lambda tx: store.find_room(tx, ROOM))
    assert found is not None
    rid = found.rid
    assert cache.records(rid, [BOB]) == ({BOB: MemberRecord(BOB, "Bob", "join")}, [])
    # A change drops the room's entry at commit; the other room keeps its own.
    await set_member(store, ROOM, MemberRecord(BOB, "Bobby", "join"))
    assert cache.records(rid, [BOB]) == ({}, [BOB])
    assert await names(store, ROOM, [said(3)]) == {"$m3": "Bobby"}
    assert await names(store, OTHER, [said(4)]) == {"$m4": "Robert"}


async def test_a_clash_counted_from_the_cache_moves_with_a_member_change(
    store: CacheStore,
) -> None:
    carol = "@carol:example.org"
    await set_member(store, ROOM, MemberRecord(BOB, "Sam", "join"))
    assert await names(store, ROOM, [said(1)]) == {"$m1": "Sam"}
    await set_member(store, ROOM, MemberRecord(carol, "Sam", "join"))
    assert await names(store, ROOM, [said(2)]) == {"$m2": f"Sam ({BOB})"}
    await set_member(store, ROOM, MemberRecord(carol, "Sam", "leave"))
    assert await names(store, ROOM, [said(3)]) == {"$m3": "Sam"}


async def test_a_rolled_back_transaction_leaves_the_cache_as_it_was(store: CacheStore) -> None:
    await set_member(store, ROOM, MemberRecord(BOB, "Bob", "join"))
    assert await names(store, ROOM, [said(1)]) == {"$m1": "Bob"}
    with pytest.raises(Boom):
        await set_member(store, ROOM, MemberRecord(BOB, "Never", "join"), fail=True)
    assert await names(store, ROOM, [said(2)]) == {"$m2": "Bob"}

    def read_then_fail(tx: Any) -> None:
        Sections(store, tx, "!new:example.org").members.backward([said(3)])
        raise Boom

    with pytest.raises(Boom):
        await store.backend.write(read_then_fail)
    # Neither the room registered nor the record read in the rolled-back write is held.
    assert await store.backend.read(lambda tx: store.find_room(tx, "!new:example.org")) is None


async def test_a_write_that_changes_a_member_after_reading_it_installs_nothing_stale(
    store: CacheStore,
) -> None:
    await set_member(store, ROOM, MemberRecord(BOB, "Bob", "join"))

    def read_then_rename(tx: Any) -> None:
        sections = Sections(store, tx, ROOM)
        sections.members.backward([said(1)])  # reads Bob
        sections._emit(MembersUpdated((MemberRecord(BOB, "Renamed", "join"),)))

    await store.backend.write(read_then_rename)
    assert await names(store, ROOM, [said(2)]) == {"$m2": "Renamed"}


async def test_a_restart_reads_the_names_again(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.db")
    first = await open_cache(path)
    await set_member(first, ROOM, MemberRecord(BOB, "Bob", "join"))
    assert await names(first, ROOM, [said(1)]) == {"$m1": "Bob"}
    await first.backend.close()
    again = await open_cache(path)
    try:
        assert again.relations.member_cache.records(1, [BOB]) == ({}, [BOB])
        assert await names(again, ROOM, [said(2)]) == {"$m2": "Bob"}
    finally:
        await again.backend.close()


async def fill_the_gap(h, room: str) -> set[str]:
    """Fill the room's one gap (one page, by the config): the ids of the rows it brought."""
    held = set(rows(h, room))
    [gap] = gap_rows(h.engine.timeline(room).state.items)
    await h.engine.execute(HistoryRepair(FillGap(room, gap.id)))
    return set(rows(h, room)) - held


async def test_a_fill_names_senders_as_the_member_state_says_between_its_pages(tmp_path):
    world = make_world()
    world.fake.set_displayname("bob", "Bob")
    world.filler(3)
    config = EngineConfig(page_size=10, recent_pages=1, page_budget=1)
    async with reader(world, tmp_path, limit=3, config=config) as h:
        await h.engine.sync_once(initial=True)
        await open_settled(h, world.room)
        world.filler(40)
        await h.engine.sync_once()  # limited: a gap below its three newest events
        first = await fill_the_gap(h, world.room)
        assert len(first) == 10
        assert {rows(h, world.room)[i].sender_name for i in first} == {"Bob"}
        # Between two pages bob takes a new name: the next page (older events, named by
        # the current state since the walk passes no membership of bob's) says so.
        world.fake.set_displayname("bob", "Robert")
        await h.engine.sync_once()
        second = await fill_the_gap(h, world.room)
        assert len(second) == 10
        assert {rows(h, world.room)[i].sender_name for i in second} == {"Robert"}


def reaction_to(target: str, n: int) -> ClientEvent:
    return ClientEvent(
        event_id=f"$r{n}",
        type="m.reaction",
        sender=BOB,
        origin_server_ts=n,
        content={"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": "+1"}},
    )


def placed_item(sections: Sections, event_id: str) -> Any:
    [item] = [
        i
        for u in sections.updates
        if isinstance(u, EventsAdded) and u.items is not None
        for i in u.items
        if i.event_id == event_id
    ]
    return item


async def sync(store: CacheStore, *batches: list[ClientEvent]) -> Sections:
    """Each batch placed as one sync's timeline, all in one transaction."""

    def op(tx: Any) -> Sections:
        sections = Sections(store, tx, ROOM)
        for batch in batches:
            sections.ingest_sync(batch, limited=False, prev_batch=None)
        return sections

    return await store.backend.write(op)


async def test_a_room_of_plain_messages_is_known_to_hold_no_aggregate(store: CacheStore) -> None:
    await sync(store, [said(1)])
    await sync(store, [said(2)])
    found = await store.backend.read(lambda tx: store.find_room(tx, ROOM))
    assert found is not None
    assert store.relations.aggregate_keys.holds_none(found.rid)  # answered from memory now


async def test_a_reaction_reaches_its_target_placed_later_in_the_same_transaction(
    store: CacheStore,
) -> None:
    await sync(store, [said(1)])  # the room is known to hold no aggregate
    sections = await sync(store, [reaction_to("$m9", 2)], [said(9)])
    assert [r.key for r in placed_item(sections, "$m9").reactions] == ["+1"]


async def test_a_reaction_reaches_its_target_in_a_later_transaction_and_after_a_restart(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "cache.db")
    first = await open_cache(path)
    await sync(first, [said(1)])
    await sync(first, [reaction_to("$m8", 2)])
    sections = await sync(first, [said(8)])
    assert [r.key for r in placed_item(sections, "$m8").reactions] == ["+1"]
    await sync(first, [reaction_to("$m9", 3)])
    await first.backend.close()
    again = await open_cache(path)
    try:
        sections = await sync(again, [said(9)])
        assert [r.key for r in placed_item(sections, "$m9").reactions] == ["+1"]
    finally:
        await again.backend.close()


async def limited_room(store: CacheStore) -> str:
    """Three events, then a limited sync of three newer ones: the gap between them."""
    await sync(store, [said(1), said(2), said(3)])

    def op(tx: Any) -> str:
        sections = Sections(store, tx, ROOM)
        sections.ingest_sync([said(10), said(11), said(12)], limited=True, prev_batch="p1")
        [added] = [u for u in sections.updates if isinstance(u, GapAdded)]
        return added.gap.gap_id

    return await store.backend.write(op)


async def page(store: CacheStore, state: WalkState, chunk: list[ClientEvent], end: str) -> Any:
    return await store.backend.write(
        lambda tx: Sections(store, tx, ROOM).walk_page(state, chunk, end)
    )


@pytest.mark.parametrize("moved_between_pages", [False, True])
async def test_a_page_reads_the_gap_back_only_when_another_write_moved_it(
    store: CacheStore, moved_between_pages: bool
) -> None:
    gap_id = await limited_room(store)
    first = await page(store, WalkState(None, gap_id), [said(9), said(8)], "p2")
    assert first.state.gap == first.gap and first.gap.cursor == "p2"
    if moved_between_pages:
        await store.backend.write(
            lambda tx: Sections(store, tx, ROOM).set_gap_state(gap_id, GapLifecycle.Failed, "x")
        )
    second = await page(store, first.state, [said(7), said(6)], "p3")
    stored = await store.gap(ROOM, gap_id)
    assert stored == second.gap
    assert stored is not None and stored.cursor == "p3"
    assert stored.newer_boundary == "$m6"
    # The other write's lifecycle survives the page (a stale copy would have undone it).
    assert stored.lifecycle is (GapLifecycle.Failed if moved_between_pages else GapLifecycle.Idle)


async def stored_aggregates(store: CacheStore, event_id: str) -> tuple[bytes | None, bytes | None]:
    """The sealed aggregate of ``event_id`` as its table row and its event row hold it."""

    def op(tx: Any) -> tuple[bytes | None, bytes | None]:
        room = store.find_room(tx, ROOM)
        assert room is not None
        key = store.event_key(event_id)
        table = tx.one(
            "SELECT value FROM history_aggregate WHERE room = ? AND target = ?", (room.rid, key)
        )
        row = tx.one("SELECT agg FROM history_event WHERE room = ? AND event = ?", (room.rid, key))
        return (
            None if table is None else bytes(table[0]),
            None if row is None or row[0] is None else bytes(row[0]),
        )

    return await store.backend.read(op)


async def test_a_pages_aggregate_is_sealed_once_for_its_table_and_its_rows_copy(
    store: CacheStore,
) -> None:
    await sync(store, [said(1), reaction_to("$m1", 2)])
    table, row = await stored_aggregates(store, "$m1")
    assert table is not None and table == row  # one sealed value, written twice
    # A later reaction changes it: sealed anew, both places again the same new value.
    await sync(store, [reaction_to("$m1", 3)])
    table2, row2 = await stored_aggregates(store, "$m1")
    assert table2 is not None and table2 == row2 and table2 != table
    aggregate = await store.aggregate(ROOM, "$m1")
    assert aggregate is not None and [a.event_id for a in aggregate.annotations] == ["$r2", "$r3"]


async def test_an_unchanged_aggregate_read_sealed_is_copied_onto_its_row_as_read(
    store: CacheStore,
) -> None:
    """A reaction arrives before its target; the target's row, placed later, carries the
    table's sealed value itself (nothing sealed again), and still opens to the reaction."""
    await sync(store, [said(1)])
    await sync(store, [reaction_to("$m9", 2)])
    table, row = await stored_aggregates(store, "$m9")
    assert table is not None and row is None  # no row yet
    await sync(store, [said(9)])
    table2, row2 = await stored_aggregates(store, "$m9")
    assert table2 == table and row2 == table
    window = await store.load_window(ROOM, 10)
    assert window.items is not None
    [shown] = [i for i in window.items if getattr(i, "event_id", None) == "$m9"]
    assert [r.key for r in shown.reactions] == ["+1"]


async def test_the_sealed_aggregates_kept_are_bounded(
    store: CacheStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gapline.history import _relation_store

    monkeypatch.setattr(_relation_store, "_SEALED_KEPT", 3)
    await sync(store, [said(i) for i in range(1, 6)])
    await sync(store, [reaction_to(f"$m{i}", 10 + i) for i in range(1, 6)])
    assert 0 < len(store.relations._sealed) <= 3
    aggregate = await store.aggregate(ROOM, "$m1")  # what was forgotten is still written
    assert aggregate is not None and [a.event_id for a in aggregate.annotations] == ["$r11"]


async def test_event_hashes_are_the_keyed_blake2b_the_stored_rows_were_made_with(
    store: CacheStore,
) -> None:
    """Rows are found by their event's hash: the hash of one id and of a batch stay the
    keyed BLAKE2b-128 of the id under the store's event subkey."""
    import hashlib

    subkey = store.cipher.lookup_key("gapline/history/event-id-subkey/v1")
    ids = ["$a:x", "$b:x", "$é:x"]
    expected = [hashlib.blake2b(i.encode(), key=subkey, digest_size=16).digest() for i in ids]
    assert store.event_keys(ids) == expected
    assert [store.event_key(i) for i in ids] == expected
