"""Pilot tests of the TUI as a daily driver: the room list and switching, help, search,
copy and open a link, focus after sending, the status line offline and queued, resizing."""

from __future__ import annotations

import webbrowser
from collections.abc import Callable
from datetime import UTC

import msgspec
from msgspec.structs import replace
from rich.console import Console
from textual.widgets import Input, OptionList, Static

from gapline.history import AcceptInvite, SendMessage, SendQueueChanged
from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.matrix import SyncResponse
from gapline.tui import GaplineApp
from gapline.tui._compose_box import ComposeBox
from gapline.tui._connection import Reachability
from gapline.tui._help import HelpScreen, help_table
from gapline.tui._keys import KEY_TABLE
from gapline.tui._links import links_in
from gapline.tui._room_list import room_prompt
from gapline.tui._search import matches
from tests.tui.fake_engine import ROOM, FakeEngine, message
from tests.tui.support import make_app, until

OTHER = "!other:example.org"
THIRD = "!third:example.org"


def three_rooms(
    reachability: Reachability | None = None,
    url_opener: Callable[[str], bool] = webbrowser.open,
) -> tuple[GaplineApp, FakeEngine]:
    fake = FakeEngine(
        {
            ROOM: [message(1), message(2)],
            OTHER: [replace(message(3), body="in other")],
            THIRD: [replace(message(4), body="in third")],
        }
    )
    rooms = RoomDirectory(
        [
            RoomSummary(ROOM, name="design review", last_ts=3),
            RoomSummary(
                OTHER,
                name="ops",
                unread=2,
                highlights=1,
                encrypted=True,
                last_message="deploy is done\nsecond line",
                last_sender="@bob:example.org",
                last_ts=2,
            ),
            RoomSummary(THIRD, name="zulu", last_ts=1),
        ]
    )
    app = GaplineApp(
        fake.connect,
        rooms=rooms,
        room_id=ROOM,
        tz=UTC,
        reachability=reachability,
        url_opener=url_opener,
    )
    return app, fake


def invite_sync(room_id: str, name: str, inviter: str) -> SyncResponse:
    """A sync answer carrying one invite (its stripped state: the name, who invited)."""

    def stripped(event_type: str, content: dict, state_key: str = "") -> dict:
        return {"type": event_type, "sender": inviter, "state_key": state_key, "content": content}

    events = [
        stripped("m.room.name", {"name": name}),
        stripped("m.room.member", {"membership": "invite"}, "@alice:example.org"),
    ]
    body = {
        "next_batch": "s1",
        "rooms": {"invite": {room_id: {"invite_state": {"events": events}}}},
    }
    return msgspec.json.decode(msgspec.json.encode(body), type=SyncResponse)


def bodies(app: GaplineApp) -> list[str | None]:
    return [getattr(row.item, "body", None) for row in app.timeline.rows]


def listed(app: GaplineApp) -> list[str]:
    options = app.query_one("#rooms", OptionList)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


def status(app: GaplineApp) -> str:
    return str(app.query_one("#status", Static).render())


def test_a_room_entry_has_initials_lock_counts_and_the_last_message() -> None:
    summary = RoomSummary(
        OTHER,
        name="ops team",
        unread=2,
        highlights=1,
        encrypted=True,
        last_message="deploy is done\nsecond line",
        last_sender="@bob:example.org",
    )
    assert str(room_prompt(summary)) == "OT 🔒 ops team (2 @1)\n   bob: deploy is done"
    # The room on screen shows no count; a plain room no lock; no message, one line.
    assert str(room_prompt(summary, current=True)).startswith("OT 🔒 ops team\n")
    assert str(room_prompt(RoomSummary(ROOM, name="plain", unread=1))) == "P  plain (1)"
    direct = RoomSummary(ROOM, name="bob", direct=True)
    assert str(room_prompt(direct)) == "B  @bob"
    # In the pane each line is cut to its width, never wrapped.
    cut = str(room_prompt(summary, width=12))
    assert cut == "OT 🔒 ops t…\n   bob: dep…"
    invite = RoomSummary(THIRD, name="club", membership="invite", inviter="@carol:example.org")
    assert str(room_prompt(invite)) == "C  club\n   invite from carol · enter joins"


async def test_the_room_list_is_ordered_by_activity_and_follows_the_directory() -> None:
    app, _ = three_rooms()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        assert [p.split("\n")[0] for p in listed(app)] == [
            "DR design review",
            "O  🔒 ops (2 @1)",
            "Z  zulu",
        ]
        # A sync brings a newer message to zulu: it moves to the top, with its last line.
        app.directory.put(RoomSummary(THIRD, name="zulu", last_ts=9, last_message="new!"))
        await until(pilot, lambda: listed(app)[0].startswith("Z  zulu"), "zulu on top")
        assert listed(app)[0] == "Z  zulu\n   new!"


