"""The contract of ``Tx.after_commit``, run on every backend (mixed into each backend's
test class next to ``BackendContract``).

A hook runs once its transaction committed, before the caller resumes and before the
writer's next transaction starts; a rolled-back op (alone, or inside a group) drops
its hooks; a hook that raises becomes its own op's outcome, the commit stays.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from gapline.storage import Backend, Tx
from tests.storage.contract import Boom, insert, keys, queued_together


def hooked(k: str, seen: list[str], *, fail: bool = False) -> Any:
    """Insert ``k`` and, once committed, note it in ``seen`` (what a cache would do)."""

    def op(tx: Tx) -> int:
        changed = tx.execute("INSERT INTO items (k, v) VALUES (?, 0)", (k,))
        tx.after_commit(lambda: seen.append(k))
        if fail:
            raise Boom(k)
        return changed

    return op


class CommitHooksContract:
    async def test_a_hook_runs_after_commit_before_the_caller_resumes(self, db: Backend) -> None:
        seen: list[str] = []
        assert await db.write(hooked("a", seen)) == 1
        assert seen == ["a"]

    async def test_a_hook_runs_on_the_writer_thread_before_its_next_transaction(
        self, db: Backend
    ) -> None:
        order: list[str] = []
        threads: list[int] = []

        def first(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('first', 0)")

            def hook() -> None:
                order.append("hook")
                threads.append(threading.get_ident())

            tx.after_commit(hook)

        def second(tx: Tx) -> None:
            order.append("second")
            threads.append(threading.get_ident())

        [a] = await queued_together(db, db.write(first))
        await a
        await db.write(second)
        assert order == ["hook", "second"]
        assert threads[0] != threading.get_ident()

    async def test_a_rolled_back_op_drops_its_hooks_alone_or_in_a_group(self, db: Backend) -> None:
        seen: list[str] = []
        with pytest.raises(Boom):
            await db.write(hooked("alone", seen, fail=True))
        assert seen == []
        # One group: the failing op's hook goes with its savepoint, its neighbours' run.
        before, failing, after = await queued_together(
            db,
            db.write(hooked("before", seen)),
            db.write(hooked("failing", seen, fail=True)),
            db.write(hooked("after", seen)),
        )
        assert await before == 1
        with pytest.raises(Boom):
            await failing
        assert await after == 1
        assert seen == ["before", "after"]
        assert await db.read(keys) == ["before", "after"]

    async def test_an_op_failing_on_a_constraint_runs_no_hook(self, db: Backend) -> None:
        seen: list[str] = []
        await db.write(insert("dup"))
        with pytest.raises(Exception):  # noqa: B017 - the backend's own integrity error
            await db.write(hooked("dup", seen))
        assert seen == []

    async def test_a_raising_hook_fails_its_own_op_and_the_commit_stays(self, db: Backend) -> None:
        seen: list[str] = []

        def breaks(tx: Tx) -> None:
            tx.execute("INSERT INTO items (k, v) VALUES ('kept', 0)")
            tx.after_commit(lambda: seen.append("before the raise"))

            def raise_boom() -> None:
                raise Boom("hook")

            tx.after_commit(raise_boom)

        broken, neighbour = await queued_together(
            db, db.write(breaks), db.write(hooked("neighbour", seen))
        )
        with pytest.raises(Boom, match="hook"):
            await broken
        assert await neighbour == 1
        assert seen == ["before the raise", "neighbour"]
        assert await db.read(keys) == ["kept", "neighbour"]

    async def test_batched_items_share_their_calls_hooks(self, db: Backend) -> None:
        seen: list[str] = []

        def insert_many(tx: Tx, items: list[str]) -> list[int]:
            for k in items:
                tx.execute("INSERT INTO items (k, v) VALUES (?, 0)", (k,))
            tx.after_commit(lambda: seen.extend(items))
            return [1] * len(items)

        futures = await queued_together(
            db, *(db.write_batched(insert_many, f"b{i}") for i in range(3))
        )
        assert await asyncio.gather(*futures) == [1, 1, 1]
        assert seen == ["b0", "b1", "b2"]

    async def test_a_read_cannot_register_a_hook(self, db: Backend) -> None:
        with pytest.raises(TypeError, match="only a write commits"):
            await db.read(lambda tx: tx.after_commit(lambda: None))
