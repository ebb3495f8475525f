"""The one storage contract every gapline store is written against.

An *operation* is a plain synchronous function ``op(tx) -> T`` that runs on a
database thread inside a transaction. Operations never await: a transaction is
one thread hop, so nothing can interleave with it, and the event loop never
blocks on the driver. The async methods of :class:`Backend` schedule operations
and resolve once their outcome is final.

SQL is written once for both dialects with ``?`` placeholders; the PostgreSQL
backend rewrites them. Where the dialects differ (BLOB vs BYTEA, AUTOINCREMENT
vs IDENTITY), a migration carries both texts and code branches on ``tx.dialect``.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["Backend", "Dialect", "Migration", "Tx"]

T = TypeVar("T")
ItemT = TypeVar("ItemT")


class Dialect(enum.Enum):
    SQLITE = "sqlite"
    POSTGRES = "postgres"


class Tx(Protocol):
    """A transaction (or a savepoint inside a group commit) seen by one operation."""

    @property
    def dialect(self) -> Dialect: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 when unknown)."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter row."""
        ...

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row of a query, or None."""
        ...

    def one_after(
        self, prior: Sequence[tuple[str, Sequence[Any]]], sql: str, params: Sequence[Any] = ()
    ) -> tuple[Any, ...] | None:
        """Run each ``(sql, params)`` of ``prior`` (their results unread), then return the
        first row of ``sql``.

        The statements still run one after another, each seeing what the ones before it
        did (on PostgreSQL each takes its own snapshot, after any lock an earlier one
        waited for); PostgreSQL sends them all in one round trip. The first error raises.
        """
        ...

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of a query. Callers bound it with LIMIT: no unbounded reads."""
        ...

    def notify(self, channel: str, payload: str) -> None:
        """Publish ``payload`` on ``channel`` once this transaction commits.

        Subscribers in every process sharing the database receive it
        (PostgreSQL: NOTIFY; SQLite: in-process). A rolled-back savepoint or
        transaction publishes nothing.
        """
        ...

    def after_commit(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` on the writer thread once this transaction has committed.

        Hooks run in the order registered, right after the COMMIT and before
        any later transaction of the same writer starts, and before the
        callers resume; a rolled-back savepoint or transaction drops its
        hooks. A hook that raises leaves the commit in place: its exception
        becomes the outcome of the operation that registered it. Only writes
        commit: a read that registers one fails with ``TypeError``.
        """
        ...


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered, commented schema change. ``postgres`` defaults to ``sqlite``."""

    version: int
    name: str
    sqlite: str
    postgres: str | None = None

    def text_for(self, dialect: Dialect) -> str:
        if dialect is Dialect.POSTGRES and self.postgres is not None:
            return self.postgres
        return self.sqlite


class Backend(Protocol):
    """A durable database shared by gapline's stores.

    Contract (held by tests/storage/contract.py on every implementation):

    - ``write(op)`` runs ``op`` in a write transaction, isolated by its own
      savepoint when the backend groups several writes into one commit. If
      ``op`` raises, exactly its own changes are rolled back and the exception
      reaches the caller; other operations of the group commit normally.
      The returned awaitable resolves only after the commit that holds the
      write is durable (fsync'd, ``synchronous=FULL`` / default PostgreSQL
      commit), so a crash after it resolves cannot lose the write.
    - Writes from one caller, awaited in sequence, commit in that order.
      Writes submitted without awaiting in between (``gather``) also commit
      in submission order on SQLite and on PostgreSQL with the default single
      writer connection; PostgreSQL opened with ``writers=N > 1`` runs N
      group-committed batches concurrently and gives no order among such
      writes (nor between different callers), only the awaited order above.
    - Cancelling a caller never leaves a half-written transaction: an op runs
      entirely or not at all. Once started it finishes; the caller just stops
      waiting for the outcome.
    - ``write_batched(fn, item)`` is ``write`` for many callers at once: queued
      items of the same ``fn`` that are next to each other in the queue reach it
      together as ``fn(tx, items)``, which returns one outcome per item in order
      (a value, or an exception instance for an item that wrote nothing: that
      caller gets it raised). If ``fn`` raises, its changes are rolled back and
      each item is run again alone, so a failure reaches only its own caller.
      Durability and ordering are those of ``write``. Use it where a write is
      a few statements issued by many concurrent callers: one multi-row
      statement per batch replaces one statement per caller.
    - ``read(op)`` runs ``op`` on a read connection that sees a consistent
      committed snapshot and never blocks writers. A read function must not write.
    - ``migrate(schema, migrations)`` applies, once each and in version order,
      the migrations of ``schema`` not yet applied; it is safe when several
      processes open the same database at once, and refuses a database that
      already holds a newer version than the code knows.
    - ``close()`` stops accepting work, waits for queued and in-flight
      operations, and closes the connections. Further calls raise BackendClosed.
    """

    @property
    def dialect(self) -> Dialect: ...

    async def write(self, op: Callable[[Tx], T]) -> T: ...

    async def write_batched(
        self, fn: Callable[[Tx, list[ItemT]], Sequence[T | BaseException]], item: ItemT
    ) -> T: ...

    async def read(self, op: Callable[[Tx], T]) -> T: ...

    async def migrate(self, schema: str, migrations: Sequence[Migration]) -> None: ...

    def subscribe(self, channel: str) -> AsyncIterator[str]:
        """Payloads published with ``Tx.notify`` on ``channel`` after this call.

        Call it from a coroutine. Payloads arrive in commit order, after their
        transaction committed. The iterator ends when the backend closes;
        ``aclose()`` it (or leave ``async for``) to unsubscribe. On PostgreSQL
        the first subscription to a channel waits for the server to acknowledge
        LISTEN (one local round trip); a lost LISTEN connection is re-established
        but loses what was sent meanwhile, so treat a payload as a hint to re-read.
        """
        ...

    async def close(self) -> None: ...
