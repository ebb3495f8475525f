"""The compose line's slash commands, and HTML bodies as terminal text: styles and blocks
kept, a reply fallback and unknown tags dropped, and nothing a terminal would act on
(escape sequences, control characters, bidi overrides, lying links) getting through."""

from __future__ import annotations

import io
import re

import pytest
from msgspec.structs import replace
from rich.console import Console
from rich.text import Text
from textual.app import App, ComposeResult

from gapline.history import (
    EventItem,
    InviteUser,
    JoinRoom,
    LeaveRoom,
    SendMessage,
    SetTopic,
)
from gapline.history._markdown import formatted_body
from gapline.tui._compose import (
    ComposeError,
    Invite,
    Join,
    Leave,
    Say,
    Topic,
    command_for,
    parse,
)
from gapline.tui._compose_box import ComposeBox
from gapline.tui._html import body_text, clean, html_text

ROOM = "!r:example.org"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("hello", Say("hello")),
        ("  hello \n", Say("hello")),
        ("line one\nline two", Say("line one\nline two")),
        ("/me waves", Say("waves", "m.emote")),
        ("/ME waves\nand bows", Say("waves\nand bows", "m.emote")),
        ("/me\nwaves", Say("waves", "m.emote")),
        ("/notice build passed", Say("build passed", "m.notice")),
        ("/plain **as typed**", Say("**as typed**", markdown=False)),
        ("//shrug", Say("/shrug")),
        ("//me is not an emote", Say("/me is not an emote")),
        ("/join #general:example.org", Join("#general:example.org")),
        ("/join !abc:example.org", Join("!abc:example.org")),
        ("/leave", Leave()),
        ("/invite @bob:example.org", Invite("@bob:example.org")),
        ("/topic lunch at noon", Topic("lunch at noon")),
    ],
)
def test_parse(text: str, parsed) -> None:
    assert parse(text) == parsed


@pytest.mark.parametrize("text", ["", "   ", "\n\n"])
def test_nothing_to_send(text: str) -> None:
    assert parse(text) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("/me", "usage: /me"),
        ("/join general", "usage: /join"),
        ("/join #nocolon", "usage: /join"),
        ("/leave now", "usage: /leave"),
        ("/invite bob", "usage: /invite"),
        ("/topic", "usage: /topic"),
        ("/shrug", "unknown command /shrug"),
        ("/usr/bin/env is a path", "unknown command /usr/bin/env"),
    ],
)
def test_bad_commands_say_why(text: str, says: str) -> None:
    parsed = parse(text)
    assert isinstance(parsed, ComposeError) and says in parsed.message
    if "unknown" in says:
        assert "/me" in parsed.message and "//" in parsed.message


def test_commands_for_the_engine() -> None:
    assert command_for(Say("hi"), ROOM) == SendMessage(ROOM, "hi", markdown=True)
    assert command_for(Say("w", "m.emote"), ROOM, in_reply_to="$e") == SendMessage(
        ROOM, "w", in_reply_to="$e", msgtype="m.emote", markdown=True
    )
    assert command_for(Say("t", markdown=False), ROOM, thread_root="$t") == SendMessage(
        ROOM, "t", thread_root="$t"
    )
    assert command_for(Join("#a:x"), ROOM) == JoinRoom("#a:x")
    assert command_for(Leave(), ROOM) == LeaveRoom(ROOM)
    assert command_for(Invite("@b:x"), ROOM) == InviteUser(ROOM, "@b:x")
    assert command_for(Topic("t"), ROOM) == SetTopic(ROOM, "t")


def styled(text: Text, word: str) -> set[str]:
    """The style attributes that apply to the first occurrence of ``word``."""
    start = text.plain.index(word)
    style = text.get_style_at_offset(Console(), start)
    return {a for a in ("bold", "italic", "underline", "strike", "dim") if getattr(style, a)}


def test_html_styles_and_blocks() -> None:
    text = html_text(
        "<p><strong>bold</strong> <em>it</em> <u>under</u> <del>gone</del> <code>x&lt;y</code></p>"
        "<ul><li>one</li><li>two<ol start='3'><li>three</li></ol></li></ul>"
        "<blockquote><p>quoted</p></blockquote><pre><code>a = 1\n  b\n</code></pre><p>end</p>"
    )
    assert text.plain == (
        "bold it under gone x<y\n• one\n• two\n  3. three\n▌ quoted\na = 1\n  b\nend"
    )
    assert styled(text, "bold") == {"bold"}
    assert styled(text, "it") == {"italic"}
    assert styled(text, "under") == {"underline"}
    assert styled(text, "gone") == {"strike"}
    assert "bold" in styled(text, "x<y")


def test_reply_fallback_and_unknown_tags() -> None:
    html = (
        "<mx-reply><blockquote><a href='https://matrix.to/#/!r/$e'>In reply to</a>"
        " <b>old</b></blockquote></mx-reply><blink>new</blink> <marquee>text</marquee>"
        "<script>alert(1)</script><style>p{}</style>"
    )
    assert html_text(html).plain == "new text"


