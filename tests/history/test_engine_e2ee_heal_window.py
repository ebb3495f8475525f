"""A heal and the open timeline's window: healed rows are rendered only where a timeline
holds or quotes them (``RowsHealed``), the others are healed in the store alone and show
healed when they are loaded.

The peer is a bare `CryptoMachine` behind the in-memory key server
(``e2ee_support``); the engine is the real one on SQLite.
"""

from __future__ import annotations

import asyncio

from gapline.history import (
    CloseRoom,
    EventItem,
    Ok,
    OpenRoom,
    PaginateBackwards,
    ReplyStatus,
    Set,
    TimelineChanged,
)
from tests.history.e2ee_support import ROOM, Scene, scene

WINDOW = 100  # EngineConfig.open_window: the newest rows an OpenRoom loads


def _events(rows):
    return {r.event_id: r for r in rows if isinstance(r, EventItem)}


def _set_ids(s: Scene) -> list[str]:
    return [
        d.value.event_id
        for e in s.sink.events
        if isinstance(e, TimelineChanged)
        for d in e.diffs
        if isinstance(d, Set) and isinstance(d.value, EventItem)
    ]


async def test_rows_the_open_timeline_does_not_hold_heal_in_the_store_and_show_when_loaded(
    tmp_path,
) -> None:
    """The open room holds its newest rows; a heal changes those by one ``Set`` each and
    the older ones not at all, yet they are healed: scrolled to, and after reopening,
    they read as their plaintext."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        events = [s.encrypted(f"message {i}") for i in range(WINDOW + 30)]
        await s.sync(*events)
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.flush_history(ROOM)
        held = {e.event_id for e in events} & set(_events(s.rows()))
        assert len(held) == WINDOW
        s.sink.events.clear()
        s.server.release_to_device()
        await s.sync()
        await s.engine.flush_history(ROOM)
        assert sorted(_set_ids(s)) == sorted(held)
        older = [e for e in events if e.event_id not in held]
        for e in older:
            stored = await s.engine.store.event(ROOM, e.event_id)
            assert stored is not None and stored.event.type == "m.room.message"
        await s.engine.execute(PaginateBackwards(ROOM, len(older)))
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in events] == [
            f"message {i}" for i in range(len(events))
        ]
        await s.engine.execute(CloseRoom(ROOM))
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in events[-WINDOW:]] == [
            f"message {i}" for i in range(len(events) - WINDOW, len(events))
        ]


async def test_a_held_reply_quoting_a_healed_row_it_does_not_hold_quotes_its_text(
    tmp_path,
) -> None:
    """A row the timeline does not hold is still rendered when a row it holds quotes it:
    the quote shows the healed text."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        quoted = s.encrypted("the quoted words")
        filler = [s.plain(f"filler {i}") for i in range(WINDOW)]
        relates = {"m.in_reply_to": {"event_id": quoted.event_id}}
        reply = s.plain("my answer", **{"m.relates_to": relates})
        await s.sync(quoted, *filler, reply)
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.wait_quotes()
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert quoted.event_id not in rows
        quote = rows[reply.event_id].in_reply_to
        assert quote is not None and quote.body is None
        s.server.release_to_device()
        await s.sync()
        await s.engine.flush_history(ROOM)
        quote = _events(s.rows())[reply.event_id].in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Ready
        assert quote.body == "the quoted words"


async def test_rows_read_by_a_scroll_back_before_the_heal_commits_show_healed(tmp_path) -> None:
    """Older rows read before their heal commits, and placed after it committed, end
    up healed on screen: the heal's update is applied to them once they are held."""
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        events = [s.encrypted(f"message {i}") for i in range(WINDOW + 30)]
        await s.sync(*events)
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.wait_idle(ROOM)  # the recent load done: a scroll back may run
        await s.engine.flush_history(ROOM)
        store = s.engine.store
        load_older = store.load_older
        heals: list[asyncio.Task[None]] = []

        async def read_then_heal(*args, **kwargs):
            window = await load_older(*args, **kwargs)  # the undecryptable rows
            s.server.release_to_device()
            heals.append(asyncio.create_task(s.sync()))  # awaited below
            for _ in range(500):  # until the heal's write has committed
                stored = await store.event(ROOM, events[0].event_id)
                if stored is not None and stored.event.type == "m.room.message":
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the heal did not commit")
            return window

        store.load_older = read_then_heal
        assert await s.engine.execute(PaginateBackwards(ROOM, 30)) == Ok()
        await heals[0]
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in events] == [
            f"message {i}" for i in range(len(events))
        ]
