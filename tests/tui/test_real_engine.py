"""The TUI on the real engine (over the in-memory fake homeserver): a gap across
sessions shows up as a row, and `f` fills it until the sections join."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from datetime import UTC
from pathlib import Path

from gapline.history import (
    Continuity,
    Engine,
    EngineConfig,
    EventItem,
    EventSink,
    HistoryRepair,
    OpenRoom,
    RecentHistoryKind,
    RepairPhase,
    RetryRecent,
)
from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.matrix import RetryPolicy
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams
from gapline.tui import GaplineApp
from tests.tui.support import until

NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=1)


async def test_fill_a_gap_across_sessions_with_the_real_engine(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"old {i}" for i in range(8)])
    store = tmp_path / "store"
    async with (
        fake.client(alice, retry=NO_RETRY) as client,
        Engine.open(
            store, client, passphrase="pw", kdf_cost=KdfParams.cheap(), sync=False
        ) as engine,
    ):
        await engine.execute(OpenRoom(room))
        await engine.execute(HistoryRepair(RetryRecent(room)))
    fake.send_messages(alice.user_id, room, [f"new {i}" for i in range(30)])

    config = EngineConfig(page_size=5, recent_pages=1, page_budget=10)

    @contextlib.asynccontextmanager
    async def connect(sink: EventSink) -> AsyncGenerator[Engine]:
        async with (
            fake.client(alice, retry=NO_RETRY) as client,
            Engine.open(
                store, client, passphrase="pw", kdf_cost=KdfParams.cheap(), sink=sink,
                config=config, sync=False,
            ) as engine,
        ):  # fmt: skip
            yield engine

    rooms = RoomDirectory([RoomSummary(room, name="r")])
    app = GaplineApp(connect, rooms=rooms, room_id=room, page_budget=config.page_budget, tz=UTC)
    async with app.run_test(size=(80, 24)) as pilot:

        def loaded() -> bool:
            return app.mirror.state.recent(room).kind is RecentHistoryKind.Loaded

        await until(pilot, lambda: loaded() and app.timeline.gaps(), "the gap after the load")
        gap = app.timeline.gaps()[-1]
        before = [row.item for row in app.timeline.rows]
        gap_at = next(i for i, item in enumerate(before) if item.id == gap.id)
        bodies = [getattr(item, "body", None) for item in before]
        assert bodies[gap_at - 1] == "old 7"
        assert bodies[gap_at + 1] == "new 25"  # one page of 5: new 25 .. new 29
        app.timeline.select(before[gap_at + 1].id)
        selected = app.timeline.selected_id

        await pilot.press("f")
        await until(pilot, lambda: not app.timeline.gaps(), "the gap filled")
        report = app.mirror.state.repairs[room]
        assert report.phase is RepairPhase.Ready
        assert report.continuity is Continuity.Verified
        assert report.events == 25  # new 0 .. new 24; the last page meets "old 7"
        rows = [row.item for row in app.timeline.rows]
        assert tuple(rows) == app.mirror.items(room)
        messages = [item.body for item in rows if isinstance(item, EventItem) and item.body]
        tail = [m for m in messages if m.startswith(("old", "new"))]
        assert tail == [f"old {i}" for i in range(8)] + [f"new {i}" for i in range(30)]
        assert app.timeline.selected_id == selected
        assert app.notices == []
        await app.shutdown()
