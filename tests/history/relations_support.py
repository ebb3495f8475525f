"""Helpers for the relation-rule tests (no tests here): a reader's engine on the fake
homeserver, a second account writing raw events, and readers of what was published."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gapline.history import (
    EngineConfig,
    EventItem,
    FillGap,
    HistoryRepair,
    Ok,
    OpenRoom,
    RetryRecent,
    TimelineChanged,
    TimelineReset,
    apply_diffs,
)
from gapline.matrix.testing import FakeHomeserver
from tests.history.test_engine_support import (
    NO_RETRY,
    Harness,
    assert_mirror_matches,
    gap_rows,
    no_sleep,
    open_engine,
)

CONFIG = EngineConfig(page_size=10, recent_pages=1, page_budget=10)


def text(body: str, **extra: Any) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": body, **extra}


def edit_of(target: str, body: str, **new: Any) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": "* " + body,
        "m.new_content": new or {"msgtype": "m.text", "body": body},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


def reaction(target: str, key: str | None) -> dict[str, Any]:
    rel: dict[str, Any] = {"rel_type": "m.annotation", "event_id": target}
    if key is not None:
        rel["key"] = key
    return {"m.relates_to": rel}


def thread_reply(root: str, body: str) -> dict[str, Any]:
    relates = {
        "rel_type": "m.thread",
        "event_id": root,
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": root},
    }
    return text(body, **{"m.relates_to": relates})


def reply_to(target: str, body: str, fallback: str | None = None) -> dict[str, Any]:
    full = body if fallback is None else f"> <@x:example.org> {fallback}\n\n{body}"
    return text(full, **{"m.relates_to": {"m.in_reply_to": {"event_id": target}}})


@dataclass
class World:
    """The fake, a reader (alice, whose engine runs) and a writer (bob), one room."""

    fake: FakeHomeserver
    alice: Any
    bob: Any
    room: str

    def send(self, event_type: str, content: dict[str, Any], *, by: str = "bob") -> str:
        return self.fake.send_event(by, self.room, event_type, content)

    def say(self, body: str, *, by: str = "bob") -> str:
        return self.send("m.room.message", text(body), by=by)

    def filler(self, n: int) -> None:
        for i in range(n):
            self.say(f"filler {i}")


def make_world(name: str = "relations") -> World:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    bob = fake.register("bob")
    room = fake.create_room(alice.user_id, name=name, members=[bob.user_id])
    return World(fake, alice, bob, room)


@contextlib.asynccontextmanager
async def reader(
    world: World, store: Path, *, limit: int = 50, config: EngineConfig = CONFIG, **kw: Any
) -> AsyncGenerator[Harness]:
    async with (
        world.fake.client(world.alice, retry=NO_RETRY, sleep=no_sleep) as client,
        open_engine(store, client, config=config, sync_timeline_limit=limit, **kw) as h,
    ):
        yield h


async def open_settled(h: Harness, room: str) -> None:
    assert await h.engine.execute(OpenRoom(room)) == Ok()
    await h.engine.execute(HistoryRepair(RetryRecent(room)))


async def fill_all(h: Harness, room: str) -> None:
    """Fill every gap of the room until none is left."""
    for _ in range(30):
        gaps = gap_rows(h.engine.timeline(room).state.items)
        if not gaps:
            return
        await h.engine.execute(HistoryRepair(FillGap(room, gaps[0].id)))
    raise AssertionError("gaps never closed")


def rows(h: Harness, room: str) -> dict[str, EventItem]:
    """The room's event rows by event id (after checking the mirror equals the engine)."""
    assert_mirror_matches(h, room)
    items = h.engine.timeline(room).state.items
    return {i.event_id: i for i in items if isinstance(i, EventItem)}


def every_row_ever(h: Harness, room: str) -> list[EventItem]:
    """Every event row any published reset or diff of the room's timeline ever carried."""
    out: list[EventItem] = []
    items: tuple = ()
    for event in h.recorder.events:
        if isinstance(event, TimelineReset) and event.room_id == room and not event.thread_root:
            items = event.items
        elif isinstance(event, TimelineChanged) and event.room_id == room and not event.thread_root:
            items = apply_diffs(items, event.diffs)
        else:
            continue
        out.extend(i for i in items if isinstance(i, EventItem))
    return out
