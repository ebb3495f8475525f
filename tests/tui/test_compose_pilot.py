"""Pilot tests of composing in the TUI: markdown sent and shown formatted, ``/me`` and the
room commands, multi-line messages, a refused command kept in the box, and rows whose HTML
or text carries terminal escapes shown as harmless text."""

from __future__ import annotations

from gapline.history import InviteUser, JoinRoom, LeaveRoom, SendMessage, SetTopic
from gapline.tui._compose_box import ComposeBox
from tests.tui.fake_engine import ROOM, message
from tests.tui.support import make_app, until


def row_text(app, row_id: str) -> str:
    return app.timeline.row(row_id).render().plain


async def write(pilot, *keys: str) -> None:
    """Type into the compose box (wherever the focus went after the last send) and send."""
    pilot.app.action_compose()
    await pilot.press(*keys, "enter")


def sent(fake) -> list[SendMessage]:
    return [c for c in fake.commands if isinstance(c, SendMessage)]


async def test_markdown_emote_commands_and_lines_from_the_compose_box() -> None:
    app, fake = make_app([message(1)])
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 1, "the rows")
        await pilot.press("i")
        box = app.query_one("#compose", ComposeBox)
        assert app.focused is box
        await pilot.press(*"**bold** move", "enter")  # the compose key focused the box
        await until(pilot, lambda: len(app.timeline.rows) == 2, "the message")
        assert sent(fake)[-1] == SendMessage(ROOM, "**bold** move", markdown=True)
        newest = app.timeline.rows[-1]
        assert "bold move" in row_text(app, newest.item_id)
        assert "**" not in row_text(app, newest.item_id)
        await write(pilot, *"/me waves")
        await until(pilot, lambda: len(app.timeline.rows) == 3, "the emote")
        assert sent(fake)[-1] == SendMessage(ROOM, "waves", msgtype="m.emote", markdown=True)
        assert "* alice waves" in row_text(app, app.timeline.rows[-1].item_id)
        await write(pilot, "o", "n", "e", "ctrl+j", "t", "w", "o")
        await until(pilot, lambda: len(app.timeline.rows) == 4, "the two lines")
        assert sent(fake)[-1].body == "one\ntwo"
        await write(pilot, *"//shrug")
        await until(pilot, lambda: len(app.timeline.rows) == 5, "the escaped slash")
        assert sent(fake)[-1].body == "/shrug"
        await write(pilot, *"/invite @bob:example.org")
        await until(pilot, lambda: InviteUser(ROOM, "@bob:example.org") in fake.commands, "invite")
        await write(pilot, *"/topic plans")
        await until(pilot, lambda: SetTopic(ROOM, "plans") in fake.commands, "topic")
        assert box.text == ""
        await write(pilot, *"/shrug")
        await until(pilot, lambda: any("unknown command /shrug" in n for n in app.notices), "why")
        assert box.text == "/shrug"  # kept, to fix
        assert len(sent(fake)) == 4
        box.clear()
        await write(pilot, *"/leave")
        await until(pilot, lambda: LeaveRoom(ROOM) in fake.commands, "leave")


async def test_rows_with_hostile_html_and_text_show_as_text() -> None:
    hostile = message(
        2,
        body="plain \x1b[2J",
        formatted_body='<b>\x1b]0;title\x07x</b><script>alert(1)</script><a href="https://evil.example">https://bank.example</a>',
        msgtype="m.text",
    )
    notice = message(3, sender="@bot:example.org", body="\x1b[31mbuild passed", msgtype="m.notice")
    app, _ = make_app([message(1), hostile, notice])
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 3, "the rows")
        text = row_text(app, "e2")
        assert "\x1b" not in text and "\x07" not in text and "alert" not in text
        assert "https://bank.example <https://evil.example>" in text
        shown = row_text(app, "e3")
        assert "notice: \ufffd[31mbuild passed" in shown and "\x1b" not in shown


async def test_join_by_room_id_shows_the_joined_room() -> None:
    app, fake = make_app([message(1)])
    fake.initial["!club:example.org"] = (message(7, body="welcome"),)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 1, "the rows")
        await write(pilot, *"/join !club:example.org")
        await until(pilot, lambda: JoinRoom("!club:example.org") in fake.commands, "the join")
        await until(pilot, lambda: app.room_id == "!club:example.org", "the joined room")
        await until(pilot, lambda: len(app.timeline.rows) == 1, "its rows")
        assert "welcome" in row_text(app, app.timeline.rows[0].item_id)
