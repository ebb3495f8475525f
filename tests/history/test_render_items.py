"""A rendered row is the same value the ``EventItem`` constructor makes from its fields
(``render`` sets the slots directly, for speed): equal, same hash, still frozen, and
``dataclasses.replace`` works on it."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from gapline.history._aggregates import Aggregate, Annotation, ThreadReply, ThreadState
from gapline.history._decryption import MARK
from gapline.history._items import EventItem, InReplyTo, ReplyStatus
from gapline.history._render import render
from gapline.matrix import ClientEvent


def event(**fields: object) -> ClientEvent:
    base: dict[str, object] = {
        "event_id": "$e",
        "type": "m.room.message",
        "sender": "@a:x",
        "origin_server_ts": 7,
        "content": {"msgtype": "m.text", "body": "hello"},
    }
    base.update(fields)
    return msgspec.convert(base, ClientEvent)


AGGREGATE = Aggregate(
    annotations=(Annotation("+", "@b:x", "$r", 8),),
    thread=ThreadState(count=2, latest=ThreadReply("$t", "@b:x", 9, body="reply")),
)
CASES = [
    render(event(), None),
    render(event(), AGGREGATE, sender_name="Alice", me="@b:x"),
    render(event(), None, reply=InReplyTo(event_id="$q", status=ReplyStatus.Pending)),
    render(
        event(
            content={
                "msgtype": "m.text",
                "body": "b",
                "format": "org.matrix.custom.html",
                "formatted_body": "<b>b</b>",
            },
        ),
        None,
    ),
    render(event(content={}, unsigned={"redacted_because": {"event_id": "$x"}}), AGGREGATE),
    render(event(type="m.room.encrypted", content={"session_id": "s"}), None),
    render(
        event(
            type="m.room.encrypted",
            content={"session_id": "s"},
            unsigned={MARK: {"session_id": "s", "reason": "missing_room_key"}},
        ),
        None,
    ),
    render(event(type="m.room.member", state_key="@a:x", content={"membership": "join"}), None),
]


@pytest.mark.parametrize("item", CASES)
def test_a_rendered_row_is_the_constructors_value(item: EventItem) -> None:
    fields = {f.name: getattr(item, f.name) for f in dataclasses.fields(EventItem)}
    made = EventItem(**fields)
    assert item == made and hash(item) == hash(made) and repr(item) == repr(made)
    assert type(item) is EventItem
    assert (item.receipts, item.send_state) == ((), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(item, "body", "changed")  # noqa: B010 (the frozen check itself)
    assert dataclasses.replace(item, receipts=("@c:x",)).receipts == ("@c:x",)