async def test_ctrl_n_and_ctrl_p_switch_rooms_in_list_order_and_wrap() -> None:
    app, _ = three_rooms()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        await pilot.press("ctrl+n")
        await until(pilot, lambda: bodies(app) == ["in other"], "the next room")
        assert app.room_id == OTHER
        assert app.query_one("#rooms", OptionList).highlighted == 1
        await pilot.press("alt+down")
        await until(pilot, lambda: bodies(app) == ["in third"], "the third room")
        await pilot.press("ctrl+n")  # past the end: back to the first
        await until(pilot, lambda: app.room_id == ROOM, "wrapped to the first room")
        await pilot.press("ctrl+p")
        await until(pilot, lambda: app.room_id == THIRD, "wrapped back to the last room")
        assert bodies(app) == ["in third"]


async def test_enter_in_the_list_opens_a_room_and_accepts_an_invite() -> None:
    app, fake = three_rooms()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        app.query_one("#rooms", OptionList).focus()
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.room_id == OTHER, "the chosen room")
        assert app.focused is app.timeline  # reading, not still in the list
        # An invite lists first; Enter accepts it, then shows the room.
        fake.initial["!club:example.org"] = (replace(message(7), body="welcome"),)
        app.directory.observe(invite_sync("!club:example.org", "club", "@carol:example.org"))
        await until(pilot, lambda: listed(app)[0].startswith("C  club"), "the invite listed")
        assert "!club:example.org" not in app._joined_ids()  # ctrl+n never lands on it
        app.query_one("#rooms", OptionList).focus()
        await pilot.press("home", "enter")
        await until(pilot, lambda: AcceptInvite("!club:example.org") in fake.commands, "accepted")
        await until(pilot, lambda: bodies(app) == ["welcome"], "the joined room shown")


async def test_question_mark_opens_help_listing_every_binding_and_esc_closes_it() -> None:
    app, _ = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 16, "the rows")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help panel")
        console = Console(width=100, record=True)
        assert isinstance(app.screen, HelpScreen)
        console.print(help_table(app.screen.rows))
        shown = console.export_text()
        for binding in KEY_TABLE:
            assert binding.description in shown, binding.description
        assert "ctrl+n alt+down" in shown and "? " in shown and "esc" in shown
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")
        assert app.is_running  # esc closed the panel, nothing else
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help again")
        await pilot.press("question_mark")  # ? closes it too
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed by ?")


async def test_the_footer_shows_help_and_compose_keys() -> None:
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 16, "the rows")
        shown = {b.binding.action for b in app.active_bindings.values() if b.binding.show}
        assert {"help", "compose", "quit", "next_room", "search", "copy"} <= shown


async def test_focus_returns_to_the_timeline_after_sending() -> None:
    app, fake = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 16, "the rows")
        await pilot.press("i")
        assert isinstance(app.focused, ComposeBox)
        await pilot.press("h", "i", "enter")
        await until(pilot, lambda: SendMessage(ROOM, "hi", markdown=True) in fake.commands, "sent")
        assert app.focused is app.timeline
        await pilot.press("q")  # a command again, not a "q" typed into the box
        await until(pilot, lambda: not app.is_running, "quit")


def test_search_matches_text_and_senders_ignoring_case() -> None:
    items = [message(1), replace(message(2), body="Deploy done"), message(3, sender="@bob:x")]
    assert matches(items, "deploy") == ("e2",)
    assert matches(items, "BOB") == ("e3",)
    assert matches(items, "message") == ("e1", "e3")
    assert matches(items, "  ") == ()


async def test_slash_searches_the_loaded_timeline_and_n_steps_through_matches() -> None:
    items = [message(i) for i in range(1, 13)]  # "message 1" ... "message 12"
    app, _ = make_app(items)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 12, "the rows")
        await pilot.press("slash")
        assert app.focused is app.query_one("#search", Input)
        await pilot.press(*"message 1", "enter")  # matches 1, 10, 11, 12
        assert app.focused is app.timeline
        assert app.timeline.selected_id == "e12"  # the newest match first
        info = app.query_one("#search-info")
        assert "1 of 4" not in str(info.render()) and "4 of 4" in str(info.render())
        await pilot.press("n")
        assert app.timeline.selected_id == "e11"
        await pilot.press("n", "n")
        assert app.timeline.selected_id == "e1"
        await pilot.press("n")  # wraps round to the newest
        assert app.timeline.selected_id == "e12"
        await pilot.press("N")
        assert app.timeline.selected_id == "e1"
        await pilot.press("escape")
        assert not app.query_one("#search-bar").has_class("-shown")
        await pilot.press("ctrl+f")
        await until(pilot, lambda: app.focused is app.query_one("#search"), "the box again")
        await pilot.press(*"nothing like it", "enter")
        assert "no match" in str(app.query_one("#search-info").render())
        assert app.timeline.selected_id == "e1"  # the selection stays where it was


