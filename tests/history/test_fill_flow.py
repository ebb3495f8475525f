"""The backwards-walk flow on canned pages: no I/O, just the policy."""

from __future__ import annotations

from gapline.history._fill import (
    Commit,
    Fetch,
    WalkCancelled,
    WalkEnd,
    WalkFailed,
    WalkOutcome,
    backwards_walk,
)
from gapline.history._walk_state import PageResult, WalkState
from gapline.matrix import ClientEvent, MessagesResponse


def page(n: int, end: str | None, start: str = "s") -> MessagesResponse:
    chunk = [
        ClientEvent(
            event_id=f"${end}-{i}",
            type="m.room.message",
            sender="@a:x",
            origin_server_ts=i,
            content={"body": str(i)},
        )
        for i in range(n)
    ]
    return MessagesResponse(chunk=chunk, start=start, end=end)


def result(inserted: int, *, joined: bool = False, start_reached: bool = False) -> PageResult:
    return PageResult(WalkState(), inserted, joined, start_reached, None)


def drive(flow, pages, results) -> tuple[WalkOutcome, list[Fetch], list[Commit]]:
    """Feed ``pages`` to fetches and ``results`` to commits; return what the flow did."""
    fetches: list[Fetch] = []
    commits: list[Commit] = []
    pages, results = iter(pages), iter(results)
    try:
        effect = next(flow)
        while True:
            if isinstance(effect, Fetch):
                fetches.append(effect)
                effect = flow.send(next(pages))
            else:
                commits.append(effect)
                effect = flow.send(next(results))
    except StopIteration as stop:
        return stop.value, fetches, commits


def test_walk_stops_on_budget_and_counts_what_it_committed():
    flow = backwards_walk("!r:x", "t0", page_size=50, budget=4)
    outcome, fetches, commits = drive(
        flow, [page(50, f"t{i}") for i in range(1, 9)], [result(50)] * 8
    )
    assert outcome == WalkOutcome(WalkEnd.Budget, 4, 200)
    assert [dict(f.request.query)["from"] for f in fetches] == ["t0", "t1", "t2", "t3"]
    assert {dict(f.request.query)["dir"] for f in fetches} == {"b"}
    assert {dict(f.request.query)["limit"] for f in fetches} == {"50"}
    assert [c.last for c in commits] == [False, False, False, True]
    assert [c.end for c in commits] == ["t1", "t2", "t3", "t4"]


def test_walk_from_fresh_position_sends_no_from():
    flow = backwards_walk("!r:x", None, page_size=50, budget=4)
    outcome, fetches, _ = drive(flow, [page(10, "t1")], [result(3, joined=True)])
    assert outcome == WalkOutcome(WalkEnd.Joined, 1, 3)
    assert "from" not in dict(fetches[0].request.query)
    assert fetches[0].request.path.endswith("/messages")


def test_walk_ends_when_history_ends():
    flow = backwards_walk("!r:x", "t0", page_size=50, budget=4)
    outcome, _, commits = drive(
        flow, [page(50, "t1"), page(7, None)], [result(50), result(7, start_reached=True)]
    )
    assert outcome == WalkOutcome(WalkEnd.StartReached, 2, 57)
    assert commits[-1].end is None


def test_repeated_cursor_stalls_without_committing_the_page():
    flow = backwards_walk("!r:x", "t0", page_size=50, budget=4)
    outcome, _, commits = drive(flow, [page(50, "t1"), page(50, "t1")], [result(50)])
    assert outcome == WalkOutcome(WalkEnd.CursorStalled, 1, 50)
    assert len(commits) == 1
    flow = backwards_walk("!r:x", "t0", page_size=50, budget=4)
    outcome, _, commits = drive(flow, [page(50, "t0")], [])
    assert outcome == WalkOutcome(WalkEnd.CursorStalled, 0, 0)
    assert commits == []


def test_failure_and_cancellation_keep_the_counts():
    flow = backwards_walk("!r:x", "t0", page_size=50, budget=4)
    assert isinstance(next(flow), Fetch)
    assert isinstance(flow.send(page(50, "t1")), Commit)
    assert isinstance(flow.send(result(40)), Fetch)
    try:
        flow.throw(WalkFailed("HTTP 502"))
    except StopIteration as stop:
        assert stop.value == WalkOutcome(WalkEnd.Failed, 1, 40, "HTTP 502")
    else:
        raise AssertionError("the flow must end")
    flow = backwards_walk("!r:x", "t0", page_size=50, budget=4)
    next(flow)
    try:
        flow.throw(WalkCancelled())
    except StopIteration as stop:
        assert stop.value == WalkOutcome(WalkEnd.Cancelled, 0, 0)
    else:
        raise AssertionError("the flow must end")
