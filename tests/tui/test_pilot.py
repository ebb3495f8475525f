"""Pilot tests of the TUI on a scripted engine: gap rows, the fill key, progress, notices."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from datetime import UTC

import pytest
from textual.widgets import OptionList, ProgressBar

from gapline.history import (
    Cancel,
    EventSink,
    FillGap,
    GapLifecycle,
    HistoryRepair,
    PaginateBackwards,
    RetryRecent,
    SendMessage,
)
from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.tui import GaplineApp
from gapline.tui._compose_box import ComposeBox
from gapline.tui._timeline import EventRow, GapRow
from tests.tui.fake_engine import ROOM, FakeEngine, FillPlan, gap, message
from tests.tui.support import gap_text, make_app, page, standard_items, until


async def test_gap_row_sits_between_the_sections_it_separates() -> None:
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 16, "the room's rows")
        kinds = [type(row) for row in app.timeline.rows]
        assert kinds == [EventRow] * 5 + [GapRow] + [EventRow] * 10
        assert [row.item.id for row in app.timeline.rows] == [i.id for i in standard_items()]
        assert gap_text(app).strip("─ ") == "gap in history · f to fill"
        # the rows sit in this order on screen too
        await until(pilot, lambda: app.timeline.rows[6].region.y > 0, "the layout")
        ys = [row.region.y for row in app.timeline.rows[4:7]]
        assert ys == sorted(ys) and len(set(ys)) == 3


async def test_fill_key_shows_progress_then_the_gap_goes_on_ready() -> None:
    plan = FillPlan(pages=[page(97, 98, 99), page(95, 96)], manual=True)
    app, fake = make_app(plans={"g1": plan})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        await pilot.press("f")
        await until(pilot, lambda: "filling" in gap_text(app), "the fill starting")
        assert fake.commands[-1] == HistoryRepair(FillGap(ROOM, "g1"))
        assert "filling… 0 pages, 0 events" in gap_text(app)
        assert app.query_one("#fill").has_class("-running")

        fake.step()
        await until(pilot, lambda: "1 page, 3 events" in gap_text(app), "the first page")
        assert app.query_one(ProgressBar).progress == 1
        assert "filling: 1 page of 4, 3 events" in str(app.query_one("#fill-label").render())
        fake.step()
        await until(pilot, lambda: "2 pages, 5 events" in gap_text(app), "the second page")
        # the pages land below the gap, oldest first, as the engine inserts them
        ids = [row.item.id for row in app.timeline.rows]
        assert ids[4:12] == ["e4", "g1", "e95", "e96", "e97", "e98", "e99", "e100"]

        fake.step()  # settle: Ready
        await until(pilot, lambda: not app.timeline.gaps(), "the gap gone")
        assert not app.query_one("#fill").has_class("-running")
        assert "filled, verified (2 pages, 5 events)" in str(app.query_one("#status").render())
        assert [row.item.id for row in app.timeline.rows][4:6] == ["e4", "e95"]
        assert app.notices == []


@pytest.mark.parametrize(
    ("end", "words"),
    [
        ("budget", "paused: page budget reached (1 page) · f to continue"),
        ("stalled", "paused: server repeated its cursor · f to retry"),
        ("unavailable", "start of accessible history"),
        ("failed", "failed: the homeserver is unavailable: 502 Bad Gateway · f to retry"),
    ],
)
async def test_a_settled_fill_leaves_the_row_in_its_state(end: str, words: str) -> None:
    app, _ = make_app(plans={"g1": FillPlan(pages=[page(99)], end=end)})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        await pilot.press("f")
        await until(pilot, lambda: words in gap_text(app), f"the row saying {words!r}")
        assert app.timeline.gaps()[0].lifecycle is not GapLifecycle.Idle
        assert not app.query_one("#fill").has_class("-running")
        if end == "failed":
            assert app.notices == ["failed: the homeserver is unavailable: 502 Bad Gateway"]
            row = app.timeline.row("g1")
            assert row is not None and row.has_class("-failed")
        else:
            assert app.notices == []


@pytest.mark.parametrize(
    ("item", "words"),
    [
        (gap("g1", GapLifecycle.Paused), "paused · f to continue"),
        (gap("g1", GapLifecycle.Unavailable), "start of accessible history"),
        (gap("g1", GapLifecycle.Failed, failure="timed out"), "failed: timed out · f to retry"),
    ],
)
async def test_rows_opened_in_a_state_render_it(item, words: str) -> None:
    app, _ = make_app([message(1), item, message(2)])
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        assert words in gap_text(app)


async def test_room_busy_is_a_notice_not_a_crash() -> None:
    plan = FillPlan(pages=[page(99)], manual=True)
    app, fake = make_app(plans={"g1": plan})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        await pilot.press("f")
        await until(pilot, lambda: "filling" in gap_text(app), "the fill starting")
        await pilot.press("f")
        await until(pilot, lambda: app.notices, "a notice")
        assert app.notices == ["busy: another history operation runs in this room · c cancels it"]
        assert app.is_running
        fake.step(2)
        await until(pilot, lambda: not app.timeline.gaps(), "the first fill finishing")


async def test_cancel_pauses_the_fill() -> None:
    plan = FillPlan(pages=[page(99), page(98)], manual=True)
    app, fake = make_app(plans={"g1": plan})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        await pilot.press("f")
        fake.step()
        await until(pilot, lambda: "1 page" in gap_text(app), "the first page")
        await pilot.press("c")
        await until(pilot, lambda: "paused: cancelled" in gap_text(app), "the paused row")
        assert HistoryRepair(Cancel(ROOM)) in fake.commands
        assert "stopped" in app.notices
        assert not app.query_one("#fill").has_class("-running")


async def test_selected_row_stays_selected_through_a_fill() -> None:
    app, _ = make_app(plans={"g1": FillPlan(pages=[page(97, 98, 99), page(96)])})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        app.timeline.select("e100")
        row_before = app.timeline.row("e100")
        assert row_before is not None
        await pilot.press("f")  # no gap selected: the nearest gap above the selection fills
        await until(pilot, lambda: not app.timeline.gaps(), "the gap gone")
        assert app.timeline.selected_id == "e100"
        assert app.timeline.row("e100") is row_before  # the same widget, updated in place
        assert row_before.has_class("-selected")
        assert sum(row.has_class("-selected") for row in app.timeline.rows) == 1


async def test_selection_on_a_filled_gap_moves_to_its_place() -> None:
    app, _ = make_app(plans={"g1": FillPlan(pages=[page(99)])})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.gaps(), "the gap")
        app.timeline.select("g1")
        await pilot.press("f")
        await until(pilot, lambda: not app.timeline.gaps(), "the gap gone")
        assert app.timeline.selected_id == "e99"


async def test_scroll_back_at_the_top_paginates_and_keeps_the_view() -> None:
    items = [message(i) for i in range(100, 140)]
    older = [message(i) for i in range(50, 100)]
    app, fake = make_app(items, older={ROOM: older})
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.timeline
        await until(pilot, lambda: len(view.rows) == 40, "the rows")
        await until(pilot, lambda: view.scroll_y == view.max_scroll_y > 0, "the bottom")
        await pilot.press("home")  # selects the oldest row, which scrolls to the top
        await until(pilot, lambda: view.at_top, "the top")
        first = view.row("e100")
        assert first is not None
        y_before = first.region.y
        await pilot.press("b")
        await until(pilot, lambda: len(view.rows) == 90, "the older rows")
        await pilot.pause()
        assert fake.commands[-1] == PaginateBackwards(ROOM, 50)
        assert [row.item.id for row in view.rows[:2]] == ["e50", "e51"]
        assert view.row("e100") is first
        assert first.region.y == y_before  # the row the reader looked at did not move
        assert view.scroll_y > 0


async def test_scroll_back_with_nothing_older_says_so() -> None:
    app, _ = make_app([message(1), message(2)])
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 2, "the rows")
        await pilot.press("b")
        await until(pilot, lambda: app.notices, "a notice")
        assert app.notices == ["the start of this room's accessible history is loaded"]


async def test_new_messages_keep_a_bottom_view_at_the_bottom_and_compose_sends() -> None:
    app, fake = make_app([message(i) for i in range(60)])
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.timeline
        await until(pilot, lambda: len(view.rows) == 60, "the rows")
        await until(pilot, lambda: view.scroll_y == view.max_scroll_y > 0, "the bottom")
        await pilot.press("i")
        assert isinstance(app.focused, ComposeBox)
        await pilot.press(*"hello", "enter")
        await until(pilot, lambda: len(view.rows) == 61, "the sent message")
        assert SendMessage(ROOM, "hello", markdown=True) in fake.commands
        await until(pilot, lambda: view.scroll_y == view.max_scroll_y, "the new bottom")
        assert app.query_one(ComposeBox).value == ""


async def test_retry_key_and_quit_close_the_engine() -> None:
    app, fake = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.timeline.rows, "the rows")
        await pilot.press("r")
        await until(pilot, lambda: HistoryRepair(RetryRecent(ROOM)) in fake.commands, "retry")
        assert "recent: loaded" in str(app.query_one("#status").render())
        await pilot.press("q")
        await until(pilot, lambda: fake.closed, "the engine closed")
    assert fake.closed


async def test_an_engine_that_cannot_open_is_a_notice() -> None:
    @contextlib.asynccontextmanager
    async def connect(_sink: EventSink) -> AsyncGenerator[FakeEngine]:
        raise RuntimeError("wrong passphrase for the store")
        yield  # pragma: no cover - never reached

    app = GaplineApp(connect, room_id=ROOM, tz=UTC)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, app.notices.copy, "the first notice")
        await pilot.press("r")  # a command with no engine: a notice too
        await until(pilot, lambda: len(app.notices) == 2, "the second notice")
        assert app.notices == [
            "the engine stopped: wrong passphrase for the store",
            "the engine is not running",
        ]
        assert app.is_running
        await pilot.press("q")


async def test_room_list_shows_loading_and_unread() -> None:
    fake = FakeEngine({ROOM: standard_items()}, recent_settles=False)
    rooms = RoomDirectory(
        [RoomSummary(ROOM, name="design review"), RoomSummary("!other:x", name="ops", unread=3)]
    )
    app = GaplineApp(fake.connect, rooms=rooms, room_id=ROOM, tz=UTC)
    async with app.run_test(size=(80, 24)) as pilot:
        options = app.query_one(OptionList)

        def prompts() -> list[str]:
            return [str(options.get_option_at_index(i).prompt) for i in range(2)]

        await until(pilot, lambda: "⟳" in prompts()[0], "the loading mark")
        assert prompts() == ["DR design review ⟳", "O  ops (3)"]
        assert "recent: loading…" in str(app.query_one("#status").render())
        await pilot.press("r")  # the fake's RetryRecent settles the load
        await until(pilot, lambda: prompts()[0] == "DR design review", "the load settled")
        assert options.highlighted == 0
