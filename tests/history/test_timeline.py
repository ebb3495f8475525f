"""The timeline diff builder: rows from the cache's updates, ids kept, diffs that replay."""

from __future__ import annotations

from gapline.history import (
    Append,
    EventItem,
    HistoryGapItem,
    Insert,
    ReadMarkerItem,
    Remove,
    Reset,
    Set,
    TimelineChanged,
    apply_diffs,
)
from gapline.history._cache_store import Window
from gapline.history._timeline import Timeline
from gapline.history._types import GapLifecycle
from gapline.history._updates import (
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRecord,
    GapRemoved,
    ReceiptsChanged,
    StoredEvent,
)
from gapline.matrix import ClientEvent

ROOM = "!r:x"


def ev(n: int) -> ClientEvent:
    return ClientEvent(
        event_id=f"$e{n}",
        type="m.room.message",
        sender="@a:x",
        origin_server_ts=n,
        content={"body": f"b{n}"},
    )


def gap(newer_ord: int, older: str, newer: str, **kw) -> GapRecord:
    return GapRecord(
        gap_id="gap-1",
        newer_ord=newer_ord,
        older_ord=newer_ord - 1,
        older_boundary=older,
        newer_boundary=newer,
        cursor="c",
        **kw,
    )


class Sink:
    def __init__(self) -> None:
        self.events: list[TimelineChanged] = []

    async def publish(self, event) -> None:
        self.events.append(event)


def kinds(items) -> list[str]:
    out = []
    for item in items:
        if isinstance(item, EventItem):
            out.append(item.event_id)
        elif isinstance(item, HistoryGapItem):
            out.append(f"gap:{item.lifecycle.value}")
        else:
            out.append("marker")
    return out


async def test_rows_from_window_and_updates_replay_exactly():
    sink = Sink()
    timeline = Timeline(ROOM, sink.publish)
    window = Window(
        events=[StoredEvent(0, 0, ev(1)), StoredEvent(0, 1, ev(2)), StoredEvent(1, 0, ev(10))],
        gaps=[gap(1, "$e2", "$e10")],
        receipts={"@b:x": "$e2"},
        fully_read="$e1",
    )
    reset = timeline.reset(window, limit=100)
    assert kinds(reset.items) == ["$e1", "marker", "$e2", "gap:Idle", "$e10"]
    marked = reset.items[2]
    assert isinstance(marked, EventItem) and marked.receipts == ("@b:x",)
    assert isinstance(reset.items[1], ReadMarkerItem)
    timeline.queue(
        [
            EventsAdded(1, -2, (ev(8), ev(9))),  # a fill prepends to the newer section
            GapChanged(gap(1, "$e2", "$e8", lifecycle=GapLifecycle.Paused)),
            EventsAdded(1, 1, (ev(11), ev(12))),  # a sync appends
            ReceiptsChanged((("@b:x", "$e11"),), "$e9"),
        ]
    )
    await timeline.flush_history()
    [changed] = sink.events
    assert not any(isinstance(d, Reset) for d in changed.diffs)
    assert any(isinstance(d, Append) for d in changed.diffs)
    assert any(isinstance(d, Insert) for d in changed.diffs)
    assert apply_diffs(reset.items, changed.diffs) == timeline.state.items
    assert kinds(timeline.state.items) == [
        "$e1", "$e2", "gap:Paused", "$e8", "$e9", "marker", "$e10", "$e11", "$e12",
    ]  # fmt: skip
    gap_row = timeline.state.items[2]
    assert isinstance(gap_row, HistoryGapItem) and gap_row.id == "gap-1"
    # The gap joins: its row goes, nothing else moves.
    before = timeline.state.items
    timeline.queue([EventsAdded(1, -3, (ev(7),)), GapRemoved(gap(1, "$e2", "$e7"))])
    await timeline.flush_history()
    assert apply_diffs(before, sink.events[-1].diffs) == timeline.state.items
    assert "gap:Paused" not in kinds(timeline.state.items)
    assert isinstance(sink.events[-1].diffs[-1], Remove)


async def test_updates_are_idempotent_and_below_window_is_skipped():
    sink = Sink()
    timeline = Timeline(ROOM, sink.publish)
    events = [StoredEvent(0, p, ev(p + 100)) for p in range(100)]
    reset = timeline.reset(Window(events=events, gaps=[]), limit=100)
    assert not timeline.complete_below  # a full window: there may be more below
    timeline.queue(
        [
            EventsAdded(0, -5, (ev(1), ev(2))),  # below the window: loads on scroll-back
            EventsAdded(0, 100, (ev(500),)),
            EventsAdded(0, 100, (ev(500),)),  # the same commit seen twice
            GapChanged(gap(1, "$x", "$y")),  # a gap whose rows are not loaded
        ]
    )
    await timeline.flush_history()
    [changed] = sink.events
    assert changed.diffs == (Append((timeline.state.items[-1],)),)
    assert apply_diffs(reset.items, changed.diffs) == timeline.state.items
    assert len(timeline.state.items) == 101


async def test_gap_row_appears_only_between_loaded_sections():
    sink = Sink()
    timeline = Timeline(ROOM, sink.publish)
    timeline.reset(Window(events=[StoredEvent(0, 0, ev(1))], gaps=[]), limit=100)
    timeline.queue(
        [
            EventsAdded(1, 0, (ev(20),)),
            GapAdded(gap(1, "$e1", "$e20")),
            GapAdded(
                GapRecord(
                    gap_id="top",
                    newer_ord=0,
                    older_ord=None,
                    older_boundary=None,
                    newer_boundary="$e1",
                    cursor="t",
                )
            ),
        ]
    )
    await timeline.flush_history()
    assert kinds(timeline.state.items) == ["$e1", "gap:Idle", "$e20"]
    assert [type(d) for d in sink.events[-1].diffs] == [Append, Insert]
    assert isinstance(sink.events[-1].diffs[1], Insert) and sink.events[-1].diffs[1].index == 1
    assert not any(isinstance(d, Set) for d in sink.events[-1].diffs)
