"""The SQLite backend: an embedded file, one writer thread with group commit.

Durability is never traded for speed: the writer connection runs
``synchronous=FULL`` in WAL mode, so each COMMIT fsyncs the WAL before a
caller's future resolves. Throughput comes from group commit instead (see
``_writer.py``): up to ``max_batch`` queued writes share one ``BEGIN
IMMEDIATE ... COMMIT`` and hence one fsync. Readers use their own connections
(``synchronous=NORMAL``, ``query_only``); WAL gives each read transaction a
consistent snapshot that neither blocks nor is blocked by the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gapline.storage._backend import Dialect
from gapline.storage._errors import (
    BackendUnavailable,
    CorruptStore,
    IntegrityError,
    OperationalError,
    StorageError,
)
from gapline.storage._hooks import CommitHooks, refuse_read_hooks
from gapline.storage._notify import NotificationHub
from gapline.storage._pooled import PooledBackend
from gapline.storage._writer import GroupCommitWriter, ReaderPool

__all__ = ["SQLiteBackend", "map_sqlite_error", "open_sqlite"]

T = TypeVar("T")

# Primary result codes (the low byte of an extended code).
_SQLITE_CORRUPT = 11
_SQLITE_CANTOPEN = 14
_SQLITE_CONSTRAINT = 19
_SQLITE_NOTADB = 26


def map_sqlite_error(exc: BaseException) -> BaseException:
    """The one place sqlite3 errors become gapline storage errors.

    Anything that is not a ``sqlite3.Error`` (an operation's own exception, or an
    error already mapped) is returned unchanged.
    """
    if not isinstance(exc, sqlite3.Error):
        return exc
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    message = str(exc)
    if primary in (_SQLITE_NOTADB, _SQLITE_CORRUPT) or "not a database" in message:
        mapped: StorageError = CorruptStore(
            f"not a usable SQLite database (damaged, or not a database at all): {message}"
        )
    elif primary == _SQLITE_CANTOPEN or "unable to open database" in message:
        mapped = BackendUnavailable(f"cannot open the SQLite database: {message}")
    elif isinstance(exc, sqlite3.IntegrityError) or primary == _SQLITE_CONSTRAINT:
        mapped = IntegrityError(message)
    else:
        mapped = OperationalError(message)
    mapped.__cause__ = exc
    return mapped


class _SQLiteTx:
    """What an operation sees. Driver errors are mapped where they are raised."""

    __slots__ = ("_conn", "_notes", "hooks")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._notes: list[tuple[str, str]] = []
        self.hooks = CommitHooks()

    @property
    def dialect(self) -> Dialect:
        return Dialect.SQLITE

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            return self._conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc) from exc

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        try:
            return self._conn.execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc) from exc

    def one_after(
        self, prior: Sequence[tuple[str, Sequence[Any]]], sql: str, params: Sequence[Any] = ()
    ) -> tuple[Any, ...] | None:
        for statement, args in prior:
            self.execute(statement, args)
        return self.one(sql, params)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc) from exc

    def notify(self, channel: str, payload: str) -> None:
        self._notes.append((channel, payload))

    def after_commit(self, hook: Callable[[], None]) -> None:
        self.hooks.add(hook)

    # Used by the writer loop so a rolled-back savepoint publishes nothing.
    def notes_mark(self) -> int:
        return len(self._notes)

    def notes_truncate(self, mark: int) -> None:
        del self._notes[mark:]

    def take_notes(self) -> list[tuple[str, str]]:
        notes, self._notes = self._notes, []
        return notes


def _connect(path: str, busy_timeout_ms: int, *, writer: bool) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(
            path,
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # created on the opening thread, used on the owner thread
            cached_statements=512,
        )
    except sqlite3.Error as exc:
        raise map_sqlite_error(exc) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # The first statement that reads the file: a non-database fails here.
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise BackendUnavailable(f"cannot switch {path} to WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL" if writer else "PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        if not writer:
            conn.execute("PRAGMA query_only=ON")
        # Touch the schema so a file with a valid header but damaged pages fails now.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        conn.close()
        raise map_sqlite_error(exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn


class _SQLiteWriterSession:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.tx = _SQLiteTx(conn)

    def begin(self, grouped: bool) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def savepoint(self) -> None:
        self._conn.execute("SAVEPOINT gapline_op")

    def release(self) -> None:
        self._conn.execute("RELEASE gapline_op")

    def rollback_to(self) -> None:
        self._conn.execute("ROLLBACK TO gapline_op")

    def commit(self, chain: bool) -> None:
        # BEGIN IMMEDIATE costs no round trip in-process: nothing to save by chaining.
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def ensure_open(self) -> None:
        return None

    def map_error(self, exc: BaseException) -> BaseException:
        return map_sqlite_error(exc)

    def close(self) -> None:
        self._conn.close()


class _SQLiteReaderSession:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._tx = _SQLiteTx(conn)

    def run(self, op: Callable[[Any], T]) -> T:
        conn = self._conn
        try:
            conn.execute("BEGIN")  # deferred: the snapshot is taken at the first read
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc) from exc
        try:
            result = op(self._tx)
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        refuse_read_hooks(self._tx.hooks)
        return result

    def close(self) -> None:
        self._conn.close()


class SQLiteBackend(PooledBackend):
    """A :class:`gapline.storage.Backend` on one SQLite file. Open with :func:`open_sqlite`."""

    def __init__(
        self,
        path: str,
        writer_conn: sqlite3.Connection,
        *,
        group_commit: bool,
        max_batch: int,
        readers: int,
        busy_timeout_ms: int,
    ) -> None:
        self.path = path
        hub = NotificationHub()
        super().__init__(
            hub,
            GroupCommitWriter(
                [_SQLiteWriterSession(writer_conn)],
                hub,
                max_batch=max_batch,
                group_commit=group_commit,
                name=f"gapline-sqlite-writer:{Path(path).name}",
            ),
            ReaderPool(
                lambda: _SQLiteReaderSession(_connect(path, busy_timeout_ms, writer=False)),
                readers,
                name="gapline-sqlite-reader",
            ),
        )

    @property
    def dialect(self) -> Dialect:
        return Dialect.SQLITE

    def subscribe(self, channel: str) -> AsyncIterator[str]:
        self._check_open()
        return self._hub.subscribe(channel)


async def open_sqlite(
    path: str | Path,
    *,
    group_commit: bool = True,
    max_batch: int = 64,
    readers: int = 2,
    busy_timeout_ms: int = 5000,
) -> SQLiteBackend:
    """Open (creating if needed) the SQLite database at ``path``.

    ``group_commit=False`` commits every write in its own transaction (the
    benchmark's comparison point); durability is the same either way.
    """
    spath = str(path)
    if spath == ":memory:" or spath.startswith("file:"):
        # Readers use their own connections: a private in-memory database would be
        # invisible to them, and URI filenames would bypass the directory handling.
        raise BackendUnavailable(f"the SQLite backend needs a file path, not {spath!r}")
    try:
        Path(spath).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendUnavailable(f"cannot create the directory for {spath}: {exc}") from exc
    conn = await asyncio.to_thread(_connect, spath, busy_timeout_ms, writer=True)
    return SQLiteBackend(
        spath,
        conn,
        group_commit=group_commit,
        max_batch=max_batch,
        readers=readers,
        busy_timeout_ms=busy_timeout_ms,
    )
