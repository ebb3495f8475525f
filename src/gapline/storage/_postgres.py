"""The PostgreSQL backend: same contract as SQLite, for several processes on one database.

Driver: psycopg 3 *sync* connections, each owned by one thread (see
docs/storage.md for the measurement behind the choice). An operation is a
synchronous ``op(tx)``; with a sync connection its statements are plain calls
on the DB thread, exactly as on SQLite, so both backends share the writer
loop in ``_writer.py`` (one writer connection by default, ``writers=N`` for
several; group commit with a SAVEPOINT per operation, futures resolved after
COMMIT returns).

``?`` placeholders are rewritten to ``%s`` once per SQL string (cached), outside
string literals, quoted identifiers and comments; a literal ``%`` is doubled.
A statement without parameters is sent untouched (so a migration may hold
several statements).

``tx.notify`` is ``pg_notify``: PostgreSQL delivers it at COMMIT to every
listening session, in this process or another, and drops it with a rolled-back
savepoint. ``subscribe`` listens on one dedicated connection, owned by a
thread that waits on its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from functools import partial
from typing import Any, LiteralString, TypeVar, cast

import psycopg
from psycopg import sql as pgsql

from gapline.storage._backend import Dialect
from gapline.storage._errors import (
    BackendClosed,
    BackendUnavailable,
    CorruptStore,
    IntegrityError,
    OperationalError,
    StorageError,
)
from gapline.storage._notify import NotificationHub
from gapline.storage._pooled import PooledBackend
from gapline.storage._writer import GroupCommitWriter, ReaderPool

__all__ = ["PostgresBackend", "map_postgres_error", "open_postgres", "rewrite_placeholders"]

T = TypeVar("T")

# SQLSTATE classes and codes that mean "the database is not reachable / usable right now".
_UNAVAILABLE_CLASSES = ("08", "28", "3D", "53")  # connection, auth, no such database, resources
_UNAVAILABLE_CODES = ("57P01", "57P02", "57P03")  # admin/crash shutdown, cannot connect now


def map_postgres_error(exc: BaseException) -> BaseException:
    """The one place psycopg errors become gapline storage errors."""
    if not isinstance(exc, psycopg.Error):
        return exc
    state = exc.sqlstate or ""
    message = str(exc).strip() or type(exc).__name__
    mapped: StorageError
    if isinstance(exc, psycopg.IntegrityError) or state.startswith("23"):
        mapped = IntegrityError(message)
    elif state.startswith("XX"):  # internal error, data_corrupted, index_corrupted
        mapped = CorruptStore(f"PostgreSQL reports damage: {message}")
    elif (
        state[:2] in _UNAVAILABLE_CLASSES
        or state in _UNAVAILABLE_CODES
        or (not state and isinstance(exc, psycopg.OperationalError))
    ):
        mapped = BackendUnavailable(f"PostgreSQL is unavailable: {message}")
    else:
        mapped = OperationalError(message)
    mapped.__cause__ = exc
    return mapped


@functools.lru_cache(maxsize=4096)
def rewrite_placeholders(query: str) -> str:
    """``?`` -> ``%s`` and ``%`` -> ``%%``, outside literals, quoted names and comments."""
    out: list[str] = []
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if ch == "'" or ch == '"':
            end = i + 1
            while end < n:
                if query[end] == ch:
                    if end + 1 < n and query[end + 1] == ch:  # doubled quote
                        end += 2
                        continue
                    break
                end += 1
            out.append(query[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif ch == "-" and query.startswith("--", i):
            end = query.find("\n", i)
            end = n if end < 0 else end
            out.append(query[i:end].replace("%", "%%"))
            i = end
        elif ch == "/" and query.startswith("/*", i):
            end = query.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(query[i:end].replace("%", "%%"))
            i = end
        elif ch == "?":
            out.append("%s")
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _q(query: str) -> LiteralString:
    # psycopg types queries as LiteralString against injection; gapline's SQL is
    # written in code with ? placeholders, and values always travel as parameters.
    return cast("LiteralString", query)


_SAVEPOINT = "SAVEPOINT gapline_op"


class _PostgresTx:
    """What an operation sees on PostgreSQL.

    ``lead`` holds parameterless transaction statements the writer session has
    deferred (``BEGIN``, ``SAVEPOINT``, ``RELEASE``) until the operation sends its
    first statement: ahead of it in one simple query, or, for ``one_after``, in one
    pipeline with it and its prior statements, so that the whole op is one round
    trip. An operation that sends nothing costs nothing.
    """

    __slots__ = ("_aux", "_cur", "_reconnect", "conn", "lead", "pipelined")

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        reconnect: Callable[[], psycopg.Connection[Any]] | None = None,
    ) -> None:
        self._reconnect = reconnect
        self.pipelined = True  # False: one_after runs its statements one by one
        self.lead: list[str] = []
        self.bind(conn)

    def bind(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._cur = conn.cursor()
        self._aux = conn.cursor()  # lead and prior statements, whose results nobody reads

    @property
    def dialect(self) -> Dialect:
        return Dialect.POSTGRES

    def _run(
        self,
        query: str,
        params: Sequence[Any],
        prior: Sequence[tuple[str, Sequence[Any]]] = (),
    ) -> psycopg.Cursor[Any]:
        # Only ``one_after`` pipelines: a pipeline saves a round trip but costs more
        # client CPU than a simple query, which loses where CPU, not latency, bounds
        # the writes (the relay's many small sends; see docs/storage.md).
        pipeline = bool(prior) and bool(params) and self.pipelined
        try:
            if self.lead and not pipeline:
                self.flush_lead()
            if pipeline:
                lead, self.lead = self.lead, []
                self._opening(lead, partial(self._pipeline, lead, query, params, prior))
            else:
                for sql, args in prior:
                    self._aux.execute(_q(rewrite_placeholders(sql)), args)
                if params:
                    self._cur.execute(_q(rewrite_placeholders(query)), params)
                else:
                    self._cur.execute(_q(query))
        except psycopg.Error as exc:
            raise map_postgres_error(exc) from exc
        return self._cur  # a reconnect replaces the cursor

    def _pipeline(
        self,
        lead: list[str],
        query: str,
        params: Sequence[Any],
        prior: Sequence[tuple[str, Sequence[Any]]],
    ) -> None:
        # Each statement still runs alone, in order, with its own snapshot; only the
        # network round trips are shared. The first error is raised when the pipeline
        # syncs at the end of the block, and PostgreSQL skips what follows it.
        with self.conn.pipeline():
            for statement in lead:
                self._aux.execute(_q(statement), prepare=False)
            for sql, args in prior:
                self._aux.execute(_q(rewrite_placeholders(sql)), args)
            self._cur.execute(_q(rewrite_placeholders(query)), params)

    def _opening(self, lead: list[str], send: Callable[[], None]) -> None:
        """``send()``; once more on a new connection if the old one turns out lost and
        ``lead`` opens the transaction (then nothing of it can have committed)."""
        try:
            send()
        except psycopg.OperationalError:
            opens = bool(lead) and lead[0] == "BEGIN"
            if not opens or self._reconnect is None or not (self.conn.closed or self.conn.broken):
                raise
            # Lost while idle (server restart, idle timeout).
            self.bind(self._reconnect())
            send()

    def flush_lead(self) -> None:
        """Send the deferred statements now, on their own."""
        if self.lead:
            lead, self.lead = self.lead, []
            self._opening(lead, partial(self._send_lead, lead))

    def send_commit(self, statement: LiteralString) -> None:
        self._aux.execute(statement, prepare=False)

    def _send_lead(self, lead: list[str]) -> None:
        # On the cursor kept for such statements: Connection.execute makes one each time.
        self._aux.execute(_q("; ".join(lead)), prepare=False)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._run(sql, params).rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self.flush_lead()
            self._cur.executemany(_q(rewrite_placeholders(sql)), list(rows))
        except psycopg.Error as exc:
            raise map_postgres_error(exc) from exc

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        cur = self._run(sql, params)
        try:
            return cur.fetchone()
        except psycopg.Error as exc:
            raise map_postgres_error(exc) from exc

    def one_after(
        self, prior: Sequence[tuple[str, Sequence[Any]]], sql: str, params: Sequence[Any] = ()
    ) -> tuple[Any, ...] | None:
        cur = self._run(sql, params, prior)
        try:
            return cur.fetchone()
        except psycopg.Error as exc:
            raise map_postgres_error(exc) from exc

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._run(sql, params)
        try:
            return cur.fetchall()
        except psycopg.Error as exc:
            raise map_postgres_error(exc) from exc

    def notify(self, channel: str, payload: str) -> None:
        # Delivered by the server at COMMIT; discarded if the savepoint rolls back.
        self._run("SELECT pg_notify(?, ?)", (channel, payload))

    # The server drops notifications of rolled-back savepoints: nothing to track here.
    def notes_mark(self) -> int:
        return 0

    def notes_truncate(self, mark: int) -> None:
        return None

    def take_notes(self) -> list[tuple[str, str]]:
        return []


def _connect(dsn: str, *, autocommit: bool, name: str) -> psycopg.Connection[Any]:
    try:
        # application_name shows each connection's role in pg_stat_activity.
        return psycopg.connect(dsn, autocommit=autocommit, application_name=name)
    except psycopg.Error as exc:
        raise map_postgres_error(exc) from exc


class _PostgresWriterSession:
    """The writer connection in autocommit mode: BEGIN/COMMIT are issued explicitly.

    Round trips dominate PostgreSQL writes, so transaction statements travel
    together wherever the protocol allows:

    - BEGIN, SAVEPOINT and RELEASE are deferred into the tx's ``lead`` until the
      operation sends its first statement: ahead of it in one simple query
      (``RELEASE ...; SAVEPOINT ...``), or, when it comes through
      ``tx.one_after``, in one pipeline with it. An operation that sends nothing
      costs nothing, a transaction nobody wrote in is never opened, and COMMIT
      needs no RELEASE before it;
    - when the writer already has the next batch queued, COMMIT is sent as
      ``COMMIT; BEGIN`` and that batch starts inside the open transaction
      (PostgreSQL runs the BEGIN only once the COMMIT succeeded and was flushed;
      a bare BEGIN takes no snapshot and no lock, so it holds nothing back).

    So beyond its own statements, an operation costs one round trip (none
    through ``one_after``) and a transaction one more (its COMMIT).
    """

    def __init__(self, dsn: str, conn: psycopg.Connection[Any], *, pipelined: bool = True) -> None:
        self._dsn = dsn
        self.tx = _PostgresTx(conn, self._reconnected)
        self.tx.pipelined = pipelined
        self._chained = False  # a chained BEGIN opened the transaction already

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        return self.tx.conn

    def _reconnected(self) -> psycopg.Connection[Any]:
        with contextlib.suppress(Exception):
            self._conn.close()
        self._chained = False
        return _connect(self._dsn, autocommit=True, name="gapline-writer")

    def begin(self, grouped: bool) -> None:
        chained, self._chained = self._chained, False
        conn = self._conn
        if (
            chained
            and not (conn.closed or conn.broken)
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        ):
            self.tx.lead = []
            return
        self.tx.lead = ["BEGIN"]

    def savepoint(self) -> None:
        self.tx.lead.append(_SAVEPOINT)

    def release(self) -> None:
        lead = self.tx.lead
        if lead and lead[-1] == _SAVEPOINT:
            lead.pop()  # the operation sent nothing: its savepoint was never opened
        else:
            lead.append("RELEASE SAVEPOINT gapline_op")

    def rollback_to(self) -> None:
        lead = self.tx.lead
        if lead and lead[-1] == _SAVEPOINT:
            lead.pop()  # never sent, so nothing to undo
            return
        self.tx.lead = []
        self._conn.execute(
            _q("; ".join([*lead, "ROLLBACK TO SAVEPOINT gapline_op"])), prepare=False
        )

    def commit(self, chain: bool) -> None:
        lead, self.tx.lead = self.tx.lead, []
        self._chained = False
        if "BEGIN" in lead:
            return  # no statement was sent: the transaction was never opened
        # A deferred RELEASE is implied by COMMIT.
        self.tx.send_commit("COMMIT; BEGIN" if chain else "COMMIT")
        self._chained = chain

    def rollback(self) -> None:
        self.tx.lead = []
        self._chained = False
        if not self._conn.closed and (
            self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        ):
            self._conn.execute("ROLLBACK", prepare=False)

    def ensure_open(self) -> None:
        if self._conn.closed or self._conn.broken:
            self.tx.bind(self._reconnected())

    def map_error(self, exc: BaseException) -> BaseException:
        return map_postgres_error(exc)

    def close(self) -> None:
        self._conn.close()


class _PostgresReaderSession:
    """A REPEATABLE READ, READ ONLY transaction per read: one consistent snapshot."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn = self._open()

    def _open(self) -> psycopg.Connection[Any]:
        conn = _connect(self._dsn, autocommit=False, name="gapline-reader")
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        self._tx = _PostgresTx(conn)
        return conn

    def run(self, op: Callable[[Any], T]) -> T:
        if self._conn.closed or self._conn.broken:
            self._conn = self._open()
        try:
            return self._run_once(op)
        except BackendUnavailable:
            if not (self._conn.closed or self._conn.broken):
                raise
            # The connection was lost while idle in the pool. A read has no
            # effect on the database, so running it again on a new one is safe.
            self._conn = self._open()
            return self._run_once(op)

    def _run_once(self, op: Callable[[Any], T]) -> T:
        try:
            return op(self._tx)
        finally:
            with contextlib.suppress(psycopg.Error):
                self._conn.rollback()

    def close(self) -> None:
        self._conn.close()


