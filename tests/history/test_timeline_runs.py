"""A page's rows placed in one go make the diffs the row-by-row placement makes."""

from __future__ import annotations

from typing import Any

import pytest

from gapline.history import EventItem, Insert, Set, TimelineChanged, apply_diffs
from gapline.history._cache_store import Window
from gapline.history._items import InReplyTo, ReplyStatus
from gapline.history._render import render
from gapline.history._timeline import Timeline
from gapline.history._updates import EventsAdded, GapRecord, StoredEvent, Update
from gapline.matrix import ClientEvent

ROOM = "!r:x"


def ev(n: int, reply_to: int | None = None) -> ClientEvent:
    content: dict = {"body": f"b{n}", "msgtype": "m.text"}
    if reply_to is not None:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": f"$e{reply_to}"}}
    return ClientEvent(
        event_id=f"$e{n}", type="m.room.message", sender="@a:x", origin_server_ts=n,
        content=content,
    )  # fmt: skip


GAP = GapRecord(
    gap_id="gap-1", newer_ord=1, older_ord=0, older_boundary="$e1", newer_boundary="$e10",
    cursor="c",
)  # fmt: skip


def window(**kw) -> Window:
    """Section 0 holds $e0..$e1, section 1 (behind a gap) $e10..$e11."""
    events = [StoredEvent(0, 0, ev(0)), StoredEvent(0, 1, ev(1))]
    events += [StoredEvent(1, 0, ev(10)), StoredEvent(1, 1, ev(11))]
    return Window(events=events, gaps=[GAP], **kw)


def page(ord_: int, pos: int, numbers: list[int], **kw) -> EventsAdded:
    events = tuple(ev(n) for n in numbers)
    items = tuple(render(e, None) for e in events)
    return EventsAdded(ord_, pos, events, items, kw.pop("shown", (True,) * len(events)))


async def placed(
    updates: list[Update], *, runs: bool, around: dict[str, Any], limit: int
) -> tuple[list, list]:
    published: list[TimelineChanged] = []

    async def publish(event) -> None:
        published.append(event)

    timeline = Timeline(ROOM, publish)
    if not runs:  # the row-by-row loop only
        setattr(timeline, "_place_run", lambda *a: False)  # noqa: B010 - a test's seam
    start = timeline.reset(window(**around), limit=limit).items
    timeline.queue(updates)
    await timeline.flush_history()
    diffs = [d for event in published for d in event.diffs]
    assert apply_diffs(start, diffs) == timeline.state.items
    return diffs, list(timeline.state.items)


CASES: dict[str, tuple[list[Update], dict[str, Any], int]] = {
    "a fill before the newer section's head": ([page(1, -3, [7, 8, 9])], {}, 100),
    "a sync after the newest row": ([page(1, 2, [12, 13])], {}, 100),
    "rows with receipts on them": ([page(1, -2, [8, 9])], {"receipts": {"@b:x": "$e9"}}, 100),
    "a row already loaded among them": ([page(1, 0, [10, 12])], {}, 100),
    "rows around a loaded row": ([page(0, 0, [5, 6, 7])], {}, 100),
    "the fully-read event among them": ([page(1, -2, [8, 9])], {"fully_read": "$e8"}, 100),
    "a hidden row among them": ([page(1, -2, [8, 9], shown=(True, False))], {}, 100),
    "the oldest rows below a full window": ([page(0, -2, [20, 21])], {}, 4),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_page_placed_in_one_go_makes_the_same_diffs_and_rows(case: str) -> None:
    updates, around, limit = CASES[case]
    slow = await placed(updates, runs=False, around=around, limit=limit)
    fast = await placed(updates, runs=True, around=around, limit=limit)
    assert fast == slow


async def test_a_quoted_row_arriving_in_a_page_updates_the_reply_quoting_it() -> None:
    """A reply loaded before the event it quotes: the page that brings the event goes the
    row-by-row way, and the reply's quote is updated as it would be."""
    reply = ev(11, reply_to=9)
    pending = InReplyTo(event_id="$e9", status=ReplyStatus.Pending)
    rows = [render(ev(10), None), render(reply, None, reply=pending)]
    events = [StoredEvent(1, 0, ev(10)), StoredEvent(1, 1, reply)]
    start = Window(events=events, gaps=[GAP], items=rows)
    diffs = {}
    for runs in (False, True):
        published: list[TimelineChanged] = []

        async def publish(event, out=published) -> None:
            out.append(event)

        timeline = Timeline(ROOM, publish)
        if not runs:
            setattr(timeline, "_place_run", lambda *a: False)  # noqa: B010 - a test's seam
        timeline.reset(start, limit=100)
        assert "$e9" in timeline._quoting
        timeline.queue([page(1, -2, [8, 9])])
        await timeline.flush_history()
        diffs[runs] = [d for e in published for d in e.diffs]
    assert diffs[True] == diffs[False]
    assert [type(d) for d in diffs[True]] == [Insert, Insert, Set]
    last = diffs[True][-1]
    assert isinstance(last, Set) and isinstance(last.value, EventItem)
    quote = last.value.in_reply_to
    assert quote is not None and (quote.status, quote.body) == (ReplyStatus.Ready, "b9")


async def test_a_run_is_placed_in_one_go_in_the_simple_case() -> None:
    """The fast path does run (so the cases above compare two different paths)."""
    calls: list[bool] = []

    async def publish(event) -> None:
        pass

    timeline = Timeline(ROOM, publish)
    real = timeline._place_run

    def spy(*args):
        calls.append(real(*args))
        return calls[-1]

    setattr(timeline, "_place_run", spy)  # noqa: B010 - a test's seam
    timeline.reset(window(), limit=100)
    timeline.queue([page(1, -3, [7, 8, 9]), page(1, 0, [10, 12])])
    await timeline.flush_history()
    assert calls == [True, False]
    rows = [i.event_id for i in timeline.state.items if isinstance(i, EventItem)]
    assert rows == ["$e0", "$e1", "$e7", "$e8", "$e9", "$e10", "$e11"]
