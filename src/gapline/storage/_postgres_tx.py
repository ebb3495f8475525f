"""PostgreSQL transactions: the ``Tx`` a PostgreSQL operation runs in, and error mapping.

``?`` placeholders are rewritten to ``%s`` once per SQL string (cached), outside
string literals, quoted identifiers and comments; a literal ``%`` is doubled.
A statement without parameters is sent untouched (so a migration may hold
several statements). Driver errors become ``gapline.storage`` errors in one
place, ``map_postgres_error``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, LiteralString, TypeVar, cast

import psycopg

from gapline.storage._backend import Dialect
from gapline.storage._errors import (
    BackendUnavailable,
    CorruptStore,
    IntegrityError,
    OperationalError,
    StorageError,
)
from gapline.storage._hooks import CommitHooks

__all__ = ["map_postgres_error", "rewrite_placeholders"]

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


def as_literal(query: str) -> LiteralString:
    # psycopg types queries as LiteralString against injection; gapline's SQL is
    # written in code with ? placeholders, and values always travel as parameters.
    return cast("LiteralString", query)


SAVEPOINT = "SAVEPOINT gapline_op"


class PostgresTx:
    """What an operation sees on PostgreSQL.

    ``lead`` holds parameterless transaction statements the writer session has
    deferred (``BEGIN``, ``SAVEPOINT``, ``RELEASE``) until the operation sends its
    first statement: ahead of it in one simple query, or, for ``one_after``, in one
    pipeline with it and its prior statements, so that the whole op is one round
    trip. An operation that sends nothing costs nothing.
    """

    __slots__ = ("_aux", "_cur", "_reconnect", "conn", "hooks", "lead", "pipelined")

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        reconnect: Callable[[], psycopg.Connection[Any]] | None = None,
    ) -> None:
        self._reconnect = reconnect
        self.pipelined = True  # False: one_after runs its statements one by one
        self.lead: list[str] = []
        self.hooks = CommitHooks()
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
                    self._aux.execute(as_literal(rewrite_placeholders(sql)), args)
                if params:
                    self._cur.execute(as_literal(rewrite_placeholders(query)), params)
                else:
                    self._cur.execute(as_literal(query))
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
                self._aux.execute(as_literal(statement), prepare=False)
            for sql, args in prior:
                self._aux.execute(as_literal(rewrite_placeholders(sql)), args)
            self._cur.execute(as_literal(rewrite_placeholders(query)), params)

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
        self._aux.execute(as_literal("; ".join(lead)), prepare=False)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._run(sql, params).rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self.flush_lead()
            self._cur.executemany(as_literal(rewrite_placeholders(sql)), list(rows))
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

    def after_commit(self, hook: Callable[[], None]) -> None:
        self.hooks.add(hook)

    # The server drops notifications of rolled-back savepoints: nothing to track here.
    def notes_mark(self) -> int:
        return 0

    def notes_truncate(self, mark: int) -> None:
        return None

    def take_notes(self) -> list[tuple[str, str]]:
        return []


def connect_postgres(dsn: str, *, autocommit: bool, name: str) -> psycopg.Connection[Any]:
    try:
        # application_name shows each connection's role in pg_stat_activity.
        return psycopg.connect(dsn, autocommit=autocommit, application_name=name)
    except psycopg.Error as exc:
        raise map_postgres_error(exc) from exc