def test_links_show_where_they_go() -> None:
    honest = html_text('<a href="https://example.org">https://example.org</a>')
    assert honest.plain == "https://example.org" and styled(honest, "https") == {"underline"}
    lying = html_text('<a href="https://evil.example/x">https://bank.example</a>')
    assert lying.plain == "https://bank.example <https://evil.example/x>"
    assert html_text('<a href="javascript:alert(1)">click</a>').plain == "click"
    assert html_text('<a href="mailto:a@x.org">a@x.org</a>').plain == "a@x.org"


HOSTILE = [
    "\x1b[2J\x1b[31mred",
    "&#27;[2Jcleared &#x1b;]0;title&#7;",
    "<b>\x1b]8;;https://evil\x1b\\link\x1b]8;;\x1b\\</b>",
    "bell\x07 back\x08 cr\rline del\x7f c1\x9b31m",
    "\u202eevil\u202c \u2066iso\u2069",
    "<pre>\x1b[1mpre\x1b[0m</pre>",
    '<a href="https://x\x1b[31m.org">y</a>',
    '<img alt="\x1b[31m" src="mxc://x/y">',
    "<p>" * 300 + "deep" + "</p>" * 300,
    "<ul>" * 100 + "<li>deep list",
    "<b><i>unclosed",
    "</b></i></p>stray closers",
    "<!-- comment --><![CDATA[x]]><?pi?>after",
]


@pytest.mark.parametrize("html", HOSTILE)
def test_hostile_html_reaches_the_terminal_as_text(html: str) -> None:
    text = html_text(html)
    assert re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text.plain) is None
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=80).print(text)
    sequences = re.findall(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\][^\x07\x1b]*", out.getvalue())
    # Only the renderer's own styles (SGR) reach the terminal: no cursor moves, no titles,
    # no hyperlinks, no clearing.
    assert all(s.endswith("m") and s.startswith("\x1b[") for s in sequences), sequences


def test_clean_plain_text() -> None:
    assert clean("a\x1b[31mb\tc\nd") == "a\ufffd[31mb    c\nd"
    assert clean("👨‍👩‍👧 zwj kept") == "👨‍👩‍👧 zwj kept"


def row(body: str = "plain", **fields: str) -> EventItem:
    item = EventItem(
        id="$e",
        event_id="$e",
        sender="@a:x",
        origin_server_ts=0,
        event_type="m.room.message",
        body=body,
    )
    return replace(item, **fields)


def test_rows_body_text() -> None:
    assert body_text(row(), "alice").plain == "plain"
    assert body_text(row(body="\x1b[2Jx"), "alice").plain == "\ufffd[2Jx"
    rich = row(body="**b**", formatted_body="<strong>b</strong>", msgtype="m.text")
    assert body_text(rich, "alice").plain == "b" and styled(body_text(rich, "alice"), "b")
    emote = row(body="waves", msgtype="m.emote")
    assert body_text(emote, "alice").plain == "* alice waves"
    notice = body_text(row(body="build passed", msgtype="m.notice"), "bot")
    assert notice.plain == "notice: build passed" and "dim" in styled(notice, "build")
    # HTML that shows nothing falls back to the body.
    empty = row(body="the body", formatted_body="<mx-reply>only a quote</mx-reply>")
    assert body_text(empty, "alice").plain == "the body"


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("**bold** and *it*", "bold and it"),
        ("- a\n- b", "• a\n• b"),
        ("> said\n\nreply", "▌ said\nreply"),
        ("```\ncode <x>\n```", "code <x>"),
        ("[site](https://example.org)", "site <https://example.org>"),
        ("first\nsecond **b**", "first\nsecond b"),
    ],
)
def test_markdown_round_trip(source: str, shown: str) -> None:
    html = formatted_body(source)
    assert html is not None
    assert html_text(html).plain == shown


class BoxApp(App):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def compose(self) -> ComposeResult:
        yield ComposeBox(id="compose", placeholder="write")

    def on_compose_box_submitted(self, message: ComposeBox.Submitted) -> None:
        self.sent.append(message.text)
        message.box.clear()


async def test_compose_box_enter_sends_and_newline_keys_break_lines() -> None:
    app = BoxApp()
    async with app.run_test() as pilot:
        box = app.query_one(ComposeBox)
        box.focus()
        await pilot.press("h", "i", "ctrl+j", "t", "h", "e", "r", "e", "shift+enter", "x")
        assert box.text == "hi\nthere\nx"
        assert box.size.height == 3  # it grew with its lines
        await pilot.press("enter")
        await pilot.pause()
        assert app.sent == ["hi\nthere\nx"] and box.text == ""
        box.value = "set"
        await pilot.press("!", "enter")
        await pilot.pause()
        assert app.sent[-1] == "set!"
