"""The hot queries are index-covered (SQLite plans), and the ordering strategy holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gapline.relay import _timeline_store
from gapline.relay._schema import MIGRATIONS


def _db(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "plans.db")
    conn.executescript(MIGRATIONS[0].sqlite)
    return conn


def _plan(conn: sqlite3.Connection, sql: str, params: tuple) -> str:
    return " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_sync_page_scans_the_visibility_primary_key(tmp_path: Path) -> None:
    conn = _db(tmp_path)
    plan = _plan(
        conn,
        "SELECT v.sequence, r.envelope, v.key_box, r.accepted_at, r.from_device_id "
        "FROM timeline_visibility v JOIN timeline_records r "
        "ON r.account = v.account AND r.sequence = v.sequence "
        "WHERE v.account = ? AND v.device_id = ? AND v.sequence > ? AND v.expires_at > ? "
        "ORDER BY v.sequence LIMIT ?",
        ("a", "d", -1, 0, 10),
    )
    assert (
        "SEARCH v USING INDEX sqlite_autoindex_timeline_visibility_1 (account=? AND device_id=? AND sequence>?)"
        in plan
    )
    assert (
        "SEARCH r USING INDEX sqlite_autoindex_timeline_records_1 (account=? AND sequence=?)"
        in plan
    )
    assert "TEMP B-TREE" not in plan  # no sort: the index gives sequence order


def test_retention_gap_probe_uses_the_expiry_index(tmp_path: Path) -> None:
    conn = _db(tmp_path)
    plan = _plan(
        conn,
        "SELECT 1 FROM timeline_visibility "
        "WHERE account = ? AND device_id = ? AND expires_at <= ? AND sequence > ? LIMIT 1",
        ("a", "d", 0, -1),
    )
    assert (
        "USING COVERING INDEX timeline_visibility_expired (account=? AND device_id=? AND expires_at<?)"
        in plan
    )


def test_head_devices_sends_and_cleanup_use_indexes(tmp_path: Path) -> None:
    conn = _db(tmp_path)
    checks = {
        "SELECT head FROM account_heads WHERE account = ?": ("a",),
        "SELECT account, device_id FROM account_devices WHERE account IN (?, ?) AND not_before <= ? AND expires_at > ?": (
            "a",
            "b",
            0,
            0,
        ),
        "SELECT digest, status, error, accepted_at FROM sends WHERE from_account = ? AND message_id = ?": (
            "a",
            "m",
        ),
        "SELECT account, device_id, sequence FROM timeline_visibility WHERE expires_at <= ? LIMIT 10": (
            0,
        ),
        "DELETE FROM timeline_records WHERE account = ? AND sequence = ?": ("a", 1),
        "SELECT from_account, message_id FROM sends WHERE expires_at <= ? LIMIT 10": (0,),
        # The batched SQLite send path (_accept_sends_sqlite).
        _timeline_store._stored_sends_sql(3): ("a", "m", "b", "n", "c", "o"),
        _timeline_store._DEVICE_WINDOWS_SQL.format(marks="?, ?"): ("a", "b", 128),
    }
    for sql, params in checks.items():
        plan = _plan(conn, sql, params)
        assert "SCAN" not in plan.replace("SCAN CONSTANT ROW", ""), (sql, plan)