class _Listener:
    """One LISTEN connection on its own thread, feeding the in-process hub.

    The thread waits on the connection's socket and a wake pipe, so a new
    ``LISTEN`` is sent at once and a notification is read as soon as it lands.
    If the connection is lost, the thread reconnects (with backoff) and listens
    again on every channel; notifications sent while it was away are lost, as
    with any LISTEN client, so subscribers treat a payload as a hint to re-read.
    """

    def __init__(self, dsn: str, hub: NotificationHub) -> None:
        self._dsn = dsn
        self._hub = hub
        self._conn: psycopg.Connection[Any] | None = self._connect()
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, threading.Event, list[BaseException]]] = []
        self._channels: set[str] = set()
        self._stop = False
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name="gapline-pg-listener", daemon=True)
        self._thread.start()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = _connect(self._dsn, autocommit=True, name="gapline-listener")
        hub = self._hub
        # Notifications that arrive while a LISTEN statement runs come this way.
        conn.add_notify_handler(lambda n: hub.publish([(n.channel, n.payload)]))
        return conn

    def listen(self, channel: str, timeout: float = 10.0) -> None:
        """Block until the server acknowledged ``LISTEN channel`` (a local round trip)."""
        with self._lock:
            if channel in self._channels:
                return
            done = threading.Event()
            errors: list[BaseException] = []
            self._pending.append((channel, done, errors))
        os.write(self._wake_w, b"x")
        if not done.wait(timeout):
            raise BackendUnavailable(f"LISTEN {channel!r} was not acknowledged in {timeout} s")
        if errors:
            raise errors[0]

    def _run(self) -> None:
        backoff = 0.05
        try:
            while not self._stop:
                try:
                    if self._conn is None:
                        self._conn = self._connect()
                        with self._lock:
                            channels = sorted(self._channels)
                        for channel in channels:
                            self._listen_now(self._conn, channel)
                        self.reconnects += 1
                    backoff = 0.05
                    self._pump(self._conn)
                except Exception as exc:  # noqa: BLE001 - connection lost: report, retry
                    self._fail_pending(map_postgres_error(exc))
                    if self._conn is not None:
                        with contextlib.suppress(Exception):
                            self._conn.close()
                        self._conn = None
                    select.select([self._wake_r], [], [], backoff)  # woken early by close()
                    backoff = min(backoff * 2, 2.0)
        finally:
            self._fail_pending(BackendClosed("the backend is closed"))
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()

    def _pump(self, conn: psycopg.Connection[Any]) -> None:
        pgconn = conn.pgconn
        sock = pgconn.socket
        while not self._stop:
            readable, _, _ = select.select([sock, self._wake_r], [], [])
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)
                self._serve_pending(conn)
            if sock in readable and not self._stop:
                pgconn.consume_input()  # raises when the server closed the connection
                notes: list[tuple[str, str]] = []
                while (n := pgconn.notifies()) is not None:
                    notes.append((n.relname.decode(), n.extra.decode()))
                if notes:
                    self._hub.publish(notes)
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the LISTEN connection was closed")

    @staticmethod
    def _listen_now(conn: psycopg.Connection[Any], channel: str) -> None:
        conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))

    def _serve_pending(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for i, (channel, done, errors) in enumerate(pending):
            try:
                self._listen_now(conn, channel)
            except psycopg.Error as exc:
                if conn.closed or conn.broken:
                    with self._lock:  # served again once reconnected
                        self._pending[:0] = pending[i:]
                    raise
                errors.append(map_postgres_error(exc))
            else:
                with self._lock:
                    self._channels.add(channel)
            done.set()

    def _fail_pending(self, error: BaseException) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for _channel, done, errors in pending:
            errors.append(error)
            done.set()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class PostgresBackend(PooledBackend):
    """A :class:`gapline.storage.Backend` on a PostgreSQL database. Open with :func:`open_postgres`."""

    def __init__(
        self,
        dsn: str,
        writer_conns: Sequence[psycopg.Connection[Any]],
        *,
        group_commit: bool,
        max_batch: int,
        readers: int,
    ) -> None:
        self.dsn = dsn
        super().__init__(
            NotificationHub(),
            GroupCommitWriter(
                # Several writer threads are bound by client CPU (the GIL), not by
                # round trips, and a pipeline costs more CPU than the simple queries it
                # replaces (bench/storage.py, docs/storage.md): only one writer pipelines.
                [
                    _PostgresWriterSession(dsn, conn, pipelined=len(writer_conns) == 1)
                    for conn in writer_conns
                ],
                None,  # notifications come back through LISTEN, from every process alike
                max_batch=max_batch,
                group_commit=group_commit,
                name="gapline-pg-writer",
            ),
            ReaderPool(lambda: _PostgresReaderSession(dsn), readers, "gapline-pg-reader"),
        )
        self._listener: _Listener | None = None
        self._listener_lock = threading.Lock()

    @property
    def dialect(self) -> Dialect:
        return Dialect.POSTGRES

    def subscribe(self, channel: str) -> AsyncIterator[str]:
        """Payloads NOTIFY'd on ``channel`` by any process after this call returns.

        The first subscription to a channel waits for the server to acknowledge
        ``LISTEN`` (one local round trip), so nothing committed after the call
        can be missed; this is why it briefly blocks.
        """
        self._check_open()
        sub = self._hub.subscribe(channel)
        with self._listener_lock:
            if self._listener is None:
                self._listener = _Listener(self.dsn, self._hub)
            listener = self._listener
        listener.listen(channel)
        return sub

    async def _close_more(self) -> None:
        if self._listener is not None:
            await asyncio.to_thread(self._listener.close)


async def open_postgres(
    dsn: str,
    *,
    group_commit: bool = True,
    max_batch: int = 64,
    readers: int = 4,
    writers: int = 1,
) -> PostgresBackend:
    """Connect to the PostgreSQL database at ``dsn`` (a ``postgresql://`` URL).

    ``writers``: writer connections, each running its own group-committed
    batches. More than one lets batches overlap (their round trips and fsyncs),
    at the price of ordering: writes awaited in sequence still commit in order,
    writes submitted together without awaiting may commit in any order, and
    concurrent batches can meet as concurrent transactions do (row locks,
    deadlock errors), exactly as writers in separate processes already do.
    """
    if writers < 1:
        raise ValueError("writers must be >= 1")
    conns: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(writers):
            conns.append(
                await asyncio.to_thread(_connect, dsn, autocommit=True, name="gapline-writer")
            )
    except BaseException:
        for conn in conns:
            conn.close()
        raise
    return PostgresBackend(
        dsn, conns, group_commit=group_commit, max_batch=max_batch, readers=readers
    )
