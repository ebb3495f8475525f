"""The behavioural contract of :class:`gapline.storage.Backend`, run on every implementation.

``BackendContract`` is not collected by itself (its name does not start with
``Test``); each backend's test module subclasses it with a ``dsn`` fixture and
then deletes the name so it is not collected twice.

Ordering inside the writer is made deterministic without timing: a *gate*
operation blocks the writer thread on a ``threading.Event`` while the test
queues more writes, so the queued writes are known to share the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar, cast

import pytest

from gapline.storage import (
    Backend,
    BackendClosed,
    IntegrityError,
    Migration,
    MigrationError,
    OperationalError,
    Tx,
    open_backend,
)

ITEMS = [
    Migration(
        1,
        "items",
        sqlite="""
        CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL UNIQUE, v INTEGER NOT NULL);
        CREATE TABLE pairs (id INTEGER PRIMARY KEY AUTOINCREMENT, side TEXT NOT NULL, n INTEGER NOT NULL);
        """,
        postgres="""
        CREATE TABLE items (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, k TEXT NOT NULL UNIQUE, v INTEGER NOT NULL);
        CREATE TABLE pairs (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, side TEXT NOT NULL, n INTEGER NOT NULL);
        """,
    )
]


def insert(k: str, v: int = 0) -> Callable[[Tx], int]:
    def op(tx: Tx) -> int:
        return tx.execute("INSERT INTO items (k, v) VALUES (?, ?)", (k, v))

    return op


def keys(tx: Tx) -> list[str]:
    return [row[0] for row in tx.all("SELECT k FROM items ORDER BY id LIMIT 10000")]


class Boom(Exception):
    """An operation's own failure."""


T = TypeVar("T")


class Gate:
    """A write that holds the writer thread until released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def op(self, tx: Tx) -> None:
        self.started.set()
        if not self.release.wait(30):
            raise AssertionError("gate never released")

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, 30)


async def queued_together(db: Backend, *writes: Coroutine[Any, Any, T]) -> list[asyncio.Task[T]]:
    """Start ``writes`` while a gate holds the writer, so they reach it queued together
    (one group commit), then let it go: their tasks, in the order given."""
    gate = Gate()
    held = asyncio.create_task(db.write(gate.op))
    await gate.wait_started()
    tasks = [asyncio.create_task(w) for w in writes]
    await asyncio.sleep(0)
    gate.release.set()
    await held
    return tasks


async def held_write_and_one_queued(
    dsn: str, key: str
) -> tuple[Backend, Gate, asyncio.Task[None], asyncio.Task[int]]:
    """A fresh backend whose writer a gate holds, with one insert of ``key`` queued
    behind it: for the tests of what close does to writes still in flight."""
    backend = await open_backend(dsn)
    await backend.migrate("contract", ITEMS)
    gate = Gate()
    held = asyncio.create_task(backend.write(gate.op))
    await gate.wait_started()
    pending = asyncio.create_task(backend.write(insert(key)))
    await asyncio.sleep(0)
    return backend, gate, held, pending


CHILD_WRITE_THEN_WAIT = """
import asyncio, sys, time
from gapline.storage import open_backend

async def main(dsn):
    backend = await open_backend(dsn)
    await backend.write(lambda tx: tx.execute("INSERT INTO items (k, v) VALUES (?, ?)", ("durable", 1)))
    print("resolved", flush=True)
    time.sleep(60)  # the parent SIGKILLs us here: no close(), no clean shutdown

asyncio.run(main(sys.argv[1]))
"""

CHILD_MIGRATE = """
import asyncio, sys
from gapline.storage import Migration, open_backend

MIGRATIONS = [
    Migration(v, f"step {v}", f"CREATE TABLE race_{v} (x INTEGER); INSERT INTO race_{v} VALUES ({v})")
    for v in range(1, 6)
]

async def main(dsn):
    backend = await open_backend(dsn)
    await backend.migrate("race", MIGRATIONS)
    await backend.close()
    print("migrated", flush=True)

