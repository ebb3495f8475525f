"""The relay store's queries are index-covered: the planner is asked about the statements
the store really runs, never about a copy of them.

A workload drives every store path through a recording backend
(``tests/storage/plans.py``); each distinct statement it logged is explained with the
parameters it ran with. SQLite (the ``EXPLAIN QUERY PLAN`` details): the sync page and the
retention-gap probe use the indexes made for them, and no statement scans a whole table.
PostgreSQL (``EXPLAIN`` with ``enable_seqscan`` and ``enable_sort`` off, so the planner
picks them only when no index can serve): no ``Seq Scan``, and a ``Sort`` only of the
parameter list itself (the one-statement send orders its accounts to lock them in order).

Plain inserts are skipped: their only lookup is the unique index that defines the conflict.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gapline.relay import TimelineStore
from gapline.relay._errors import RelayFailure
from gapline.relay._store import (
    DeviceEntry,
    HistoryRow,
    NewSend,
    NewState,
    RecordRow,
    Session,
    _sql_postgres,
    _timeline,
)
from gapline.storage import Backend, open_backend
from tests.relay.store_inputs import new_send
from tests.storage.plans import RecordingBackend, plan_nodes, postgres_plan, sqlite_plan

NOW = 1_800_000_000
RETENTION = 100

# Cleanup deletes expired challenges and sessions with a full scan: neither table has an
# index on expires_at (both hold short-lived rows, and cleanup runs once per interval).
SCANS_ON_PURPOSE = {
    "DELETE FROM auth_challenges WHERE expires_at <= ?",
    "DELETE FROM sessions WHERE expires_at <= ?",
}


def _state(account: str, revision: int, devices: list[str]) -> NewState:
    entries = tuple(DeviceEntry(d, 0, NOW + 10_000, f"cert-{d}") for d in devices)
    return NewState(account, revision, f"state-{account}-{revision}", entries)


def _send(sender: str, to: str, message_id: str, **changes: Any) -> NewSend:
    own = {"alice": ["a0", "a1"], "bob": ["b0"], "dave": ["d0"]}
    return new_send(sender, to, message_id, own, now=NOW, retention=RETENTION, **changes)


async def _refused(outcome: Any) -> str:
    try:
        await outcome
    except RelayFailure as failure:
        return failure.code
    raise AssertionError("expected a relay failure")


async def _workload(store: TimelineStore) -> None:
    """Every store operation, along each of its paths."""
    await store.meta_get_or_set("relay_key", "k")
    accounts, sends, timelines = store.accounts, store.sends, store.timelines
    assert await accounts.publish_state(_state("alice", 1, ["a0", "a1"]))
    assert await accounts.publish_state(_state("bob", 1, ["b0"]))
    assert not await accounts.publish_state(_state("bob", 1, ["b0"]))  # identical repeat
    assert await accounts.publish_state(_state("alice", 2, ["a0", "a1"]))  # replaces
    assert await _refused(accounts.publish_state(_state("alice", 1, ["a0"]))) == "stale_state"
    dave = NewState("dave", 1, "state-dave", (DeviceEntry("d0", NOW + 500, NOW + 10_000, "c"),))
    await accounts.publish_state(dave)
    await accounts.resolve_state("alice")
    await accounts.device_window("alice", "a0")
    await accounts.certificate("a0")
    await accounts.add_challenge("nonce", "alice", NOW + 60)
    await accounts.consume_challenge("nonce")
    await accounts.add_challenge("stale", "alice", NOW + 1)
    await accounts.add_session("token", Session("alice", "device", "a1", "https://x", NOW + 60))
    await accounts.get_session("token")

    await sends.accept(_send("alice", "bob", "m1"))
    await sends.accept(_send("alice", "bob", "m2", sender_boxes=None))
    await sends.accept(_send("alice", "alice", "self", sender_boxes=None))
    await sends.accept(_send("alice", "bob", "m1"))  # a retry: the stored result
    assert await _refused(sends.accept(_send("alice", "bob", "m1", digest="x"))) == (
        "state_conflict"
    )
    assert await _refused(sends.accept(_send("alice", "dave", "m3"))) == "device_unknown"
    late = RelayFailure("message_expired", "too old")
    assert await _refused(sends.accept(_send("alice", "bob", "m4", refusal=late))) == (
        "message_expired"
    )
    await sends.delivery_status("alice", "m1", NOW)
    await timelines.head("bob")
    await timelines.sync("bob", "b0", -1, 10, NOW)
    await timelines.sync("bob", "b0", -1, 10, NOW + RETENTION)  # expired, not cleaned up
    await store.cleanup(NOW + RETENTION + 1)
    await timelines.sync("bob", "b0", -1, 10, NOW + RETENTION + 1)  # the gap mark

    profiles, routes = store.profiles, store.routes
    assert await profiles.replace(
        "alice", expected=None, updated_at=NOW, canonical="p1", signer_certificate="c"
    )
    assert not await profiles.replace(  # another publication came first
        "alice", expected=None, updated_at=NOW, canonical="p2", signer_certificate="c"
    )
    assert await profiles.replace(
        "alice", expected=1, updated_at=NOW + 1, canonical="p2", signer_certificate="c"
    )
    assert (await profiles.current("alice")) is not None
    assert await profiles.access("alice") is not None
    assert (await profiles.access("alice", state_revision=2, profile_revision=2)) is not None
    assert await profiles.access("nobody") is None
    key = "ab" * 32
    first = HistoryRow(5, "sha256:x", False)
    record = RecordRow(5, "sha256:x", "{}", NOW + 10)
    assert await routes.commit(key, expected=None, new=first, record=record)
    assert await routes.history(key) == first
    newer = HistoryRow(6, "sha256:y", False)
    assert not await routes.commit(key, expected=None, new=newer)  # not what is stored
    assert await routes.commit(
        key, expected=first, new=newer, record=RecordRow(6, "sha256:y", "{}", NOW + 10)
    )
    assert await routes.values(key, NOW) == ["{}"]  # revision 5 is gone
    await store.cleanup(NOW + 11)
    assert await routes.values(key, NOW) == []


def _statements(log: list[tuple[str, tuple[Any, ...]]]) -> dict[str, tuple[Any, ...]]:
    seen: dict[str, tuple[Any, ...]] = {}
    for sql, params in log:
        if not sql.lstrip().upper().startswith("INSERT"):
            seen.setdefault(sql, params)
    return seen


async def _run_workload(backend: Backend) -> dict[str, tuple[Any, ...]]:
    recording = RecordingBackend(backend)
    store = TimelineStore(recording, lambda: NOW)
    await store.migrate()
    await _workload(store)
    statements = _statements(recording.log)
    assert len(statements) >= 20  # the workload really reached the store's queries
    return statements


@pytest.fixture
async def sqlite_statements(tmp_path: Path) -> AsyncIterator[tuple[Backend, dict[str, Any]]]:
    backend = await open_backend(str(tmp_path / "plans.db"))
    try:
        yield backend, await _run_workload(backend)
    finally:
        await backend.close()


async def _sqlite_plan(backend: Backend, sql: str, params: tuple[Any, ...]) -> str:
    return " | ".join(await sqlite_plan(backend, sql, params))


async def test_sync_page_scans_the_visibility_primary_key(
    sqlite_statements: tuple[Backend, dict[str, Any]],
) -> None:
    backend, statements = sqlite_statements
    assert _timeline.PAGE in statements
    plan = await _sqlite_plan(backend, _timeline.PAGE, statements[_timeline.PAGE])
    assert (
        "SEARCH v USING INDEX sqlite_autoindex_timeline_visibility_1 (account=? AND device_id=? AND sequence>?)"
        in plan
    )
    assert (
        "SEARCH r USING INDEX sqlite_autoindex_timeline_records_1 (account=? AND sequence=?)"
        in plan
    )
    assert "TEMP B-TREE" not in plan  # no sort: the index gives sequence order


async def test_retention_gap_probe_uses_the_expiry_index(
    sqlite_statements: tuple[Backend, dict[str, Any]],
) -> None:
    backend, statements = sqlite_statements
    probe = _timeline.EXPIRED_WAITING
    assert probe in statements
    plan = await _sqlite_plan(backend, probe, statements[probe])
    assert (
        "USING COVERING INDEX timeline_visibility_expired (account=? AND device_id=? AND expires_at<?)"
        in plan
    )


async def _sqlite_problems(backend: Backend, statements: dict[str, Any]) -> dict[str, str]:
    """The statements whose SQLite plan scans a table (unless on purpose) or sorts."""
    problems: dict[str, str] = {}
    for sql, params in statements.items():
        plan = await _sqlite_plan(backend, sql, params)
        scans = "SCAN" in plan.replace("SCAN CONSTANT ROW", "")
        if (scans and sql not in SCANS_ON_PURPOSE) or "TEMP B-TREE" in plan:
            problems[sql] = plan
    return problems


async def test_every_statement_the_store_runs_uses_indexes(
    sqlite_statements: tuple[Backend, dict[str, Any]],
) -> None:
    backend, statements = sqlite_statements
    # Among them the head read, the batched send path's device and stored-result reads,
    # and cleanup's scan and deletes.
    for fragment in (
        "SELECT head FROM account_heads WHERE account = ?",
        "FROM account_devices WHERE account IN (?",
        "FROM sends WHERE (from_account = ? AND message_id = ?)",
        "FROM timeline_visibility WHERE expires_at <= ? LIMIT ?",
        "DELETE FROM timeline_records WHERE account = ? AND sequence = ?",
        "DELETE FROM sends WHERE (from_account, message_id) IN (",
    ):
        assert any(fragment in sql for sql in statements), fragment
    assert statements.keys() >= SCANS_ON_PURPOSE
    assert await _sqlite_problems(backend, statements) == {}


def _reads_a_table(plan: dict[str, Any]) -> bool:
    return any("Relation Name" in node for node in plan_nodes(plan))


async def _postgres_problems(backend: Backend, statements: dict[str, Any]) -> dict[str, Any]:
    """The statements whose PostgreSQL plan scans a table (unless on purpose) or sorts rows
    read from one."""
    problems: dict[str, list[str]] = {}
    for sql, params in statements.items():
        nodes = list(plan_nodes(await postgres_plan(backend, sql, params)))
        scans = any(n["Node Type"] == "Seq Scan" for n in nodes)
        sorts = any(
            n["Node Type"] in ("Sort", "Incremental Sort") and _reads_a_table(n) for n in nodes
        )
        if (scans and sql not in SCANS_ON_PURPOSE) or sorts:
            problems[sql] = [n["Node Type"] for n in nodes]
    return problems


@pytest.mark.postgres
async def test_every_statement_the_store_runs_uses_indexes_on_postgres(
    postgres_dsn: str,
) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        statements = await _run_workload(backend)
        assert any("WITH c AS (INSERT INTO sends" in sql for sql in statements)  # the send
        assert _sql_postgres.LOCK_DEVICE_STATE in statements
        assert await _postgres_problems(backend, statements) == {}
    finally:
        await backend.close()


# Neither a scan of a column without an index nor a sort the index cannot give passes.
UNINDEXED = {
    "SELECT token_hash FROM sessions WHERE origin = ? LIMIT 5": ("https://x",),
    "SELECT token_hash FROM sessions WHERE account = ? ORDER BY expires_at LIMIT 5": ("a",),
}


async def test_the_checks_catch_unindexed_statements(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "unindexed.db"))
    try:
        await TimelineStore(backend, lambda: NOW).migrate()
        assert (await _sqlite_problems(backend, UNINDEXED)).keys() == UNINDEXED.keys()
    finally:
        await backend.close()


@pytest.mark.postgres
async def test_the_checks_catch_unindexed_statements_on_postgres(postgres_dsn: str) -> None:
    backend = await open_backend(postgres_dsn)
    try:
        await TimelineStore(backend, lambda: NOW).migrate()
        assert (await _postgres_problems(backend, UNINDEXED)).keys() == UNINDEXED.keys()
    finally:
        await backend.close()
