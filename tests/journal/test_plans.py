"""Every query the store runs is index-covered, on both backends.

Rather than keeping a hand-written list of "hot" queries that could drift from the code,
this runs a workload touching every store path through a recording backend
(``tests/storage/plans.py``), then asks the database for the plan of each distinct
statement it saw:

- SQLite: ``EXPLAIN QUERY PLAN`` must show no full ``SCAN`` and no ``TEMP B-TREE``;
- PostgreSQL: with ``enable_seqscan`` and ``enable_sort`` off (so the planner only
  chooses them when no index can serve), ``EXPLAIN`` must show no ``Seq Scan`` and no
  ``Sort`` node.

Plain inserts are skipped: their only lookup is the unique index that defines the conflict.
"""

from __future__ import annotations

import json
from typing import Any

from gapline.journal import (
    ConversationKey,
    Cursor,
    Decision,
    DeliveryRequest,
    DeliveryStage,
    DepartureSource,
    EventKind,
    InboundEvent,
    JournalStore,
    Revision,
    ToolCall,
)
from gapline.storage import Backend, Dialect
from tests.journal.contract import ALICE, ROOM, edit, message, redaction
from tests.journal.contract_approvals import request as approval_request
from tests.storage.plans import RecordingBackend, plan_nodes, postgres_plan, sqlite_plan


async def _workload(backend: RecordingBackend) -> None:
    bot = (await JournalStore.open(backend)).principal("@bot:example.org")
    await bot.admit(edit("$early", "$o", "held", ts=200), epoch=0)
    await bot.admit(message("$o", "v0", ts=100), epoch=0)
    await bot.admit(message("$ctx", "c", ts=101, kind=EventKind.CONTEXT_ONLY), epoch=0)
    await bot.admit(message("$t", "threaded", ts=102, thread="$o"), epoch=0)
    await bot.admit(edit("$e2", "$o", "v2", ts=300), epoch=0)
    await bot.admit(redaction("$r1", "$e2"), epoch=0)
    await bot.admit(redaction("$r2", "$heldx"), epoch=0)
    await bot.admit(redaction("$r3", "$ctx"), epoch=0)
    page = await bot.read_conversation(ROOM, None, 2)
    await bot.read_conversation(ROOM, None, 2, before=page.next_before)
    await bot.read_conversation(ROOM, "$o", 2)
    await bot.message(ROOM, "$o")
    debt = await bot.refresh_debt(ROOM, "$o")
    assert debt is not None
    await bot.install_refetched(
        ROOM,
        "$o",
        Revision("$o", 100, json.dumps({"body": "v0"})),
        expected_epoch=0,
        expected_refresh_token=debt.refresh_token,
    )
    pending = await bot.pending(10)
    await bot.pending(10, after=pending[0].seq)
    await bot.settle("$t")
    await bot.admit(
        InboundEvent("$re", ROOM, None, "@a:x", 5, "m.reaction", "{}", EventKind.REACTION), epoch=0
    )
    await bot.claim_consumer("$re", "interactive_reaction")
    await bot.project_chunk(ROOM, [message("$h", "h", ts=1)], expected_epoch=0)
    key = ConversationKey(ROOM)
    await bot.publish_coverage(key, reached_start=False, messages=1, expected_epoch=0)
    await bot.coverage(key)
    await bot.begin_turn("$o")
    await bot.record_result("$o", b"result")
    request = DeliveryRequest("$o", "d1", DeliveryStage.INITIAL, ROOM, None, "m.room.message", "{}")
    await bot.enqueue(request)
    await bot.enqueue(request)  # update path
    (delivery,) = await bot.claim(5)
    await bot.enqueue(request)  # frozen path
    await bot.acknowledge(delivery, "$sent")
    final = DeliveryRequest("$o", "d1", DeliveryStage.FINAL, ROOM, None, "m.room.message", "{}")
    await bot.enqueue(final, settle_source=True)
    (delivery,) = await bot.claim(5)
    await bot.acknowledge(delivery, "$final")
    await bot.turn("$o")
    # Approvals and relations, then a fence that reconciles them.
    await bot.read_conversation(ROOM, None, 2, after=Cursor.start())
    await bot.read_conversation(ROOM, "$o", 2, after=Cursor.start())
    req = approval_request("$o")
    await bot.open_approval(req)
    await bot.event_role(ROOM, "$unknown")  # a card in flight
    (card,) = await bot.claim(5)
    await bot.acknowledge(card, "$card")
    await bot.event_role(ROOM, "$card")
    await bot.offer_reactions("$o", "$final", ["+1"])
    await bot.event_role(ROOM, "$final")
    await bot.resolve_approval(
        ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$yes"
    )
    await bot.approval(req.approval_id)
    other = approval_request("$o", ToolCall("other"), ordinal=1)
    await bot.open_approval(other)
    await bot.expire_approval(other.approval_id, now=2**62)
    await bot.open_approval(approval_request("$o", ToolCall("third"), ordinal=2))
    await bot.record_history_gap(ROOM)
    await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
    await bot.rooms_owing_departure_reports()
    await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
    await bot.fence_departure("!b:x", source=DepartureSource.LOCAL)
    await bot.retire_owed_departure_reports("!b:x")
    await bot.epoch(ROOM)


def _statements(log: list[tuple[str, tuple[Any, ...]]]) -> dict[str, tuple[Any, ...]]:
    seen: dict[str, tuple[Any, ...]] = {}
    for sql, params in log:
        head = sql.lstrip().upper()
        if head.startswith("INSERT") or "PG_ADVISORY" in head:
            continue
        seen.setdefault(sql, params)
    return seen


async def test_every_store_query_is_index_covered(backend: Backend) -> None:
    recording = RecordingBackend(backend)
    await _workload(recording)
    statements = _statements(recording.log)
    assert len(statements) >= 25  # the workload really reached the store's queries
    problems: dict[str, Any] = {}
    for sql, params in statements.items():
        if backend.dialect is Dialect.SQLITE:
            details = await sqlite_plan(backend, sql, params)
            bad = [d for d in details if d.startswith("SCAN") or "TEMP B-TREE" in d]
            if bad:
                problems[sql] = details
        else:
            nodes = [n["Node Type"] for n in plan_nodes(await postgres_plan(backend, sql, params))]
            if any(n in ("Seq Scan", "Sort", "Incremental Sort") for n in nodes):
                problems[sql] = nodes
    assert problems == {}


async def test_plan_check_catches_an_unindexed_query(backend: Backend) -> None:
    """The checks above can fail: a query on a non-indexed column is flagged."""
    await JournalStore.open(backend)
    sql = "SELECT event_id FROM journal_events WHERE sender = ? ORDER BY origin_server_ts LIMIT 5"
    if backend.dialect is Dialect.SQLITE:
        details = await sqlite_plan(backend, sql, ("@a:x",))
        assert any(d.startswith("SCAN") for d in details)
    else:
        plan = await postgres_plan(backend, sql, ("@a:x",), off=("enable_seqscan",))
        assert "Seq Scan" in [n["Node Type"] for n in plan_nodes(plan)]