asyncio.run(main(sys.argv[1]))
"""


def kill_when_resolved(dsn: str) -> tuple[str, int, str]:
    """Run CHILD_WRITE_THEN_WAIT; SIGKILL it the moment it reports its write resolved.

    Plain ``subprocess`` on a thread: asyncio's child watcher occasionally
    reports 255 for a SIGKILLed child on Python 3.11, which would hide the signal.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_WRITE_THEN_WAIT, dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        child.send_signal(signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        _out, err = child.communicate(timeout=60)
    return line, child.returncode, err


def run_together(code: str, dsn: str, count: int) -> list[tuple[int, str, str]]:
    """Start ``count`` copies of a child script at once; wait for all."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    outputs = [child.communicate(timeout=120) for child in children]
    return [(c.returncode, out, err) for c, (out, err) in zip(children, outputs, strict=True)]


class BackendContract:
    """Subclasses provide a ``dsn`` fixture naming a fresh, empty database."""

    @pytest.fixture
    async def db(self, dsn: str) -> AsyncIterator[Backend]:
        backend = await open_backend(dsn)
        await backend.migrate("contract", ITEMS)
        try:
            yield backend
        finally:
            await backend.close()

    # -- one write -----------------------------------------------------------

    async def test_write_returns_the_operation_result(self, db: Backend) -> None:
        assert await db.write(insert("a", 1)) == 1
        assert await db.read(lambda tx: tx.one("SELECT k, v FROM items")) == ("a", 1)

    async def test_a_write_is_atomic(self, db: Backend) -> None:
        def two_then_fail(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('x', 1)")
            tx.execute("INSERT INTO items (k, v) VALUES ('y', 2)")
            raise Boom("after two inserts")

        with pytest.raises(Boom):
            await db.write(two_then_fail)
        assert await db.read(keys) == []

    async def test_constraint_violation_is_integrity_error(self, db: Backend) -> None:
        await db.write(insert("dup"))
        with pytest.raises(IntegrityError):
            await db.write(insert("dup"))
        assert await db.read(keys) == ["dup"]

    async def test_one_after_runs_the_prior_statements_in_order_first(self, db: Backend) -> None:
        row = await db.write(
            lambda tx: tx.one_after(
                [
                    ("INSERT INTO items (k, v) VALUES (?, ?)", ("p1", 1)),
                    ("UPDATE items SET v = v + ? WHERE k = ?", (10, "p1")),
                ],
                "SELECT k, v FROM items WHERE k = ?",
                ("p1",),
            )
        )
        assert row == ("p1", 11)

    async def test_a_failing_prior_statement_raises_and_its_op_rolls_back(
        self, db: Backend
    ) -> None:
        await db.write(insert("taken"))

        def op(tx: Tx) -> tuple[Any, ...] | None:
            tx.execute("INSERT INTO items (k, v) VALUES (?, ?)", ("before", 0))
            return tx.one_after(
                [("INSERT INTO items (k, v) VALUES (?, ?)", ("taken", 2))],
                "SELECT count(*) FROM items WHERE k <> ?",
                ("",),
            )

        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()
        # One group: the failure rolls back only its own op, and the next one commits.
        failing = asyncio.create_task(db.write(op))
        after = asyncio.create_task(db.write(insert("after")))
        await asyncio.sleep(0)
        gate.release.set()
        await held
        with pytest.raises(IntegrityError):
            await failing
        assert await after == 1
        assert await db.read(keys) == ["taken", "after"]
        # Alone in its transaction, the same.
        with pytest.raises(IntegrityError):
            await db.write(op)
        assert await db.read(keys) == ["taken", "after"]

    # -- group commit --------------------------------------------------------

    async def test_a_failing_op_rolls_back_alone_within_its_group(self, db: Backend) -> None:
        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()

        def half_then_fail(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('half', 0)")
            raise Boom("rolled back alone")

        # Queued while the writer is held: they run as one group after it.
        futures: list[asyncio.Future[Any]] = [
            asyncio.create_task(db.write(insert(f"k{i}", i))) for i in range(5)
        ]
        futures.insert(2, asyncio.create_task(db.write(half_then_fail)))
        futures.append(asyncio.create_task(db.write(insert("k0"))))  # duplicate key
        await asyncio.sleep(0)  # let every write reach the queue
        gate.release.set()
        await held
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert isinstance(results[2], Boom)
        assert isinstance(results[-1], IntegrityError)
        assert [r for i, r in enumerate(results) if i not in (2, len(results) - 1)] == [1] * 5
        assert await db.read(keys) == [f"k{i}" for i in range(5)]

    async def test_notifications_of_a_rolled_back_op_are_not_published(self, db: Backend) -> None:
        sub = db.subscribe("contract-events")

        def notify_then_fail(tx: Tx) -> None:
            tx.notify("contract-events", "never")
            raise Boom

        def notify(tx: Tx) -> None:
            tx.notify("contract-events", "kept")

        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()
        failing = asyncio.create_task(db.write(notify_then_fail))
        kept = asyncio.create_task(db.write(notify))
        await asyncio.sleep(0)
        gate.release.set()
        await held
        with pytest.raises(Boom):
            await failing
        await kept
        await db.write(notify)
        assert await anext(sub) == "kept"
        assert await anext(sub) == "kept"

    # -- batched writes ------------------------------------------------------

    async def test_batched_items_queued_together_reach_one_call(self, db: Backend) -> None:
        calls: list[list[str]] = []

        def insert_many(tx: Tx, items: list[str]) -> list[int]:
            calls.append(list(items))
            values = ", ".join(["(?, 0)"] * len(items))
            rows = tx.all(f"INSERT INTO items (k, v) VALUES {values} RETURNING id", items)
            return [int(row[0]) for row in rows]

        futures = await queued_together(
            db, *(db.write_batched(insert_many, f"b{i}") for i in range(8))
        )
        ids = await asyncio.gather(*futures)
        assert calls == [[f"b{i}" for i in range(8)]]  # one call, in queue order
        assert ids == sorted(ids) and len(set(ids)) == 8  # each caller its own outcome
        assert await db.read(keys) == [f"b{i}" for i in range(8)]
        # Alone in the queue, an item is a batch of one.
        await db.write_batched(insert_many, "alone")
        assert calls[-1] == ["alone"]

    async def test_an_exception_outcome_reaches_only_its_caller(self, db: Backend) -> None:
        def insert_some(tx: Tx, items: list[str]) -> list[int | BaseException]:
            out: list[int | BaseException] = []
            for k in items:
                if k.startswith("bad"):
                    out.append(Boom(k))  # this item writes nothing
                else:
                    out.append(tx.execute("INSERT INTO items (k, v) VALUES (?, 0)", (k,)))
            return out

        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()
        names = ["ok1", "bad1", "ok2", "bad2", "ok3"]
        futures = [asyncio.create_task(db.write_batched(insert_some, k)) for k in names]
        await asyncio.sleep(0)
        gate.release.set()
        await held
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["int", "Boom", "int", "Boom", "int"]
        assert str(results[1]) == "bad1" and str(results[3]) == "bad2"
        assert await db.read(keys) == ["ok1", "ok2", "ok3"]

    async def test_a_raising_batch_is_rolled_back_and_rerun_item_by_item(self, db: Backend) -> None:
        calls: list[list[str]] = []
        sub = db.subscribe("batch-events")

        def insert_all(tx: Tx, items: list[str]) -> list[int]:
            calls.append(list(items))
            out = []
            for k in items:
                tx.notify("batch-events", k)
                out.append(tx.execute("INSERT INTO items (k, v) VALUES (?, 0)", (k,)))
                if k == "poison":
                    raise Boom("the whole call fails")
            return out

        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()
        names = ["a", "b", "poison", "c"]
        futures = [asyncio.create_task(db.write_batched(insert_all, k)) for k in names]
        await asyncio.sleep(0)
        gate.release.set()
        await held
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert results[:2] == [1, 1] and results[3] == 1
        assert isinstance(results[2], Boom)
        assert calls == [names, ["a"], ["b"], ["poison"], ["c"]]
        assert await db.read(keys) == ["a", "b", "c"]
        # The failed call's notifications were dropped with it: each kept item once.
        assert [await anext(sub) for _ in range(3)] == ["a", "b", "c"]
        await db.write(lambda tx: tx.notify("batch-events", "end"))
        assert await anext(sub) == "end"

    async def test_plain_writes_between_batched_items_keep_queue_order(self, db: Backend) -> None:
        calls: list[list[str]] = []

        def insert_many(tx: Tx, items: list[str]) -> list[int]:
            calls.append(list(items))
            return [tx.execute("INSERT INTO items (k, v) VALUES (?, 0)", (k,)) for k in items]

        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()
        futures = [
            asyncio.create_task(db.write_batched(insert_many, "1")),
            asyncio.create_task(db.write_batched(insert_many, "2")),
            asyncio.create_task(db.write(insert("plain"))),
            asyncio.create_task(db.write_batched(insert_many, "3")),
        ]
        await asyncio.sleep(0)
        gate.release.set()
        await held
        await asyncio.gather(*futures)
        assert calls == [["1", "2"], ["3"]]
        assert await db.read(keys) == ["1", "2", "plain", "3"]

    async def test_a_batch_function_must_answer_every_item(self, db: Backend) -> None:
        with pytest.raises(TypeError, match="one outcome per item"):
            await db.write_batched(lambda tx, items: [], "x")

    # -- ordering ------------------------------------------------------------

    async def test_writes_of_one_caller_commit_in_order(self, db: Backend) -> None:
        for i in range(30):
            await db.write(insert(f"seq{i:02d}", i))
        # Writes submitted without awaiting in between keep submission order too.
        await asyncio.gather(*(db.write(insert(f"par{i:02d}", i)) for i in range(30)))
        expected = [f"seq{i:02d}" for i in range(30)] + [f"par{i:02d}" for i in range(30)]
        assert await db.read(keys) == expected

    # -- durability ----------------------------------------------------------

    @pytest.mark.slow
    async def test_write_survives_sigkill_right_after_it_resolved(
        self, db: Backend, dsn: str
    ) -> None:
        line, returncode, err = await asyncio.to_thread(kill_when_resolved, dsn)
        assert line.strip() == "resolved", err
        assert returncode == -signal.SIGKILL, (returncode, err)
        reopened = await open_backend(dsn)
        try:
            assert await reopened.read(lambda tx: tx.one("SELECT k, v FROM items")) == (
                "durable",
                1,
            )
        finally:
            await reopened.close()

    # -- readers -------------------------------------------------------------

    async def test_reads_do_not_wait_for_a_write_in_progress(self, db: Backend) -> None:
        await db.write(insert("before"))
        entered, release = threading.Event(), threading.Event()

        def slow_write(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('during', 0)")
            entered.set()
            assert release.wait(30)

        writing = asyncio.create_task(db.write(slow_write))
        assert await asyncio.to_thread(entered.wait, 30)
        # The write holds its transaction open: a read still completes, and sees
        # only what was committed. (A read that blocked would hang here.)
        seen = await asyncio.wait_for(db.read(keys), 30)
        release.set()
        await writing
        assert seen == ["before"]
        assert await db.read(keys) == ["before", "during"]

    async def test_reads_see_consistent_snapshots_during_writes(self, db: Backend) -> None:
        def pair(n: int) -> Callable[[Tx], None]:
            def op(tx: Tx) -> None:
                tx.execute("INSERT INTO pairs (side, n) VALUES ('left', ?)", (n,))
                tx.execute("INSERT INTO pairs (side, n) VALUES ('right', ?)", (n,))

            return op

        def snapshot(tx: Tx) -> tuple[int, int]:
            # Two statements: equal counts only if both see the same snapshot.
            left = tx.one("SELECT count(*) FROM pairs WHERE side = 'left'")
            right = tx.one("SELECT count(*) FROM pairs WHERE side = 'right'")
            assert left is not None and right is not None
            return int(left[0]), int(right[0])

        stop = False

        async def writer() -> None:
            for n in range(150):
                await db.write(pair(n))

        async def reader() -> list[tuple[int, int]]:
            seen = []
            while not stop:
                seen.append(await db.read(snapshot))
            return seen

        readers = [asyncio.create_task(reader()) for _ in range(3)]
        await asyncio.gather(*(writer() for _ in range(2)))
        stop = True
        observations = [obs for r in await asyncio.gather(*readers) for obs in r]
        assert observations
        assert all(left == right for left, right in observations)
        assert await db.read(snapshot) == (300, 300)

    # -- migrations ----------------------------------------------------------

    async def test_migrations_apply_once_in_order(self, db: Backend) -> None:
        log = [
            Migration(2, "second", "INSERT INTO steps (n) VALUES (2)"),
            Migration(
                1, "first", "CREATE TABLE steps (n INTEGER); INSERT INTO steps (n) VALUES (1)"
            ),
        ]
        await db.migrate("steps", log)
        await db.migrate("steps", log)
        assert await db.read(lambda tx: tx.all("SELECT n FROM steps ORDER BY n")) == [(1,), (2,)]
        log.append(Migration(3, "third", "INSERT INTO steps (n) VALUES (3)"))
        await db.migrate("steps", log)
        assert await db.read(lambda tx: tx.all("SELECT n FROM steps ORDER BY n")) == [
            (1,),
            (2,),
            (3,),
        ]
        rows = await db.read(
            lambda tx: tx.all(
                "SELECT version, name FROM gapline_schema_migrations WHERE schema = ? ORDER BY version",
                ("steps",),
            )
        )
        assert rows == [(1, "first"), (2, "second"), (3, "third")]

    async def test_a_database_newer_than_the_code_is_refused(self, db: Backend) -> None:
        await db.migrate(
            "ver",
            [
                Migration(1, "a", "CREATE TABLE ver_a (x INTEGER)"),
                Migration(2, "b", "CREATE TABLE ver_b (x INTEGER)"),
            ],
        )
        with pytest.raises(MigrationError, match="newer"):
            await db.migrate("ver", [Migration(1, "a", "CREATE TABLE ver_a (x INTEGER)")])

    async def test_a_failing_migration_applies_nothing(self, db: Backend) -> None:
        bad = [
            Migration(1, "ok", "CREATE TABLE half (x INTEGER)"),
            Migration(2, "broken", "CREATE TABLE half2 (x INTEGER); THIS IS NOT SQL"),
        ]
        with pytest.raises(MigrationError, match="broken"):
            await db.migrate("bad", bad)
        applied = await db.read(
            lambda tx: tx.all("SELECT version FROM gapline_schema_migrations WHERE schema = 'bad'")
        )
        assert applied == []
        await db.migrate("bad", bad[:1])  # the table was rolled back with it: creating works

    @pytest.mark.slow
    async def test_two_processes_migrating_at_once(self, db: Backend, dsn: str) -> None:
        results = await asyncio.to_thread(run_together, CHILD_MIGRATE, dsn, 2)
        for returncode, out, err in results:
            assert returncode == 0, err
            assert out.strip() == "migrated"
        versions = await db.read(
            lambda tx: tx.all(
                "SELECT version FROM gapline_schema_migrations WHERE schema = 'race' ORDER BY version"
            )
        )
        assert versions == [(v,) for v in range(1, 6)]
        for v in range(1, 6):
            assert await db.read(lambda tx, v=v: tx.all(f"SELECT x FROM race_{v}")) == [(v,)]

    # -- cancellation --------------------------------------------------------

    async def test_a_caller_cancelled_before_its_batch_is_skipped(self, db: Backend) -> None:
        ran = threading.Event()

        def op(tx: Tx) -> None:
            ran.set()
            tx.execute("INSERT INTO items (k, v) VALUES ('skipped', 0)")

        gate = Gate()
        held = asyncio.create_task(db.write(gate.op))
        await gate.wait_started()
        victim = asyncio.create_task(db.write(op))
        await asyncio.sleep(0)
        victim.cancel()
        gate.release.set()
        await held
        await db.write(insert("after"))
        assert victim.cancelled()
        assert not ran.is_set()
        assert await db.read(keys) == ["after"]

    async def test_a_caller_cancelled_mid_operation_leaves_it_whole(self, db: Backend) -> None:
        entered, release = threading.Event(), threading.Event()

        def two_rows(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('first', 1)")
            entered.set()
            assert release.wait(30)
            tx.execute("INSERT INTO items (k, v) VALUES ('second', 2)")

        caller = asyncio.create_task(db.write(two_rows))
        assert await asyncio.to_thread(entered.wait, 30)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        release.set()
        await db.write(insert("after"))  # queued behind it: resolves once it committed
        assert await db.read(keys) == ["first", "second", "after"]

    # -- close ---------------------------------------------------------------

    async def test_close_waits_for_queued_and_in_flight_writes(self, dsn: str) -> None:
        backend = await open_backend(dsn)
        await backend.migrate("contract", ITEMS)
        gate = Gate()
        held = asyncio.create_task(backend.write(gate.op))
        await gate.wait_started()
        pending = [asyncio.create_task(backend.write(insert(f"c{i}", i))) for i in range(20)]
        await asyncio.sleep(0)
        closing = asyncio.create_task(backend.close())
        await asyncio.sleep(0)
        with pytest.raises(BackendClosed):
            await backend.write(insert("late"))
        gate.release.set()
        await closing
        await held
        assert [p.result() for p in pending] == [1] * 20
        with pytest.raises(BackendClosed):
            await backend.read(keys)
        reopened = await open_backend(dsn)
        try:
            assert await reopened.read(keys) == [f"c{i}" for i in range(20)]
        finally:
            await reopened.close()

    # -- notifications -------------------------------------------------------

    async def test_subscribers_receive_committed_notifications_in_order(self, db: Backend) -> None:
        first, second = db.subscribe("contract-chan"), db.subscribe("contract-chan")
        other = db.subscribe("contract-other")

        def publish(payload: str) -> Callable[[Tx], None]:
            def op(tx: Tx) -> None:
                tx.execute("INSERT INTO items (k, v) VALUES (?, 0)", (payload,))
                tx.notify("contract-chan", payload)

            return op

        for i in range(3):
            await db.write(publish(f"p{i}"))
        await db.write(lambda tx: tx.notify("contract-other", "elsewhere"))
        for sub in (first, second):
            assert [await anext(sub) for _ in range(3)] == ["p0", "p1", "p2"]
        assert await anext(other) == "elsewhere"

    async def test_subscriptions_end_when_the_backend_closes(self, dsn: str) -> None:
        backend = await open_backend(dsn)
        sub = backend.subscribe("contract-end")
        await backend.close()
        collected = [payload async for payload in sub]
        assert collected == []

    async def test_read_only_connection_refuses_writes(self, db: Backend) -> None:
        with pytest.raises(OperationalError):
            await db.read(insert("sneaky"))
        assert await db.read(keys) == []

    async def test_concurrent_closes_all_wait_for_the_writes(self, dsn: str) -> None:
        backend, gate, held, pending = await held_write_and_one_queued(dsn, "last")
        closes = [asyncio.create_task(backend.close()) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(c.done() for c in closes)
        gate.release.set()
        await asyncio.gather(*closes)
        # Every close returned only after the queued write had committed.
        assert held.done() and pending.done() and pending.result() == 1

    async def test_a_cancelled_close_does_not_stop_another_callers_close(self, dsn: str) -> None:
        backend, gate, held, pending = await held_write_and_one_queued(dsn, "kept")
        impatient = asyncio.create_task(backend.close())
        patient = asyncio.create_task(backend.close())
        await asyncio.sleep(0)
        impatient.cancel()
        with pytest.raises(asyncio.CancelledError):
            await impatient
        assert not patient.done()
        gate.release.set()
        await patient
        assert held.done() and pending.result() == 1
        with pytest.raises(BackendClosed):
            await backend.read(keys)

    async def test_an_async_operation_is_refused_clearly(self, db: Backend) -> None:
        async def wrong(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('never', 0)")

        # Typed as returning a coroutine, which is exactly the mistake refused here.
        mistaken = cast("Callable[[Tx], None]", wrong)
        with pytest.raises(TypeError, match="not an async def"):
            await db.write(mistaken)
        with pytest.raises(TypeError, match="not an async def"):
            await db.read(mistaken)
        assert await db.read(keys) == []
