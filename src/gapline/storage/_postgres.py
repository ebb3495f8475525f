"""The PostgreSQL backend: same contract as SQLite, for several processes on one database.

Driver: psycopg 3 *sync* connections, each owned by one thread (see
docs/storage.md for the measurement behind the choice). An operation is a
synchronous ``op(tx)``; with a sync connection its statements are plain calls
on the DB thread, exactly as on SQLite, so both backends share the writer
loop in ``_writer.py`` (one writer connection by default, ``writers=N`` for
several; group commit with a SAVEPOINT per operation, futures resolved after
COMMIT returns).

Transactions, placeholder rewriting and error mapping live in ``_postgres_tx.py``;
the LISTEN connection behind ``subscribe`` in ``_postgres_listen.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import psycopg

from gapline.storage._backend import Dialect
from gapline.storage._errors import (
    BackendUnavailable,
)
from gapline.storage._hooks import refuse_read_hooks
from gapline.storage._notify import NotificationHub
from gapline.storage._pooled import PooledBackend
from gapline.storage._postgres_listen import _Listener
from gapline.storage._postgres_tx import (
    SAVEPOINT,
    PostgresTx,
    as_literal,
    connect_postgres,
    map_postgres_error,
    rewrite_placeholders,
)
from gapline.storage._writer import GroupCommitWriter, ReaderPool

__all__ = ["PostgresBackend", "map_postgres_error", "open_postgres", "rewrite_placeholders"]

T = TypeVar("T")


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
        self.tx = PostgresTx(conn, self._reconnected)
        self.tx.pipelined = pipelined
        self._chained = False  # a chained BEGIN opened the transaction already

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        return self.tx.conn

    def _reconnected(self) -> psycopg.Connection[Any]:
        with contextlib.suppress(Exception):
            self._conn.close()
        self._chained = False
        return connect_postgres(self._dsn, autocommit=True, name="gapline-writer")

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
        self.tx.lead.append(SAVEPOINT)

    def release(self) -> None:
        lead = self.tx.lead
        if lead and lead[-1] == SAVEPOINT:
            lead.pop()  # the operation sent nothing: its savepoint was never opened
        else:
            lead.append("RELEASE SAVEPOINT gapline_op")

    def rollback_to(self) -> None:
        lead = self.tx.lead
        if lead and lead[-1] == SAVEPOINT:
            lead.pop()  # never sent, so nothing to undo
            return
        self.tx.lead = []
        self._conn.execute(
            as_literal("; ".join([*lead, "ROLLBACK TO SAVEPOINT gapline_op"])), prepare=False
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
        conn = connect_postgres(self._dsn, autocommit=False, name="gapline-reader")
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        self._tx = PostgresTx(conn)
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
            result = op(self._tx)
        finally:
            with contextlib.suppress(psycopg.Error):
                self._conn.rollback()
        refuse_read_hooks(self._tx.hooks)
        return result

    def close(self) -> None:
        self._conn.close()


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
                await asyncio.to_thread(
                    connect_postgres, dsn, autocommit=True, name="gapline-writer"
                )
            )
    except BaseException:
        for conn in conns:
            conn.close()
        raise
    return PostgresBackend(
        dsn, conns, group_commit=group_commit, max_batch=max_batch, readers=readers
    )
