"""Pilot tests of the rows the relation rules make and of the row actions: quotes,
reaction chips, thread summaries and the thread view, names and colours, the unread
divider, typing in and out, the member list, edits and deletions, the live end."""

from __future__ import annotations

from msgspec.structs import replace
from textual.widgets import OptionList, Static

from gapline.history import (
    EditMessage,
    EventItem,
    MarkRead,
    Member,
    MembersChanged,
    PushFront,
    RedactEvent,
    Remove,
    SendMessage,
    SendReaction,
    SetTyping,
    ShrinkTimeline,
    TimelineChanged,
    TypingChanged,
)
from gapline.history.rooms import RoomSummary
from gapline.tui._compose_box import ComposeBox
from gapline.tui._rows import EventRow, MarkerRow
from gapline.tui._text import sender_colour
from tests.tui.fake_engine import ROOM, message
from tests.tui.support import make_app, until
from tests.tui.timeline_items import ALICE, BOB, CAROL, rich_room, thread_of_root


def row_text(app, event_id: str) -> str:
    row = next(r for r in app.timeline.rows if getattr(r.item, "event_id", None) == event_id)
    return str(row.render())


async def test_rows_show_quotes_chips_threads_names_and_state_in_words() -> None:
    app, _ = make_app(rich_room())
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        answer = row_text(app, "$e3")
        assert "↳ Bob: lunch at noon?" in answer
        assert "Alice Liddell" in answer and "sounds good" in answer
        assert "👍 2" in answer and "[🎉 1]" in answer  # alice's own chip is bracketed
        assert "in reply to a message not loaded yet" in row_text(app, "$e4")
        assert "in reply to a message that is not available" in row_text(app, "$e5")
        root = row_text(app, "$e6")
        assert "🧵 2 replies · Carol: lobby · you took part · t to open" in root
        assert "on my way (bike) (edited)" in row_text(app, "$e7")
        assert "message deleted" in row_text(app, "$e8")
        assert "Carol" in row_text(app, "$e1") and "joined the room" in row_text(app, "$e1")
        [marker] = [r for r in app.timeline.rows if isinstance(r, MarkerRow)]
        assert marker.display and "new messages" in str(marker.render())
        # one colour per user, the same on every row
        rows = [
            (r, r.item)
            for r in app.timeline.rows
            if isinstance(r, EventRow) and isinstance(r.item, EventItem)
        ]
        spans = {
            (item.sender, str(s.style))
            for r, item in rows
            for s in EventRow.render(r).spans
            if "bold #" in str(s.style)
        }
        assert {style for _, style in spans} == {
            f"bold {sender_colour(u)}" for u in {item.sender for _, item in rows}
        }
        assert len({style for sender, style in spans if sender == BOB}) == 1


async def test_the_unread_divider_hides_while_nothing_follows_it() -> None:
    items = rich_room()[:-1]  # the marker is the last row
    app, _ = make_app(items)
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 9, "the rows")
        [marker] = [r for r in app.timeline.rows if isinstance(r, MarkerRow)]
        assert not marker.display


async def test_reply_edit_delete_react_and_mark_read_keys_send_their_commands() -> None:
    app, fake = make_app(rich_room())
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        app.timeline.select("e2")
        await pilot.press("a")
        box = app.query_one("#compose", ComposeBox)
        assert "reply to Bob" in box.placeholder and app.focused is box
        await pilot.press("y", "e", "s")
        await until(pilot, lambda: SetTyping(ROOM, True) in fake.commands, "typing out")
        await pilot.press("enter")
        await until(pilot, lambda: any(isinstance(c, SendMessage) for c in fake.commands), "send")
        assert SendMessage(ROOM, "yes", in_reply_to="$e2", markdown=True) in fake.commands
        await until(pilot, lambda: SetTyping(ROOM, False) in fake.commands, "typing stopped")
        assert "write a message" in box.placeholder  # back to plain messages
        await pilot.press("escape")
        app.timeline.select("e7")  # alice's own
        await pilot.press("e")
        assert box.value == "on my way (bike)"
        box.value = "here"
        await pilot.press("enter")
        await until(
            pilot, lambda: EditMessage(ROOM, "$e7", "here", markdown=True) in fake.commands, "edit"
        )
        await pilot.press("escape")
        app.timeline.select("e2")  # bob's: not editable
        await pilot.press("e")
        assert "only your own messages can be edited" in app.notices
        app.timeline.select("e2")
        await pilot.press("plus")
        await until(pilot, lambda: SendReaction(ROOM, "$e2", "👍") in fake.commands, "react")
        await pilot.press("d")
        await until(pilot, lambda: RedactEvent(ROOM, "$e2") in fake.commands, "delete")
        await pilot.press("x")
        newest = [r.item for r in app.timeline.rows if isinstance(r.item, EventItem)][-1]
        await until(pilot, lambda: MarkRead(ROOM, newest.event_id) in fake.commands, "read")


