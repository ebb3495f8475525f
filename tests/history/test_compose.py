"""Composing: markdown becomes an HTML ``formatted_body`` only when it has markup, ``/me``
sends an emote, and rows carry ``msgtype`` and ``formatted_body`` (on the wire too, and
for an edit, its new revision's), from the local echo to the server's event."""

from __future__ import annotations

import re

import pytest

from gapline.history import (
    EditMessage,
    EventItem,
    Ok,
    OpenRoom,
    SendMessage,
    command_from_wire,
    item_from_wire,
    to_wire,
)
from gapline.history._markdown import HTML_FORMAT, formatted_body
from gapline.history._wire import WireError
from tests.history.test_engine_fake import client_for
from tests.history.test_engine_support import open_engine

# The tags the Matrix specification suggests clients permit in formatted bodies.
ALLOWED = {
    "font", "del", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "p", "a", "ul", "ol",
    "sup", "sub", "li", "b", "i", "u", "strong", "em", "s", "code", "hr", "br", "div",
    "table", "thead", "tbody", "tr", "th", "td", "caption", "pre", "span", "img",
    "details", "summary",
}  # fmt: skip


def tags(html: str) -> set[str]:
    return {m.lower() for m in re.findall(r"</?([A-Za-z][A-Za-z0-9-]*)", html)}


@pytest.mark.parametrize(
    "text",
    ["hello", "a & b <c> \"d\" 'e'", "two\nlines", "  padded  ", "3 < 4 > 2", "emoji 🎉"],
)
def test_text_without_markup_stays_plain(text: str) -> None:
    assert formatted_body(text) is None


@pytest.mark.parametrize(
    ("text", "html"),
    [
        ("**bold**", "<p><strong>bold</strong></p>"),
        ("*it* and `x<y`", "<p><em>it</em> and <code>x&lt;y</code></p>"),
        ("~~gone~~", "<p><s>gone</s></p>"),
        ("[site](https://example.org)", '<p><a href="https://example.org">site</a></p>'),
        ("```py\nx = 1\n```", '<pre><code class="language-py">x = 1\n</code></pre>'),
        ("> quoted", "<blockquote>\n<p>quoted</p>\n</blockquote>"),
        ("- one\n- two", "<ul>\n<li>one</li>\n<li>two</li>\n</ul>"),
        ("**a**\nb", "<p><strong>a</strong><br />\nb</p>"),
        ("![cat](https://example.org/c.png)", '<p><a href="https://example.org/c.png">cat</a></p>'),
    ],
)
def test_markdown_becomes_html(text: str, html: str) -> None:
    assert formatted_body(text) == html


@pytest.mark.parametrize(
    "text",
    [
        "<script>alert(1)</script> **x**",
        '<img src=x onerror="alert(1)"> *y*',
        "[click](javascript:alert(1)) **z**",
        "<b onclick=evil>raw</b> _w_",
        "**\x1b[31mred\x1b[0m**",
        "<iframe src=//evil></iframe> `c`",
        '[x](https://e.org "t\\" onclick=\\"a") **k**',
        '[x](https://e.org/"onclick="a) **k**',
        "3. third\n4. fourth",
    ],
)
def test_hostile_markdown_stays_inside_the_allowed_tags(text: str) -> None:
    html = formatted_body(text)
    assert html is not None
    assert tags(html) <= ALLOWED, html
    # Attributes only ever an escaped href (or a code block's language class).
    for attrs in re.findall(r"<[a-z0-9]+( [^>]*)>", html):
        assert re.fullmatch(r' (href="(https?:)?[^"]*"|class="language-[^"]*"|start="\d+")', attrs)
    assert "<script" not in html and "<iframe" not in html and "<b " not in html


def test_send_message_on_the_wire() -> None:
    plain = SendMessage("!r:example.org", "hi")
    assert to_wire(plain) == {"SendMessage": {"room_id": "!r:example.org", "body": "hi"}}
    rich = SendMessage("!r:example.org", "waves", msgtype="m.emote", markdown=True)
    data = {
        "SendMessage": {
            "room_id": "!r:example.org",
            "body": "waves",
            "msgtype": "m.emote",
            "markdown": True,
        }
    }
    assert to_wire(rich) == data
    assert command_from_wire(data) == rich
    assert command_from_wire(to_wire(plain)) == plain
    edit = EditMessage("!r:example.org", "$e:example.org", "b", markdown=True)
    assert to_wire(edit)["EditMessage"]["markdown"] is True
    assert command_from_wire(to_wire(edit)) == edit
    assert "markdown" not in to_wire(EditMessage("!r:x", "$e:x", "b"))["EditMessage"]
    for bad in ("m.image", "", 3):
        with pytest.raises(WireError):
            command_from_wire({"SendMessage": {"room_id": "!r:x", "body": "b", "msgtype": bad}})
    with pytest.raises(WireError):
        command_from_wire({"SendMessage": {"room_id": "!r:x", "body": "b", "markdown": "yes"}})
    with pytest.raises(ValueError, match="msgtype"):
        SendMessage("!r:x", "b", msgtype="m.file")


