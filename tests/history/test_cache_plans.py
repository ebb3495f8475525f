"""Query plans of the relation rules' hot reads on SQLite: every one is a bounded index
lookup or range scan, never a table scan or a temporary sort."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.history.cache_contract import ev, open_cache, write

PLANS = {
    "room window": "SELECT ord, pos, event, body, agg FROM history_event"
    " WHERE room = ? AND shown = 1 ORDER BY ord DESC, pos DESC LIMIT ?",
    "aggregate copy": "UPDATE history_event SET agg = ? WHERE room = ? AND event = ?",
    "thread window": "SELECT e.ord, e.pos, e.event, e.body, a.value FROM history_event e"
    " LEFT JOIN history_aggregate a ON a.room = ? AND a.target = e.event"
    " WHERE e.room = ? AND e.shown = 1 ORDER BY e.ord DESC, e.pos DESC LIMIT ?",
    "window of rows": "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
    " AND shown = 1 ORDER BY ord DESC, pos DESC LIMIT ?",
    "older rows": "SELECT ord, pos, event, body FROM history_event WHERE room = ? AND shown = 1"
    " AND (ord, pos) < (?, ?) ORDER BY ord DESC, pos DESC LIMIT ?",
    "aggregates": "SELECT target, value FROM history_aggregate WHERE room = ? AND target IN (?, ?)",
    "relation index": "SELECT event, target_id, kind FROM history_relation WHERE room = ?"
    " AND event IN (?, ?)",
    "members": "SELECT member, value FROM history_member WHERE room = ? AND member IN (?, ?)",
    "name holders": "SELECT COUNT(*) FROM history_member WHERE room = ? AND name = ?"
    " AND present = 1",
    "detached": "SELECT event, body FROM history_detached WHERE room = ? AND event IN (?, ?)",
}


async def test_relation_reads_use_their_indexes(tmp_path: Path) -> None:
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    await write(
        store, lambda s: s.ingest_sync([ev(i) for i in range(300)], limited=True, prev_batch="p")
    )
    await store.backend.close()
    db = sqlite3.connect(tmp_path / "history.sqlite3")
    for name, sql in PLANS.items():
        detail = " | ".join(
            row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, [1] * sql.count("?"))
        )
        assert "USING PRIMARY KEY" in detail or ("USING" in detail and "INDEX" in detail), (
            name,
            detail,
        )
        assert "SCAN" not in detail.replace("SCAN history_event USING PRIMARY KEY", ""), (
            name,
            detail,
        )
        assert "TEMP B-TREE" not in detail, (name, detail)
    db.close()