async def test_t_opens_the_thread_view_and_esc_comes_back() -> None:
    app, fake = make_app(rich_room(), threads={"$e6": thread_of_root()})
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        app.timeline.select("e6")
        await pilot.press("t")
        await until(pilot, lambda: len(app.timeline.rows) == 3, "the thread's rows")
        assert [r.item.id for r in app.timeline.rows] == ["e6", "t1", "t2"]
        assert "thread" in str(app.query_one("#room-title", Static).render())
        await pilot.press("i", "o", "k")
        await pilot.press("enter")
        await until(pilot, lambda: len(app.timeline.rows) == 4, "the reply in the thread")
        assert SendMessage(ROOM, "ok", thread_root="$e6", markdown=True) in fake.commands
        await pilot.press("escape")  # leave the compose box
        await pilot.press("escape")  # leave the thread
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the room again")
        assert app.timeline.selected_id == "e6"
        assert app.thread_root is None


async def test_typing_indicator_and_member_list() -> None:
    app, fake = make_app(rich_room())
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        members = (
            Member(user_id=ALICE, display_name="Alice Liddell"),
            Member(user_id=BOB, display_name="Bob"),
            Member(user_id=CAROL, display_name=None, membership="invite"),
        )
        await fake.publish(MembersChanged(ROOM, members))
        await fake.publish(TypingChanged(ROOM, (BOB,)))
        line = app.query_one("#typing", Static)
        await until(pilot, lambda: "Bob is typing…" in str(line.render()), "typing shown")
        await fake.publish(TypingChanged(ROOM, ()))
        await until(pilot, lambda: not line.has_class("-typing"), "typing gone")
        await pilot.press("m")
        panel = app.query_one("#members", Static)
        text = str(panel.render())
        assert "members (3)" in text and "Alice Liddell" in text and "carol (invited)" in text
        await pilot.press("m")
        assert not panel.has_class("-shown")


async def test_end_after_the_window_left_the_live_end_asks_for_it_back() -> None:
    items = [message(i) for i in range(20)]
    app, fake = make_app(items)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 20, "the rows")
        older = replace(message(-1), body="older")
        fake.items[ROOM].insert(0, older)
        fake.items[ROOM].pop()
        await fake.publish(TimelineChanged(ROOM, (PushFront(older), Remove(20))))
        await until(pilot, lambda: app.timeline.detached, "the window left the live end")
        app.timeline.focus()
        await pilot.press("end")
        await until(pilot, lambda: ShrinkTimeline(ROOM) in fake.commands, "the live end asked")
        await until(pilot, lambda: not app.timeline.detached, "back at the live end")
        assert all(isinstance(r.item, EventItem) for r in app.timeline.rows)


async def test_the_room_list_says_when_unread_messages_mention_you() -> None:
    app, _ = make_app(rich_room())
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        other = RoomSummary("!other:example.org", name="other", unread=3, highlights=1)
        app.directory.put(other)
        options = app.query_one("#rooms", OptionList)

        def listed() -> str:
            return " | ".join(
                str(options.get_option_at_index(i).prompt) for i in range(options.option_count)
            )

        await until(pilot, lambda: "other (3 @1)" in listed(), "the count in the room list")
