"""The PostgreSQL backend: the shared contract plus PostgreSQL-only behaviour."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest

from gapline.storage import (
    BackendUnavailable,
    CorruptStore,
    IntegrityError,
    OperationalError,
    open_backend,
    tune_sqlite_writer,
)
from gapline.storage._postgres import (
    _PostgresWriterSession,
    connect_postgres,
    map_postgres_error,
    rewrite_placeholders,
)
from gapline.storage.devpostgres import PostgresCluster
from tests.storage.contract import BackendContract
from tests.storage.contract_hooks import CommitHooksContract

pytestmark = pytest.mark.postgres


class TestPostgresBackend(BackendContract, CommitHooksContract):
    @pytest.fixture
    def dsn(self, postgres_dsn: str) -> str:
        return postgres_dsn


del BackendContract, CommitHooksContract


CHILD_NOTIFY = """
import asyncio, sys
from gapline.storage import open_backend

async def main(dsn):
    backend = await open_backend(dsn)
    await backend.write(lambda tx: tx.notify("cross", "from another process"))
    await backend.close()

asyncio.run(main(sys.argv[1]))
"""


async def test_notifications_reach_subscribers_in_other_processes(postgres_dsn: str) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        sub = backend.subscribe("cross")
        child = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", CHILD_NOTIFY, postgres_dsn],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == 0, child.stderr
        assert await asyncio.wait_for(anext(sub), 30) == "from another process"
    finally:
        await backend.close()


async def test_collation_of_an_icu_database_differs_from_byte_order(make_postgres_dsn) -> None:
    backend = await open_backend(make_postgres_dsn(icu_locale="en-US"))
    try:
        ordered = await backend.read(
            lambda tx: tx.all("SELECT x FROM (VALUES ('a'), ('B'), ('b'), ('A')) v(x) ORDER BY x")
        )
    finally:
        await backend.close()
    assert [row[0] for row in ordered] == ["a", "A", "b", "B"]  # byte order: A B a b


async def test_tune_sqlite_writer_leaves_postgres_alone(postgres_dsn: str) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        # A PRAGMA is a syntax error on PostgreSQL: reaching it would raise.
        await tune_sqlite_writer(backend, cache_kib=4096, wal_autocheckpoint_pages=2048)
        assert await backend.write(lambda tx: tx.one("SELECT 1")) == (1,)
    finally:
        await backend.close()


async def test_an_unreachable_server_is_backend_unavailable(postgres_cluster) -> None:
    with pytest.raises(BackendUnavailable):
        await open_backend(postgres_cluster.dsn("no_such_database"))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT ? , ?", "SELECT %s , %s"),
        ("SELECT '?' , ?", "SELECT '?' , %s"),
        ("SELECT 'it''s ?' || ?", "SELECT 'it''s ?' || %s"),
        ('SELECT "odd?name" FROM t WHERE a = ?', 'SELECT "odd?name" FROM t WHERE a = %s'),
        (
            "SELECT x FROM t WHERE a LIKE '10%' AND b = ?",
            "SELECT x FROM t WHERE a LIKE '10%%' AND b = %s",
        ),
        ("SELECT 5 % ?", "SELECT 5 %% %s"),
        ("SELECT ? -- what?\n, ?", "SELECT %s -- what?\n, %s"),
        ("SELECT /* ? */ ?", "SELECT /* ? */ %s"),
    ],
)
def test_placeholders_are_rewritten_outside_literals(query: str, expected: str) -> None:
    assert rewrite_placeholders(query) == expected


async def test_percent_and_question_marks_survive_a_round_trip(postgres_dsn: str) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        row = await backend.read(lambda tx: tx.one("SELECT '100%', '?', ? || '%'", ("50",)))
    finally:
        await backend.close()
    assert row == ("100%", "?", "50%")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (psycopg.errors.UniqueViolation("duplicate"), IntegrityError),
        (psycopg.errors.ForeignKeyViolation("fk"), IntegrityError),
        (psycopg.errors.NotNullViolation("nn"), IntegrityError),
        (psycopg.errors.CheckViolation("check"), IntegrityError),
        (psycopg.errors.DataCorrupted("corrupt"), CorruptStore),
        (psycopg.errors.IndexCorrupted("corrupt"), CorruptStore),
        (psycopg.errors.ConnectionFailure("gone"), BackendUnavailable),
        (psycopg.errors.AdminShutdown("shutdown"), BackendUnavailable),
        (psycopg.errors.CannotConnectNow("starting"), BackendUnavailable),
        (psycopg.errors.InvalidCatalogName("no db"), BackendUnavailable),
        (psycopg.errors.InvalidPassword("auth"), BackendUnavailable),
        (psycopg.errors.TooManyConnections("full"), BackendUnavailable),
        (psycopg.OperationalError("connection refused"), BackendUnavailable),
        (psycopg.errors.SyntaxError("syntax"), OperationalError),
        (psycopg.errors.SerializationFailure("retry"), OperationalError),
        (psycopg.errors.DeadlockDetected("deadlock"), OperationalError),
        (psycopg.errors.ReadOnlySqlTransaction("ro"), OperationalError),
        (psycopg.errors.QueryCanceled("cancel"), OperationalError),
        (psycopg.InterfaceError("closed"), OperationalError),
        (psycopg.ProgrammingError("bad"), OperationalError),
        (psycopg.DataError("bad value"), OperationalError),
    ],
)
def test_every_psycopg_error_class_maps_into_the_tree(
    error: psycopg.Error, expected: type[Exception]
) -> None:
    mapped = map_postgres_error(error)
    assert type(mapped) is expected
    assert mapped.__cause__ is error


async def _terminate(dsn: str, application_name: str) -> int:
    def run() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                (application_name,),
            ).fetchall()
        return len(rows)

    return await asyncio.to_thread(run)


async def test_lost_writer_and_reader_connections_are_replaced(postgres_dsn: str) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        await backend.write(lambda tx: tx.execute("CREATE TABLE r (x INTEGER)"))
        assert await backend.read(lambda tx: tx.one("SELECT count(*) FROM r")) == (0,)
        assert await _terminate(postgres_dsn, "gapline-writer") == 1
        assert await _terminate(postgres_dsn, "gapline-reader") >= 1
        # Nothing of the next write had run when the loss was found: it succeeds.
        await backend.write(lambda tx: tx.execute("INSERT INTO r VALUES (1)"))
        assert await backend.read(lambda tx: tx.one("SELECT count(*) FROM r")) == (1,)
        # The same with a parameterised statement (the deferred BEGIN goes ahead of it),
        # and through a pipeline (one_after: BEGIN travels with the statements).
        assert await _terminate(postgres_dsn, "gapline-writer") == 1
        await backend.write(lambda tx: tx.execute("INSERT INTO r VALUES (?)", (2,)))
        assert await _terminate(postgres_dsn, "gapline-writer") == 1
        row = await backend.write(
            lambda tx: tx.one_after(
                [("INSERT INTO r VALUES (?)", (3,))], "SELECT count(*) FROM r WHERE x > ?", (0,)
            )
        )
        assert row == (3,)
    finally:
        await backend.close()


async def test_the_listener_reconnects_and_listens_again(postgres_dsn: str) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        sub = backend.subscribe("again")
        await backend.write(lambda tx: tx.notify("again", "before"))
        assert await asyncio.wait_for(anext(sub), 30) == "before"
        assert await _terminate(postgres_dsn, "gapline-listener") == 1
        # Notifications sent while it reconnects are lost (LISTEN semantics), so
        # publish until one arrives through the new connection.
        received = None
        for attempt in range(300):
            await backend.write(lambda tx, a=attempt: tx.notify("again", f"after {a}"))
            try:
                received = await asyncio.wait_for(anext(sub), 0.1)
                break
            except TimeoutError:
                continue
        assert received is not None and received.startswith("after")
    finally:
        await backend.close()


def _writer_session(
    dsn: str,
) -> tuple[psycopg.Connection[Any], _PostgresWriterSession, list[str]]:
    """A writer session driven by hand, with the server notices it drew."""
    conn = connect_postgres(dsn, autocommit=True, name="gapline-writer")
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    return conn, _PostgresWriterSession(dsn, conn), notices


def test_a_chained_commit_opens_the_next_transaction_in_the_same_round_trip(
    postgres_dsn: str,
) -> None:
    """``commit(chain=True)`` sends ``COMMIT; BEGIN``: the first batch is committed and
    visible, and the next batch runs in the already open transaction (no second BEGIN,
    which PostgreSQL would answer with a "transaction in progress" warning)."""
    conn, session, notices = _writer_session(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as observer:
        observer.execute("CREATE TABLE c (x INTEGER PRIMARY KEY)")
        session.begin(False)
        session.tx.execute("INSERT INTO c VALUES (?)", (1,))
        session.commit(True)
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        assert observer.execute("SELECT count(*) FROM c").fetchone() == (1,)
        # A grouped batch in the chained transaction: its SAVEPOINT needs no BEGIN.
        session.begin(True)
        session.savepoint()
        session.tx.execute("INSERT INTO c VALUES (?)", (2,))
        session.release()
        session.savepoint()
        with pytest.raises(IntegrityError):
            session.tx.execute("INSERT INTO c VALUES (?)", (1,))
        session.rollback_to()
        session.release()
        session.commit(False)
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        assert observer.execute("SELECT x FROM c ORDER BY x").fetchall() == [(1,), (2,)]
        # From idle, a grouped batch sends BEGIN and SAVEPOINT with its first statement.
        session.begin(True)
        session.savepoint()
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        session.tx.execute("INSERT INTO c VALUES (?)", (3,))
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        session.rollback()
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        assert observer.execute("SELECT x FROM c ORDER BY x").fetchall() == [(1,), (2,)]
    session.close()
    assert notices == []


def test_operations_that_send_nothing_open_nothing(postgres_dsn: str) -> None:
    """Deferred BEGIN/SAVEPOINT/RELEASE: an operation that sends no statement costs no
    round trip, and a transaction nobody wrote in is never opened, so its COMMIT is
    not sent either (a stray COMMIT would draw a "no transaction" warning)."""
    conn, session, notices = _writer_session(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as observer:
        observer.execute("CREATE TABLE n (x INTEGER PRIMARY KEY)")
        session.begin(True)
        for _ in range(3):
            session.savepoint()
            session.release()
        session.savepoint()
        session.rollback_to()  # an op that raised before sending anything
        session.release()
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        session.commit(False)
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        # Between sent operations, an empty one leaves the RELEASE order intact.
        session.begin(True)
        session.savepoint()
        session.tx.execute("INSERT INTO n VALUES (?)", (1,))
        session.release()
        session.savepoint()
        session.release()
        session.savepoint()
        with pytest.raises(IntegrityError):
            session.tx.execute("INSERT INTO n VALUES (?)", (1,))
        session.rollback_to()
        session.release()
        session.savepoint()
        session.tx.execute("INSERT INTO n VALUES (?)", (2,))
        session.release()
        session.commit(False)
        assert observer.execute("SELECT x FROM n ORDER BY x").fetchall() == [(1,), (2,)]
    session.close()
    assert notices == []


async def test_a_burst_of_writes_commits_every_write_through_chained_transactions(
    postgres_dsn: str,
) -> None:
    """Many writers at once keep the queue non-empty, so batches chain; a failing
    operation in the middle still rolls back alone and the rest commit."""
    backend = await open_backend(postgres_dsn, max_batch=4)
    try:
        await backend.write(lambda tx: tx.execute("CREATE TABLE b (x INTEGER PRIMARY KEY)"))

        async def insert(x: int) -> int:
            return await backend.write(lambda tx: tx.execute("INSERT INTO b VALUES (?)", (x,)))

        results = await asyncio.gather(
            *(insert(x) for x in [*range(100), 50]), return_exceptions=True
        )
        assert results[:100] == [1] * 100
        assert isinstance(results[100], IntegrityError)
        assert await backend.read(lambda tx: tx.one("SELECT count(*) FROM b")) == (100,)
    finally:
        await backend.close()


async def _wait_for_a_lock_wait(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(600):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'gapline-writer' AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0] >= 1:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the first write never waited on the lock")


async def test_several_writers_commit_batches_independently(postgres_dsn: str) -> None:
    """With ``writers=2`` a write blocked on a row lock holds up only its own writer
    connection: a later write commits meanwhile (with one writer it would wait)."""
    backend = await open_backend(postgres_dsn, writers=2)
    try:
        await backend.write(
            lambda tx: tx.execute("CREATE TABLE w (k INTEGER PRIMARY KEY, v INTEGER)")
        )
        await backend.write(lambda tx: tx.execute("INSERT INTO w VALUES (1, 0)"))
        with psycopg.connect(postgres_dsn) as holder:
            holder.execute("SELECT v FROM w WHERE k = 1 FOR UPDATE")
            blocked = asyncio.create_task(
                backend.write(lambda tx: tx.execute("UPDATE w SET v = 1 WHERE k = 1"))
            )
            await _wait_for_a_lock_wait(postgres_dsn)
            assert await backend.write(lambda tx: tx.execute("INSERT INTO w VALUES (2, 2)")) == 1
            assert not blocked.done()
            holder.rollback()
        assert await blocked == 1
        rows = await backend.read(lambda tx: tx.all("SELECT k, v FROM w ORDER BY k"))
        assert rows == [(1, 1), (2, 2)]
    finally:
        await backend.close()


async def test_several_writers_send_the_deferred_statements_without_a_pipeline(
    postgres_dsn: str,
) -> None:
    """With ``writers=N`` the deferred BEGIN/SAVEPOINT go ahead in a simple query (no
    pipeline); statements, ``one_after`` and a failing op behave exactly the same."""
    backend = await open_backend(postgres_dsn, writers=2)
    try:
        await backend.write(lambda tx: tx.execute("CREATE TABLE s (k INTEGER PRIMARY KEY)"))
        row = await backend.write(
            lambda tx: tx.one_after(
                [("INSERT INTO s VALUES (?)", (1,)), ("INSERT INTO s VALUES (?)", (2,))],
                "SELECT count(*) FROM s WHERE k > ?",
                (0,),
            )
        )
        assert row == (2,)
        results = await asyncio.gather(
            *(
                backend.write(lambda tx, k=k: tx.execute("INSERT INTO s VALUES (?)", (k,)))
                for k in [3, 4, 1, 5]
            ),
            return_exceptions=True,
        )
        assert results[:2] == [1, 1] and results[3] == 1
        assert isinstance(results[2], IntegrityError)
        rows = await backend.read(lambda tx: tx.all("SELECT k FROM s ORDER BY k"))
        assert rows == [(1,), (2,), (3,), (4,), (5,)]
    finally:
        await backend.close()


async def test_several_writers_keep_the_order_of_awaited_writes(postgres_dsn: str) -> None:
    """What still holds with ``writers=4``: each caller's awaited writes commit in its
    order, an op that raises rolls back alone, and close() waits for every queued write."""
    backend = await open_backend(postgres_dsn, writers=4, max_batch=3)
    await backend.write(
        lambda tx: tx.execute(
            "CREATE TABLE o (n BIGINT GENERATED ALWAYS AS IDENTITY, caller INTEGER, i INTEGER,"
            " at_commit BIGINT DEFAULT txid_current(), UNIQUE (caller, i))"
        )
    )

    async def caller(c: int) -> None:
        for i in range(30):
            await backend.write(
                lambda tx, i=i: tx.execute("INSERT INTO o (caller, i) VALUES (?, ?)", (c, i))
            )

    async def failing() -> None:
        with pytest.raises(IntegrityError):
            await backend.write(lambda tx: tx.execute("INSERT INTO o (caller, i) VALUES (0, 0)"))

    await asyncio.gather(*(caller(c) for c in range(8)))
    await asyncio.gather(failing(), *(caller(c) for c in range(8, 12)))
    called: list[int] = []
    all_called = asyncio.Event()

    async def queued_write(i: int) -> int:
        called.append(i)
        if len(called) == 40:
            all_called.set()
        return await backend.write(
            lambda tx: tx.execute("INSERT INTO o (caller, i) VALUES (99, ?)", (i,))
        )

    queued = [asyncio.create_task(queued_write(i)) for i in range(40)]
    await all_called.wait()  # every write was asked for before close() is called
    await backend.close()
    assert [f.result() for f in queued] == [1] * 40
    with psycopg.connect(postgres_dsn) as conn:
        for c in range(12):
            # A later write of one caller began after the earlier one committed, so its
            # transaction id is higher: commit order follows each caller's order.
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT at_commit FROM o WHERE caller = %s ORDER BY i", (c,)
                ).fetchall()
            ]
            assert len(ids) == 30
            assert ids == sorted(ids)
        assert conn.execute("SELECT count(*) FROM o WHERE caller = 99").fetchone() == (40,)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_manual_cluster_stops_and_removes_itself_on_a_stop_signal(
    postgres_cluster: PostgresCluster, signum: signal.Signals
) -> None:
    # `python -m gapline.storage.devpostgres` prints a DSN and keeps the cluster until
    # it is told to stop; a stop signal must not leave a server or its files behind.
    del postgres_cluster  # only for "the local binaries work" (skip/fail like the rest)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gapline.storage.devpostgres"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        dsn = proc.stdout.readline().strip()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        datadir = Path(row[0])
        assert datadir.is_dir()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert not datadir.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2).close()