def test_row_fields_on_the_wire() -> None:
    row = EventItem(
        id="$e",
        event_id="$e",
        sender="@a:x",
        origin_server_ts=1,
        event_type="m.room.message",
        body="**b**",
        msgtype="m.notice",
        formatted_body="<strong>b</strong>",
    )
    data = to_wire(row)
    assert data["Event"]["msgtype"] == "m.notice"
    assert data["Event"]["formatted_body"] == "<strong>b</strong>"
    assert item_from_wire(data) == row
    bare = EventItem(
        id="$f", event_id="$f", sender="@a:x", origin_server_ts=1, event_type="m.x", body=None
    )
    assert "msgtype" not in to_wire(bare)["Event"]
    assert "formatted_body" not in to_wire(bare)["Event"]
    assert item_from_wire(to_wire(bare)) == bare


def mine(h, room: str) -> list[EventItem]:
    rows = h.mirror.items(room) or ()
    return [r for r in rows if isinstance(r, EventItem) and r.event_type == "m.room.message"]


async def test_markdown_and_emote_from_echo_to_event(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.sync_once()
        assert await h.engine.execute(OpenRoom(room)) == Ok()
        sends = [
            SendMessage(room, "**bold** move", markdown=True),
            SendMessage(room, "plain words", markdown=True),
            SendMessage(room, "waves *hard*", msgtype="m.emote", markdown=True),
            SendMessage(room, "**not rendered**"),
            SendMessage(room, "beep", msgtype="m.notice"),
        ]
        for command in sends:
            assert await h.engine.execute(command) == Ok()
        echoes = mine(h, room)[-5:]
        assert [e.msgtype for e in echoes] == ["m.text", "m.text", "m.emote", "m.text", "m.notice"]
        assert echoes[0].formatted_body == "<p><strong>bold</strong> move</p>"
        assert echoes[2].formatted_body == "<p>waves <em>hard</em></p>"
        assert [e.formatted_body for e in (echoes[1], echoes[3], echoes[4])] == [None] * 3
        await h.engine.send_queue.wait_sent(5)
        await h.engine.sync_once()
        rows = mine(h, room)[-5:]
        assert all(r.send_state is None for r in rows)
        # The server's events took the echoes' rows with the same content fields.
        assert [(r.id, r.body, r.msgtype, r.formatted_body) for r in rows] == [
            (e.id, e.body, e.msgtype, e.formatted_body) for e in echoes
        ]
        first = rows[0]
        assert await h.engine.execute(EditMessage(room, first.event_id, "now plain")) == Ok()
        await h.engine.send_queue.wait_sent(6)
        await h.engine.sync_once()
        edited = next(r for r in mine(h, room) if r.id == first.id)
        assert edited.edited and edited.body == "now plain" and edited.formatted_body is None
        second = rows[2]  # the emote
        answer = await h.engine.execute(
            EditMessage(room, second.event_id, "now *rich*", markdown=True)
        )
        assert answer == Ok()
        await h.engine.send_queue.wait_sent(7)
        await h.engine.sync_once()
        edited = next(r for r in mine(h, room) if r.id == second.id)
        assert edited.body == "now *rich*" and edited.formatted_body == "<p>now <em>rich</em></p>"
        assert edited.msgtype == "m.emote"  # an edit keeps the message's type
    sent = [e.content for e in fake.events(room) if e.type == "m.room.message"][:5]
    assert sent[0] == {
        "msgtype": "m.text",
        "body": "**bold** move",
        "format": HTML_FORMAT,
        "formatted_body": "<p><strong>bold</strong> move</p>",
    }
    assert sent[1] == {"msgtype": "m.text", "body": "plain words"}
    assert sent[2]["msgtype"] == "m.emote" and sent[2]["format"] == HTML_FORMAT
    assert sent[3] == {"msgtype": "m.text", "body": "**not rendered**"}
    assert sent[4] == {"msgtype": "m.notice", "body": "beep"}
    [rich_edit] = [
        e.content
        for e in fake.events(room)
        if e.content.get("m.new_content", {}).get("body") == "now *rich*"
    ]
    assert rich_edit["formatted_body"] == "* <p>now <em>rich</em></p>"
    assert rich_edit["m.new_content"]["format"] == HTML_FORMAT
