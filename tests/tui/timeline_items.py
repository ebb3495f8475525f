"""A room showing every kind of row the relation rules make (for pilots and snapshots)."""

from __future__ import annotations

from msgspec.structs import replace

from gapline.history import (
    InReplyTo,
    Reaction,
    ReadMarkerItem,
    ReplyStatus,
    ThreadLatest,
    ThreadSummary,
    TimelineItem,
)
from tests.tui.fake_engine import message

ALICE = "@alice:example.org"
BOB = "@bob:example.org"
CAROL = "@carol:example.org"


def rich_room() -> list[TimelineItem]:
    joined = replace(
        message(1, sender=CAROL), event_type="m.room.member", body="joined the room",
        sender_name="Carol",
    )  # fmt: skip
    question = replace(message(2, sender=BOB), body="lunch at noon?", sender_name="Bob")
    answer = replace(
        message(3),
        body="sounds good",
        sender_name="Alice Liddell",
        in_reply_to=InReplyTo(
            event_id="$e2", status=ReplyStatus.Ready, sender=BOB, sender_name="Bob",
            body="lunch at noon?",
        ),
        reactions=(Reaction("👍", (BOB, CAROL)), Reaction("🎉", (ALICE,))),
    )  # fmt: skip
    pending = replace(
        message(4, sender=CAROL), body="and dessert?", sender_name="Carol",
        in_reply_to=InReplyTo(event_id="$old"),
    )  # fmt: skip
    unavailable = replace(
        message(5, sender=BOB), body="see above", sender_name="Bob",
        in_reply_to=InReplyTo(event_id="$gone", status=ReplyStatus.Unavailable),
    )  # fmt: skip
    root = replace(
        message(6, sender=BOB),
        body="where do we meet?",
        sender_name="Bob",
        thread_summary=ThreadSummary(
            count=2,
            latest=ThreadLatest(event_id="$t2", sender=CAROL, sender_name="Carol", body="lobby"),
            participated=True,
        ),
    )  # fmt: skip
    edited = replace(message(7), body="on my way (bike)", edited=True, sender_name="Alice Liddell")
    deleted = replace(message(8, sender=BOB), body=None, redacted=True, sender_name="Bob")
    after = replace(message(9, sender=CAROL), body="new since you read", sender_name="Carol")
    return [joined, question, answer, pending, unavailable, root, edited, deleted,
            ReadMarkerItem(), after]  # fmt: skip


def thread_of_root() -> list[TimelineItem]:
    root = replace(message(6, sender=BOB), body="where do we meet?", sender_name="Bob")
    return [
        root,
        replace(message(61), id="t1", event_id="$t1", body="front door?"),
        replace(message(62, sender=CAROL), id="t2", event_id="$t2", body="lobby",
                sender_name="Carol"),
    ]  # fmt: skip
