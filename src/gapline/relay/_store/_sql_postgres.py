"""PostgreSQL's own forms of store rules, each the twin of a generic form in a sibling module.

A statement here does what its twin does, in the form PostgreSQL wants: fewer round trips
(a round trip, not the work, is what a send costs there), or a row lock where several relay
processes share one database and a read decides the write that follows it. Each names its
twin; ``tests/relay/test_sql_twins.py`` runs both forms with the same inputs and fails when
their outcomes or the rows they leave differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["LOCK_DEVICE_STATE", "send_in_one_statement"]

# The current revision of an account's state, read before replacing it, locked until COMMIT:
# a concurrent publish for the same account (from any relay process) waits, then sees this
# one's revision. Twin: _accounts.READ_DEVICE_STATE (SQLite's single writer needs no lock).
LOCK_DEVICE_STATE = "SELECT revision, canonical FROM device_states WHERE account = ? FOR UPDATE"


# Accepting a send. Twin: _sends.accept_batch with _timeline.append (the generic path, run on
# SQLite, a few multi-row statements per batch of sends).
#
# Round trips dominate on PostgreSQL, and the head row lock is held from the head upsert to
# COMMIT, so the whole send is this ONE statement: an operation costs one round trip besides
# the group-commit savepoint (it was three with sender boxes).
#
# The head upsert takes the row lock on account_heads and holds it until COMMIT, so concurrent
# senders to one account (from any relay process) are serialised: each sees the previous
# committed head, values are strictly increasing, and commit order equals sequence order, so
# a reader paging by `sequence > after` can never pass a sequence that commits later.
#
# Lock order: a send with sender boxes bumps two heads. Both are bumped by ONE multi-row
# upsert whose rows come in account order (PostgreSQL inserts the rows of INSERT ... SELECT
# ... ORDER BY in that order, locking as it goes), so two opposite sends between the same
# accounts (A->B and B->A, both with sender boxes) cannot deadlock.


def send_in_one_statement(
    *,
    from_account: str,
    message_id: str,
    digest: str,
    status: str,
    accepted_at: int,
    expires_at: int,
    from_device_id: str,
    envelope: str,
    accounts: Sequence[str],
    boxes: Sequence[tuple[str, str, str]],
    allowed: bool,
    channel: str,
) -> tuple[str, tuple[Any, ...]]:
    """The whole of a send on PostgreSQL, in one statement, and its parameters.

    ``accounts`` are the timelines to append to, in lock (account) order; ``boxes`` the
    (account, device_id, key box) offered for them; ``allowed`` is false when a time check
    refused the request (it is still claimed, so a retry of an accepted one is recognised).

    Data-modifying CTEs all run whatever the outer query reads, on one snapshot:
    ``c`` claims (from, message_id) (a concurrent holder of the same key makes it wait
    for that outcome); ``d`` reads the devices valid now (at acceptance); ``vis`` keeps
    the key boxes of those devices; ``go`` lets the appends happen only when the claim
    is new, no time check refused the request and every timeline to write has a visible
    device; ``h`` bumps the heads (the row locks, in account order); ``r`` and ``v``
    insert the records and their visibility rows; ``n`` is the ``pg_notify`` that
    ``Tx.notify`` would send (same channel and payload, delivered at COMMIT, dropped on
    rollback). The caller reads what happened from the rows returned ('c' claimed,
    'd' valid device, 'h' head assigned) and raises when the claim was new but nothing
    was appended, which rolls the claim back with the operation's savepoint.
    """
    marks = ", ".join("?" * len(accounts))
    account_values = ", ".join(["(?)"] * len(accounts))
    box_values = ", ".join(["(?, ?, ?)"] * len(boxes))
    sql = (
        "WITH c AS (INSERT INTO sends (from_account, message_id, digest, status, error,"
        " accepted_at, expires_at) VALUES (?, ?, ?, ?, NULL, ?, ?)"
        " ON CONFLICT (from_account, message_id) DO NOTHING RETURNING 1), "
        # Covered by the primary key of account_devices (account, device_id); at most 8 rows
        # each. A device is valid at t when not_before <= t < expires_at.
        "d AS (SELECT account, device_id FROM account_devices"
        f" WHERE account IN ({marks}) AND not_before <= ? AND expires_at > ? LIMIT 64), "
        f"b (account, device_id, key_box) AS (VALUES {box_values}), "
        "vis AS (SELECT b.account, b.device_id, b.key_box FROM b JOIN d"
        " ON d.account = b.account AND d.device_id = b.device_id), "
        "go AS (SELECT 1 FROM c WHERE ?::boolean"
        " AND (SELECT count(DISTINCT account) FROM vis) = ?), "
        "h AS (INSERT INTO account_heads (account, head)"
        f" SELECT t.account, 0 FROM (VALUES {account_values}) AS t (account), go"
        " ORDER BY t.account"
        " ON CONFLICT (account) DO UPDATE SET head = account_heads.head + 1"
        " RETURNING account, head), "
        "r AS (INSERT INTO timeline_records"
        " (account, sequence, accepted_at, expires_at, from_device_id, envelope)"
        " SELECT h.account, h.head, ?, ?, ?, ? FROM h), "
        "v AS (INSERT INTO timeline_visibility (account, device_id, sequence, expires_at, key_box)"
        " SELECT vis.account, vis.device_id, h.head, ?, vis.key_box"
        " FROM vis JOIN h ON h.account = vis.account), "
        "n AS (SELECT pg_notify(?, h.account || ' ' || h.head::text) FROM h) "
        "SELECT 'c', '', '', 0::bigint FROM c "
        "UNION ALL SELECT 'd', account, device_id, 0 FROM d "
        "UNION ALL SELECT 'h', account, '', head FROM h "
        "UNION ALL SELECT 'n', '', '', count(*) FROM n"
    )
    params = (
        from_account,
        message_id,
        digest,
        status,
        accepted_at,
        expires_at,
        *accounts,
        accepted_at,
        accepted_at,
        *(x for box in boxes for x in box),
        allowed,
        len(accounts),
        *accounts,
        accepted_at,
        expires_at,
        from_device_id,
        envelope,
        expires_at,
        channel,
    )
    return sql, params
