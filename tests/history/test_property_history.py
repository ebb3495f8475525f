"""Property: whatever the interleaving of messages, syncs, recent loads, fills and restarts,
the cache and the timeline keep the server's order, hold no duplicate, and show every
discontinuity as a gap (against the in-memory fake homeserver)."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gapline.history import FillGap, HistoryRepair, OpenRoom, RetryRecent
from gapline.matrix.testing import FakeHomeserver
from tests.history.test_engine_support import (
    NO_RETRY,
    assert_mirror_matches,
    event_ids,
    gap_rows,
    no_sleep,
    open_engine,
)

step = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 130)),
    st.tuples(st.just("sync"), st.just(0)),
    st.tuples(st.just("recent"), st.just(0)),
    st.tuples(st.just("fill"), st.just(0)),
    st.tuples(st.just("restart"), st.just(0)),
    st.tuples(st.just("race"), st.integers(1, 130)),
)


def check_order(ids: list[str], server: list[str], gaps: set[tuple[str, str]]) -> None:
    index = {event_id: i for i, event_id in enumerate(server)}
    assert len(ids) == len(set(ids)), "duplicate events"
    positions = [index[i] for i in ids]
    assert positions == sorted(positions), "order differs from the server's"
    for a, b in itertools.pairwise(ids):
        if index[b] != index[a] + 1:
            assert (a, b) in gaps, f"discontinuity {a} -> {b} without a gap"


async def scenario(steps: list[tuple[str, int]], race_at_open: bool) -> None:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="p")
    fake.send_messages(alice.user_id, room, [f"seed {i}" for i in range(15)])
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        async with fake.client(alice, retry=NO_RETRY, sleep=no_sleep) as client:
            for _ in range(2 + sum(1 for s, _ in steps if s == "restart")):
                restart = False
                async with open_engine(store, client) as h:
                    engine = h.engine
                    if race_at_open:
                        # The first sync and the room's recent load run at the same time.
                        async def open_room(engine=engine) -> None:
                            await engine.execute(OpenRoom(room))
                            await engine.execute(HistoryRepair(RetryRecent(room)))

                        await asyncio.gather(engine.sync_once(), open_room())
                    else:
                        await engine.sync_once()
                        await engine.execute(OpenRoom(room))
                        await engine.execute(HistoryRepair(RetryRecent(room)))
                    while steps:
                        kind, n = steps.pop(0)
                        if kind == "send":
                            fake.send_messages(alice.user_id, room, [f"m {i}" for i in range(n)])
                        elif kind == "sync":
                            await engine.sync_once()
                        elif kind == "recent":
                            await engine.execute(HistoryRepair(RetryRecent(room)))
                        elif kind == "race":
                            # New messages, then a sync and a recent load at the same time.
                            fake.send_messages(alice.user_id, room, [f"r {i}" for i in range(n)])
                            await asyncio.gather(
                                engine.sync_once(),
                                engine.execute(HistoryRepair(RetryRecent(room))),
                            )
                        elif kind == "fill":
                            rows = gap_rows(engine.timeline(room).state.items)
                            if rows:
                                await engine.execute(HistoryRepair(FillGap(room, rows[0].id)))
                        else:
                            restart = True
                            break
                        server = fake.event_ids(room)
                        stored = [e.event_id for e in await engine.store.all_events(room)]
                        gaps = {
                            (g.older_boundary or "", g.newer_boundary)
                            for g in await engine.store.all_gaps(room)
                            if not g.is_top
                        }
                        check_order(stored, server, gaps)
                        items = engine.timeline(room).state.items
                        shown = event_ids(items)
                        check_order(
                            shown,
                            server,
                            {(g.older_boundary, g.newer_boundary) for g in gap_rows(items)},
                        )
                        assert_mirror_matches(h, room)
                if not restart:
                    break


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(step, min_size=1, max_size=8), st.booleans())
def test_random_interleavings_keep_order_and_gaps(steps, race_at_open):
    asyncio.run(scenario(list(steps), race_at_open))
