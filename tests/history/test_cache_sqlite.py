"""The history cache on SQLite: the shared contract, plus the query plans of its hot reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.history.cache_contract import CacheStoreContract, ev, open_cache, write


class TestSQLiteCacheStore(CacheStoreContract):
    @pytest.fixture
    def dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "history.sqlite3")


del CacheStoreContract


async def test_hot_queries_are_index_covered(tmp_path: Path) -> None:
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    await write(
        store, lambda s: s.ingest_sync([ev(i) for i in range(300)], limited=True, prev_batch="p")
    )
    await store.backend.close()
    db = sqlite3.connect(tmp_path / "history.sqlite3")
    plans = {
        "window": "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
        " ORDER BY ord DESC, pos DESC LIMIT ?",
        "older": "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
        " AND (ord, pos) < (?, ?) ORDER BY ord DESC, pos DESC LIMIT ?",
        "locate": "SELECT event, ord, pos FROM history_event WHERE room = ? AND event IN (?, ?)",
        "head": "SELECT pos FROM history_event WHERE room = ? AND ord = ? ORDER BY pos LIMIT 1",
        "gaps": "SELECT gap_id FROM history_gap WHERE room = ? AND newer_ord > ?"
        " AND newer_ord <= ? ORDER BY newer_ord LIMIT ?",
    }
    for name, sql in plans.items():
        detail = " | ".join(
            row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, [1] * sql.count("?"))
        )
        assert "USING PRIMARY KEY" in detail or "USING COVERING INDEX" in detail, (name, detail)
        assert "TEMP B-TREE" not in detail, (name, detail)
    db.close()
