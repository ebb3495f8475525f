"""``render`` leaves a row's defaults out on its common path: the row is the same value."""

from __future__ import annotations

from gapline.history._items import EventItem
from gapline.history._render import render
from gapline.matrix import ClientEvent


def test_a_plain_row_equals_the_row_with_every_field_spelled_out() -> None:
    event = ClientEvent(
        event_id="$e1",
        type="m.room.message",
        sender="@a:x",
        origin_server_ts=7,
        content={"body": "hi", "msgtype": "m.text"},
    )
    full = EventItem(
        id="$e1",
        event_id="$e1",
        sender="@a:x",
        origin_server_ts=7,
        event_type="m.room.message",
        body="hi",
        edited=False,
        redacted=False,
        receipts=(),
        sender_name="Ann",
        in_reply_to=None,
        reactions=(),
        thread_summary=None,
        encrypted=False,
        decryption=None,
        send_state=None,
        msgtype="m.text",
        formatted_body=None,
    )
    assert render(event, None, sender_name="Ann") == full


def test_a_row_with_html_still_carries_it() -> None:
    content = {
        "body": "hi",
        "msgtype": "m.text",
        "format": "org.matrix.custom.html",
        "formatted_body": "<b>hi</b>",
    }
    event = ClientEvent(
        event_id="$e2", type="m.room.message", sender="@a:x", origin_server_ts=8, content=content
    )
    row = render(event, None)
    assert (row.body, row.formatted_body, row.msgtype) == ("hi", "<b>hi</b>", "m.text")
