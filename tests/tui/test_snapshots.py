"""Snapshots (pytest-textual-snapshot) of a timeline with a gap in every state.

One room holds a gap of each lifecycle (``Unavailable`` at the top, ``Failed``,
``Paused`` by the page budget, ``Idle``) and a gap being filled (one page in,
progress bar shown), at 80x24 and at 160x48, and at 80x24 in the light theme. Baselines live in
``__snapshots__/``; regenerate them with ``--snapshot-update`` after looking
at the SVGs.
"""

from __future__ import annotations

import pytest
from textual.pilot import Pilot

from gapline.history import EventItem, GapLifecycle, TimelineItem
from tests.tui.fake_engine import FillPlan, gap, message
from tests.tui.support import gap_text, make_app, page, until


def every_state() -> list[TimelineItem]:
    items: list[TimelineItem] = [gap("top", GapLifecycle.Unavailable)]
    items += [message(1), message(2, edited=True)]
    items.append(gap("failed", GapLifecycle.Failed, failure="the homeserver is unavailable"))
    items += [message(10), message(11, redacted=True, body=None)]
    items.append(gap("budget", GapLifecycle.Idle))
    items += [message(20, sender="@bob:example.org")]
    items.append(gap("filling", GapLifecycle.Idle))
    items += [message(40), message(41, sender="@bob:example.org")]
    items.append(gap("idle", GapLifecycle.Idle))
    items += [
        message(60),
        EventItem(
            id="long",
            event_id="$long",
            sender="@bob:example.org",
            origin_server_ts=message(61).origin_server_ts,
            event_type="m.room.message",
            body="a longer message that wraps onto a second line when the terminal is narrow, "
            "as long messages do",
        ),
    ]
    return items


def _app():
    plans = {
        "budget": FillPlan(pages=[page(18, 19)], end="budget"),
        "filling": FillPlan(pages=[page(36, 37, 38, 39)], manual=True),
    }
    return make_app(every_state(), plans=plans)


@pytest.mark.parametrize(
    ("size", "theme"),
    [((80, 24), "textual-dark"), ((160, 48), "textual-dark"), ((80, 24), "textual-light")],
    ids=["80x24", "160x48", "80x24-light"],
)
def test_every_gap_state(snap_compare, size: tuple[int, int], theme: str) -> None:
    app, fake = _app()
    app.theme = theme

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: app.timeline.gaps(), "the gaps")
        app.timeline.select("budget")
        await pilot.press("f")
        await until(pilot, lambda: "page budget" in gap_text(app, "budget"), "the budget pause")
        app.timeline.select("filling")
        await pilot.press("f")
        fake.step()
        await until(pilot, lambda: "1 page, 4 events" in gap_text(app, "filling"), "one page")
        app.timeline.select("idle")
        app.timeline.scroll_end(animate=False, immediate=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)
