"""Helpers shared by the TUI tests: build the app on a fake engine, wait for a condition."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC

from textual.pilot import Pilot

from gapline.history import EventItem, TimelineItem
from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.tui import GaplineApp
from gapline.tui._timeline import GapRow
from tests.tui.fake_engine import ROOM, FakeEngine, FillPlan, gap, message


def standard_items() -> list[TimelineItem]:
    """Five retained messages, a gap, ten fresh ones (what a reopened room looks like)."""
    return [message(i) for i in range(5)] + [gap("g1")] + [message(i) for i in range(100, 110)]


def make_app(
    items: Sequence[TimelineItem] | None = None,
    *,
    plans: dict[str, FillPlan] | None = None,
    older: dict[str, list[EventItem]] | None = None,
    threads: dict[str, Sequence[TimelineItem]] | None = None,
) -> tuple[GaplineApp, FakeEngine]:
    rows = items if items is not None else standard_items()
    fake = FakeEngine({ROOM: rows}, plans=plans, older=older, threads=threads)
    rooms = RoomDirectory([RoomSummary(ROOM, name="design review", unread=0)])
    app = GaplineApp(fake.connect, rooms=rooms, room_id=ROOM, page_budget=4, tz=UTC)
    return app, fake


async def until(pilot: Pilot, done: Callable[[], object], what: str = "condition") -> None:
    """Let the app run until ``done()`` holds (no timing is asserted: only that it happens)."""
    for _ in range(500):
        if done():
            return
        await pilot.pause()
    raise AssertionError(f"never reached: {what}")


def gap_text(app: GaplineApp, gap_id: str = "g1") -> str:
    row = app.timeline.row(gap_id)
    assert isinstance(row, GapRow), f"no gap row {gap_id}"
    return str(row.render())


def page(*numbers: int) -> list:
    """One fill page: its events oldest first."""
    return [message(n) for n in numbers]
