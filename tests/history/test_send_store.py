"""The send queue's table on both backends (SQLite and a real PostgreSQL): queue order,
durability across reopen, the row's states, settling by transaction id or event id in
the sync's transaction, and unreadable rows stepped over."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gapline.history._cache_store import CacheStore
from gapline.history._send_store import SendRow
from gapline.history._updates import EchoSettled
from gapline.matrix import ClientEvent
from tests.history.cache_contract import ROOM, open_cache, write

OTHER = "!other:example.org"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("postgres_dsn")
    return str(tmp_path / "history.sqlite3")


@pytest.fixture
async def open_store(dsn: str) -> AsyncIterator[Callable[[], Awaitable[CacheStore]]]:
    opened: list[CacheStore] = []

    async def open_store() -> CacheStore:
        store = await open_cache(dsn)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.backend.close()


async def enqueue(store: CacheStore, txn: str, body: str, room: str = ROOM):
    return await store.backend.write(
        lambda tx: store.sends.enqueue(
            tx,
            txn_id=txn,
            room_id=room,
            event_type="m.room.message",
            content={"msgtype": "m.text", "body": body},
            created_ts=1,
        )
    )


async def pending_order(store: CacheStore) -> list[str]:
    out, after = [], 0
    while True:
        queued, after = await store.backend.read(
            lambda tx, after=after: store.sends.next_pending(tx, after)
        )
        if queued is None:
            return out
        out.append(queued.txn_id)


def echo(event_id: str, txn: str | None = None) -> ClientEvent:
    return ClientEvent(
        event_id=event_id,
        type="m.room.message",
        sender="@a:example.org",
        origin_server_ts=2,
        content={"body": "x"},
        unsigned={} if txn is None else {"transaction_id": txn},
    )


async def test_queue_order_and_content_survive_reopen(open_store) -> None:
    store = await open_store()
    for i, room in enumerate((ROOM, OTHER, ROOM)):
        await enqueue(store, f"t{i}", f"body {i}", room)
    await store.backend.close()
    store = await open_store()
    assert await pending_order(store) == ["t0", "t1", "t2"]
    rows = await store.backend.read(lambda tx: store.sends.of_room(tx, ROOM))
    assert [(q.txn_id, q.body, q.state) for q in rows] == [
        ("t0", "body 0", SendRow.PENDING),
        ("t2", "body 2", SendRow.PENDING),
    ]
    assert await store.backend.read(store.sends.counts) == (3, 0)


async def test_acknowledged_rows_wait_for_the_sync_that_settles_them(open_store) -> None:
    store = await open_store()
    for txn in ("a", "b", "c"):
        await enqueue(store, txn, txn)
    sent = await store.backend.write(lambda tx: store.sends.mark_sent(tx, "a", "$a"))
    assert sent is not None and (sent.state, sent.event_id) == (SendRow.SENT, "$a")
    await store.backend.write(lambda tx: store.sends.mark_sent(tx, "b", "$b"))
    assert await pending_order(store) == ["c"]
    assert await store.backend.read(store.sends.counts) == (3, 0)
    # By event id (no transaction id on it), and by our transaction id on the echo.
    settled = await store.backend.write(
        lambda tx: store.sends.settle(tx, ROOM, [echo("$a"), echo("$c", txn="c")], limited=False)
    )
    assert settled == [EchoSettled("a", None), EchoSettled("c", "$c")]
    # A limited sync: an acknowledged row's event is in the gap, and it settles too.
    await enqueue(store, "d", "d")
    settled = await store.backend.write(lambda tx: store.sends.settle(tx, ROOM, [], limited=True))
    assert settled == [EchoSettled("b", None)]
    assert await pending_order(store) == ["d"]
    assert store.sends.settled == 3


async def test_queue_positions_keep_growing_after_the_queue_emptied(open_store) -> None:
    store = await open_store()
    first = await enqueue(store, "a", "a")
    await store.backend.write(
        lambda tx: store.sends.settle(tx, ROOM, [echo("$a", txn="a")], limited=False)
    )
    second = await enqueue(store, "b", "b")
    assert second.seq > first.seq
    queued, _ = await store.backend.read(lambda tx: store.sends.next_pending(tx, first.seq))
    assert queued is not None and queued.txn_id == "b"


async def test_an_answer_for_an_event_already_retained_settles_the_row(open_store) -> None:
    store = await open_store()
    await enqueue(store, "a", "a")
    await write(store, lambda s: s.ingest_sync([echo("$a")], limited=False, prev_batch="p"))
    assert await store.backend.write(lambda tx: store.sends.mark_sent(tx, "a", "$a")) is None
    assert await store.backend.read(store.sends.counts) == (0, 0)


async def test_failed_rows_retry_or_cancel_and_acknowledged_ones_do_not_cancel(
    open_store,
) -> None:
    store = await open_store()
    for txn in ("a", "b", "c"):
        await enqueue(store, txn, txn)
    failed = await store.backend.write(lambda tx: store.sends.mark_failed(tx, "a", "too big"))
    assert failed is not None and (failed.state, failed.failure) == (SendRow.FAILED, "too big")
    await store.backend.close()
    store = await open_store()
    [row] = [q for q in await store.backend.read(lambda tx: store.sends.of_room(tx, ROOM))][:1]
    assert (row.state, row.failure, row.body) == (SendRow.FAILED, "too big", "a")
    assert await store.backend.read(store.sends.counts) == (2, 1)
    assert await store.backend.write(lambda tx: store.sends.retry(tx, "b")) is None  # not failed
    again = await store.backend.write(lambda tx: store.sends.retry(tx, "a"))
    assert again is not None and (again.state, again.failure) == (SendRow.PENDING, None)
    await store.backend.write(lambda tx: store.sends.mark_sent(tx, "b", "$b"))
    assert await store.backend.write(lambda tx: store.sends.cancel(tx, "b")) is None
    assert await store.backend.write(lambda tx: store.sends.cancel(tx, "c")) is not None
    assert await pending_order(store) == ["a"]


async def test_an_unreadable_row_is_stepped_over_and_reported_once(open_store) -> None:
    store = await open_store()
    for txn in ("a", "b", "c"):
        await enqueue(store, txn, txn)
    # Another row's sealed value in b's place: it fails authentication (bound to its row).
    await store.backend.write(
        lambda tx: tx.execute(
            "UPDATE history_send SET value = (SELECT value FROM history_send WHERE txn_id = ?)"
            " WHERE txn_id = ?",
            ("a", "b"),
        )
    )
    assert await pending_order(store) == ["a", "c"]
    assert await pending_order(store) == ["a", "c"]
    assert [c.txn_id for c in store.sends.corrupt.values()] == ["b"]
    rows = await store.backend.read(lambda tx: store.sends.of_room(tx, ROOM))
    assert [q.txn_id for q in rows] == ["a", "c"]
