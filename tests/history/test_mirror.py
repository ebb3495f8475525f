"""The mirror, the publisher and the pure diff helper."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gapline.history import (
    Append,
    Clear,
    Continuity,
    DiffError,
    EventItem,
    EventQueue,
    GapLifecycle,
    HistoryGapItem,
    HistoryRepairChanged,
    HistoryRepairReport,
    Insert,
    Mirror,
    MirrorError,
    PushBack,
    PushFront,
    ReadMarkerItem,
    RecentHistoryChanged,
    RecentHistoryKind,
    RecentHistoryState,
    Remove,
    RepairPhase,
    Reset,
    Set,
    TimelineChanged,
    TimelineReset,
    TimelineState,
    apply_diff,
    apply_diffs,
)
from gapline.history._publish import Publisher

ROOM = "!room:example.org"
OTHER = "!other:example.org"


def ev(n: int) -> EventItem:
    return EventItem(
        id=f"row{n}",
        event_id=f"$e{n}:example.org",
        sender="@a:example.org",
        origin_server_ts=1_700_000_000_000 + n,
        event_type="m.room.message",
        body=f"message {n}",
    )


GAP = HistoryGapItem(id="gap1", older_boundary="$e1:example.org", newer_boundary="$e2:example.org")


# --------------------------------------------------------------------- apply_diff


def test_every_diff_applies_like_eyeball_im() -> None:
    a, b, c, d = ev(1), ev(2), ev(3), ev(4)
    items = (a, b)
    assert apply_diff(items, Append((c, d))) == (a, b, c, d)
    assert apply_diff(items, PushFront(c)) == (c, a, b)
    assert apply_diff(items, PushBack(c)) == (a, b, c)
    assert apply_diff(items, Insert(1, c)) == (a, c, b)
    assert apply_diff(items, Insert(2, c)) == (a, b, c)  # insert at len == push back
    assert apply_diff(items, Set(0, c)) == (c, b)
    assert apply_diff(items, Remove(0)) == (b,)
    assert apply_diff(items, Clear()) == ()
    assert apply_diff(items, Reset((d,))) == (d,)
    assert items == (a, b)  # pure


@pytest.mark.parametrize(
    "diff", [Insert(3, ev(9)), Set(2, ev(9)), Remove(2), Remove(-1), Insert(-1, ev(9))]
)
def test_out_of_range_diffs_raise(diff) -> None:
    with pytest.raises(DiffError):
        apply_diff((ev(1), ev(2)), diff)


def test_timeline_state_applies_in_order() -> None:
    state = TimelineState((ev(1),)).apply(PushBack(ev(2)), Insert(1, GAP), Set(1, GAP))
    assert state.items == (ev(1), GAP, ev(2))


@given(st.lists(st.integers(min_value=0, max_value=30), max_size=20))
def test_diffs_against_a_list_model(ops: list[int]) -> None:
    """Random diffs applied by apply_diffs agree with plain list operations."""
    model: list = []
    diffs = []
    for n, op in enumerate(ops):
        item = ev(n)
        kind = op % 5
        if kind == 0:
            diffs.append(PushBack(item))
            model.append(item)
        elif kind == 1:
            diffs.append(PushFront(item))
            model.insert(0, item)
        elif kind == 2:
            i = op % (len(model) + 1)
            diffs.append(Insert(i, item))
            model.insert(i, item)
        elif kind == 3 and model:
            i = op % len(model)
            diffs.append(Remove(i))
            del model[i]
        elif kind == 4 and model:
            i = op % len(model)
            diffs.append(Set(i, item))
            model[i] = item
    assert apply_diffs((), diffs) == tuple(model)


# --------------------------------------------------------------------- mirror


def test_a_room_without_an_entry_is_idle() -> None:
    mirror = Mirror()
    assert mirror.state.recent(ROOM) == RecentHistoryState.IDLE
    assert dict(mirror.state.recent_history) == {}
    assert mirror.items(ROOM) is None


def test_reset_then_diffs_build_the_rows() -> None:
    mirror = Mirror()
    mirror.apply(TimelineReset(ROOM, (ev(1), GAP, ev(2))))
    mirror.apply(TimelineChanged(ROOM, (PushBack(ev(3)), Remove(1))))
    assert mirror.items(ROOM) == (ev(1), ev(2), ev(3))
    assert mirror.state.timelines[ROOM] == (ev(1), ev(2), ev(3))


def test_recent_history_states_replace_the_entry() -> None:
    mirror = Mirror()
    mirror.apply(TimelineReset(ROOM, ()))
    for state in (
        RecentHistoryState.LOADING,
        RecentHistoryState.failed("server down"),
        RecentHistoryState.LOADING,
        RecentHistoryState.LOADED,
        RecentHistoryState.CANCELLED,
    ):
        mirror.apply(RecentHistoryChanged(ROOM, state))
        assert mirror.state.recent_history == {ROOM: state}


def test_repairs_keep_the_last_report_per_room() -> None:
    mirror = Mirror()
    bridging = HistoryRepairReport(room_id=ROOM, gap_id="gap1")
    settled = HistoryRepairReport(
        room_id=ROOM, gap_id="gap1", pages=2, events=63, phase=RepairPhase.Ready,
        continuity=Continuity.Verified,
    )  # fmt: skip
    other = HistoryRepairReport(room_id=OTHER, gap_id="g")
    mirror.apply(HistoryRepairChanged(bridging))
    assert mirror.state.repairs[ROOM] == bridging
    mirror.apply(HistoryRepairChanged(settled))
    mirror.apply(HistoryRepairChanged(other))
    assert dict(mirror.state.repairs) == {ROOM: settled, OTHER: other}


def test_idle_closes_the_room_and_drops_both_entries_and_the_rows() -> None:
    mirror = Mirror()
    for room in (ROOM, OTHER):
        mirror.apply(TimelineReset(room, (ev(1),)))
        mirror.apply(RecentHistoryChanged(room, RecentHistoryState.failed("x")))
        mirror.apply(HistoryRepairChanged(HistoryRepairReport(room_id=room, gap_id="g")))
    mirror.apply(RecentHistoryChanged(ROOM, RecentHistoryState.IDLE))
    state = mirror.state
    assert ROOM not in state.recent_history
    assert ROOM not in state.repairs
    assert ROOM not in state.timelines
    assert state.recent(ROOM).kind is RecentHistoryKind.Idle
    # the other room is untouched
    assert state.recent_history[OTHER] == RecentHistoryState.failed("x")
    assert OTHER in state.repairs
    assert state.timelines[OTHER] == (ev(1),)


def test_reopening_starts_from_the_new_reset() -> None:
    mirror = Mirror()
    mirror.apply(TimelineReset(ROOM, (ev(1),)))
    mirror.apply(RecentHistoryChanged(ROOM, RecentHistoryState.IDLE))
    mirror.apply(TimelineReset(ROOM, (ev(1), ev(2))))
    assert mirror.items(ROOM) == (ev(1), ev(2))


def test_a_snapshot_does_not_change_later() -> None:
    mirror = Mirror()
    mirror.apply(TimelineReset(ROOM, (ev(1),)))
    mirror.apply(RecentHistoryChanged(ROOM, RecentHistoryState.LOADING))
    before = mirror.state
    mirror.apply(TimelineChanged(ROOM, (PushBack(ev(2)),)))
    mirror.apply(RecentHistoryChanged(ROOM, RecentHistoryState.LOADED))
    assert before.timelines[ROOM] == (ev(1),)
    assert before.recent_history[ROOM] == RecentHistoryState.LOADING
    with pytest.raises(TypeError):
        cast(Any, before.recent_history)[ROOM] = RecentHistoryState.LOADED


def test_diffs_for_a_room_that_is_not_open_are_an_error() -> None:
    mirror = Mirror()
    with pytest.raises(MirrorError, match="not open"):
        mirror.apply(TimelineChanged(ROOM, (PushBack(ev(1)),)))
    mirror.apply(TimelineReset(ROOM, ()))
    mirror.apply(RecentHistoryChanged(ROOM, RecentHistoryState.IDLE))
    with pytest.raises(MirrorError, match="not open"):
        mirror.apply(TimelineChanged(ROOM, (PushBack(ev(1)),)))


def test_a_diff_that_does_not_fit_is_an_error_and_changes_nothing() -> None:
    mirror = Mirror()
    mirror.apply(TimelineReset(ROOM, (ev(1),)))
    with pytest.raises(MirrorError, match="Remove at 5"):
        mirror.apply(TimelineChanged(ROOM, (PushBack(ev(2)), Remove(5))))
    assert mirror.items(ROOM) == (ev(1),)


def test_gap_row_keeps_its_id_through_lifecycle_changes() -> None:
    mirror = Mirror()
    mirror.apply(TimelineReset(ROOM, (ev(1), GAP, ev(2), ReadMarkerItem())))
    failed = HistoryGapItem(
        id=GAP.id, older_boundary=GAP.older_boundary, newer_boundary=GAP.newer_boundary,
        lifecycle=GapLifecycle.Failed, failure="timeout",
    )  # fmt: skip
    mirror.apply(TimelineChanged(ROOM, (Set(1, failed),)))
    rows = mirror.items(ROOM)
    assert rows is not None
    assert rows[1].id == "gap1"
    assert isinstance(rows[1], HistoryGapItem)
    assert rows[1].lifecycle is GapLifecycle.Failed


# --------------------------------------------------------------------- publisher


async def test_publisher_fans_out_in_order_and_returns_after_every_sink() -> None:
    mirror = Mirror()
    queue = EventQueue()
    seen: list[tuple[str, object]] = []

    class Recorder:
        async def publish(self, event) -> None:
            # the mirror (added first) already applied the event
            seen.append(("recorder", mirror.items(ROOM)))

    publisher = Publisher([mirror, Recorder()])
    publisher.add(queue)
    await publisher.publish(TimelineReset(ROOM, (ev(1),)))
    await publisher.publish(TimelineChanged(ROOM, (PushBack(ev(2)),)))
    assert seen == [("recorder", (ev(1),)), ("recorder", (ev(1), ev(2)))]
    assert queue.pending() == [
        TimelineReset(ROOM, (ev(1),)),
        TimelineChanged(ROOM, (PushBack(ev(2)),)),
    ]


async def test_concurrent_publishes_do_not_interleave_across_sinks() -> None:
    order_a: list[int] = []
    order_b: list[int] = []

    class Slow:
        def __init__(self, out: list[int]) -> None:
            self.out = out

        async def publish(self, event) -> None:
            await asyncio.sleep(0)  # yield: another publish may try to run now
            self.out.append(event.state.message)

    publisher = Publisher([Slow(order_a), Slow(order_b)])
    events = [RecentHistoryChanged(ROOM, RecentHistoryState.failed(str(i))) for i in range(10)]
    async with asyncio.TaskGroup() as tg:
        for event in events:
            tg.create_task(publisher.publish(event))
    assert order_a == order_b
    assert sorted(order_a) == sorted(str(i) for i in range(10))


async def test_a_failing_sink_fails_the_publish() -> None:
    class Broken:
        async def publish(self, event) -> None:
            raise RuntimeError("sink bug")

    publisher = Publisher([Broken()])
    with pytest.raises(RuntimeError, match="sink bug"):
        await publisher.publish(TimelineReset(ROOM, ()))


async def test_event_queue_iterates_until_closed() -> None:
    queue = EventQueue()
    events = [TimelineReset(ROOM, ()), RecentHistoryChanged(ROOM, RecentHistoryState.LOADING)]
    for event in events:
        await queue.publish(event)
    queue.close()
    assert [e async for e in queue] == events
    assert await queue.get() is None  # stays closed
