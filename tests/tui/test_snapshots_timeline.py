"""Snapshots of every row kind the relation rules make: a reply's quote (ready, pending,
unavailable), reaction chips, a thread summary, an edited and a deleted message, a state
event in words, display names in their colours, the unread divider; with the member list
and the typing line; and a thread's own view. Baselines in ``__snapshots__/``."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot

from gapline.history import Member, MembersChanged, TypingChanged
from tests.tui.fake_engine import ROOM
from tests.tui.support import make_app, until
from tests.tui.timeline_items import ALICE, BOB, CAROL, rich_room, thread_of_root

MEMBERS = (
    Member(user_id=ALICE, display_name="Alice Liddell"),
    Member(user_id=BOB, display_name="Bob"),
    Member(user_id=CAROL, display_name="Carol"),
)


@pytest.mark.parametrize(
    ("size", "theme"),
    [((100, 30), "textual-dark"), ((80, 24), "textual-light")],
    ids=["100x30", "80x24-light"],
)
def test_every_row_kind(snap_compare, size: tuple[int, int], theme: str) -> None:
    app, fake = make_app(rich_room())
    app.theme = theme

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        await fake.publish(MembersChanged(ROOM, MEMBERS))
        await fake.publish(TypingChanged(ROOM, (CAROL,)))
        await until(pilot, lambda: app.query_one("#typing").has_class("-typing"), "typing")
        await pilot.press("m")
        app.timeline.select("e3")
        app.timeline.scroll_end(animate=False, immediate=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_a_thread_view(snap_compare) -> None:
    app, _ = make_app(rich_room(), threads={"$e6": thread_of_root()})

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: len(app.timeline.rows) == 10, "the rows")
        app.timeline.select("e6")
        await pilot.press("t")
        await until(pilot, lambda: len(app.timeline.rows) == 3, "the thread")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
