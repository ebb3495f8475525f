"""Asking the planner about the statements a store really runs.

Plan tests run a store's real code through ``RecordingBackend`` and then explain each
statement it logged, so they check the SQL the code executes, never a copy that could
drift from it. ``log`` holds ``(sql, params)`` in execution order (``executemany``: the
first row's parameters). ``sqlite_plan`` and ``postgres_plan`` ask each database.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from gapline.storage import Backend, Dialect, Migration, Tx

__all__ = ["RecordingBackend", "RecordingTx", "plan_nodes", "postgres_plan", "sqlite_plan"]

T = TypeVar("T")


class RecordingTx:
    def __init__(self, tx: Tx, log: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._tx = tx
        self._log = log

    @property
    def dialect(self) -> Dialect:
        return self._tx.dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._log.append((sql, tuple(params)))
        return self._tx.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self._log.append((sql, tuple(rows[0])))
        self._tx.executemany(sql, rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._log.append((sql, tuple(params)))
        return self._tx.one(sql, params)

    def one_after(
        self, prior: Sequence[tuple[str, Sequence[Any]]], sql: str, params: Sequence[Any] = ()
    ) -> tuple[Any, ...] | None:
        self._log.extend((s, tuple(a)) for s, a in prior)
        self._log.append((sql, tuple(params)))
        return self._tx.one_after(prior, sql, params)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._log.append((sql, tuple(params)))
        return self._tx.all(sql, params)

    def notify(self, channel: str, payload: str) -> None:
        self._tx.notify(channel, payload)

    def after_commit(self, hook: Callable[[], None]) -> None:
        self._tx.after_commit(hook)


class RecordingBackend:
    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.log: list[tuple[str, tuple[Any, ...]]] = []

    @property
    def dialect(self) -> Dialect:
        return self.inner.dialect

    async def write(self, op: Callable[[Tx], T]) -> T:
        return await self.inner.write(lambda tx: op(RecordingTx(tx, self.log)))

    async def write_batched(
        self, fn: Callable[[Tx, list[Any]], Sequence[T | BaseException]], item: Any
    ) -> T:
        return await self.inner.write_batched(
            lambda tx, items: fn(RecordingTx(tx, self.log), items), item
        )

    async def read(self, op: Callable[[Tx], T]) -> T:
        return await self.inner.read(lambda tx: op(RecordingTx(tx, self.log)))

    async def migrate(self, schema: str, migrations: Sequence[Migration]) -> None:
        await self.inner.migrate(schema, migrations)

    def subscribe(self, channel: str) -> AsyncIterator[str]:
        return self.inner.subscribe(channel)

    async def close(self) -> None:
        await self.inner.close()


async def sqlite_plan(backend: Backend, sql: str, params: Sequence[Any]) -> list[str]:
    """The detail lines of SQLite's ``EXPLAIN QUERY PLAN`` for ``sql``."""
    rows = await backend.read(lambda tx: tx.all("EXPLAIN QUERY PLAN " + sql, params))
    return [str(row[3]) for row in rows]


async def postgres_plan(
    backend: Backend,
    sql: str,
    params: Sequence[Any],
    *,
    off: Sequence[str] = ("enable_seqscan", "enable_sort"),
) -> dict[str, Any]:
    """PostgreSQL's plan of ``sql`` (the root node of ``EXPLAIN (FORMAT JSON)``), planned
    with the ``off`` settings disabled so the planner picks those nodes only when nothing
    else can serve."""

    def explain(tx: Tx) -> Any:
        for setting in off:
            tx.execute(f"SET LOCAL {setting} = off")
        row = tx.one("EXPLAIN (FORMAT JSON) " + sql, params)
        assert row is not None
        return row[0]

    plan = await backend.write(explain)
    if isinstance(plan, str):
        plan = json.loads(plan)
    return plan[0]["Plan"]


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a PostgreSQL plan, the root first."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)
