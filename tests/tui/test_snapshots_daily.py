"""Snapshots of the daily-driver screens at 80x24: the room list with an offline status
line and a queue, the help panel, and a search in progress. Regenerate with
``--snapshot-update`` after looking at the SVGs."""

from __future__ import annotations

from textual.pilot import Pilot

from gapline.history import SendQueueChanged
from gapline.tui._connection import Reachability
from tests.tui.support import until
from tests.tui.test_daily_pilot import bodies, three_rooms


def test_rooms_offline_and_queued(snap_compare) -> None:
    reachability = Reachability()
    app, fake = three_rooms(reachability)

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        reachability.unreachable("GET /sync: connection failed")
        await fake.publish(SendQueueChanged(pending=2))
        await until(pilot, lambda: "unreachable" in str(app.query_one("#status").render()), "")
        app.clear_notifications()  # the toast saying why would cover the status line
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_help_panel(snap_compare) -> None:
    app, _ = three_rooms()

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_search_bar(snap_compare) -> None:
    app, _ = three_rooms()

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        await pilot.press("slash", *"message", "enter")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