async def test_y_copies_the_selected_message_and_o_opens_its_link_in_a_worker() -> None:
    opened: list[str] = []
    link = replace(message(2), body="see https://example.org/a_(b) and https://x.org.")
    app, _ = three_rooms(url_opener=lambda url: opened.append(url) or True)
    app._connect = FakeEngine({ROOM: [message(1), link]}).connect
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 2, "the rows")
        app.timeline.select("e1")
        await pilot.press("y")
        assert app.clipboard == "message 1"
        assert "copied 9 characters" in app.notices
        await pilot.press("o")
        assert "no link in the selected message" in app.notices
        app.timeline.select("e2")
        await pilot.press("o")
        await until(pilot, lambda: opened == ["https://example.org/a_(b)"], "the browser asked")
        assert any("the first of 2" in n for n in app.notices)


def test_links_leave_trailing_punctuation_out() -> None:
    assert links_in("go to https://a.org/x, then (https://b.org/y).") == [
        "https://a.org/x",
        "https://b.org/y",
    ]
    assert links_in("no links here, just http:/ text") == []


async def test_a_failing_browser_is_a_notice() -> None:
    def broken(url: str) -> bool:
        raise OSError("no display")

    app, _ = three_rooms(url_opener=broken)
    app._connect = FakeEngine({ROOM: [replace(message(1), body="https://example.org")]}).connect
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 1, "the row")
        await pilot.press("o")
        await until(
            pilot,
            lambda: "could not open https://example.org: no display" in app.notices,
            "the notice",
        )


async def test_the_status_line_says_offline_and_how_many_are_queued() -> None:
    reachability = Reachability()
    app, fake = three_rooms(reachability)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        assert "unreachable" not in status(app)
        reachability.unreachable("GET /sync: connection failed")
        await fake.publish(SendQueueChanged(pending=3))
        await until(pilot, lambda: "unreachable" in status(app), "the warning")
        assert status(app).startswith("⚠ homeserver unreachable, retrying · 3 messages queued")
        # Why, once, as a notice (the status line keeps to what fits in 80 columns).
        assert "the homeserver does not answer: GET /sync: connection failed" in app.notices
        assert app.query_one("#status").has_class("-offline")
        reachability.answered()
        await fake.publish(SendQueueChanged(pending=0))
        await until(pilot, lambda: "unreachable" not in status(app), "back online")
        assert "queued" not in status(app)
        assert not app.query_one("#status").has_class("-offline")


async def test_the_room_list_collapses_when_narrow_and_returns_when_wide() -> None:
    app, _ = three_rooms()
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        rooms = app.query_one("#rooms", OptionList)
        assert rooms.display
        await pilot.resize_terminal(60, 20)
        await until(pilot, lambda: not rooms.display, "the list collapsed")
        assert "design review" in str(app.query_one("#room-title").render())
        await pilot.press("ctrl+n")  # switching still works without the list
        await until(pilot, lambda: app.room_id == OTHER, "switched")
        await pilot.resize_terminal(100, 30)
        await until(pilot, lambda: rooms.display, "the list back")


async def test_esc_closes_the_side_panel_before_leaving_anything_else() -> None:
    app, _ = three_rooms()
    async with app.run_test(size=(140, 30)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        panel = app.query_one("#members")
        await pilot.press("m")
        assert panel.has_class("-shown")
        await pilot.press("escape")
        assert not panel.has_class("-shown")
        await pilot.press("v")
        assert panel.has_class("-shown") and app.show_devices
        await pilot.press("escape")
        assert not panel.has_class("-shown") and not app.show_devices
        assert app.is_running and app.room_id == ROOM


async def test_l_shows_the_rooms_left_at_the_end_and_hides_them_again() -> None:
    app, _ = three_rooms()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: bodies(app) == ["message 1", "message 2"], "the rows")
        body = {"next_batch": "s2", "rooms": {"leave": {THIRD: {}}}}
        app.directory.observe(msgspec.json.decode(msgspec.json.encode(body), type=SyncResponse))
        await until(pilot, lambda: len(listed(app)) == 2, "zulu gone from the list")
        await pilot.press("L")
        await until(pilot, lambda: len(listed(app)) == 3, "the room left, listed")
        assert listed(app)[-1] == "Z  zulu\n   left · L hides"
        assert THIRD not in app._joined_ids()  # ctrl+n does not go there
        await pilot.press("L")
        await until(pilot, lambda: len(listed(app)) == 2, "hidden again")
