"""Timelines: per account, its records in sequence order, which devices may read each one,
the page a device syncs, and what retention leaves behind.

The rules, each kept here in SQL that runs the same on SQLite and PostgreSQL (the one
exception, the one-statement send, has its PostgreSQL twin in ``_sql_postgres``):

- one sequence per record per account, from ``account_heads`` (the highest ever
  assigned; cleanup never touches it, so restarts and cleanup cannot lower the head);
- device visibility fixed at acceptance: a record gets one ``timeline_visibility``
  row per key-box device valid at that instant, and nothing else ever adds one;
- each record's deadline is ``accepted_at`` plus the retention in force then, stored with
  the record, so later configuration cannot shorten it;
- ``retention_gaps`` keeps, per device, the highest expired sequence that was visible to
  it, so the gap answer stays exact after cleanup deletes the content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gapline.relay._errors import RelayFailure
from gapline.relay._store._accounts import certificates
from gapline.relay._store._rows import chunks, flat
from gapline.storage import Backend, Tx

__all__ = [
    "TIMELINE_CHANNEL",
    "Append",
    "KeyBox",
    "SyncItem",
    "SyncPage",
    "Timelines",
    "append",
    "expire",
]

# Notification channel (Tx.notify): payload "<account> <sequence>", one per record appended.
TIMELINE_CHANNEL = "meshline_timeline"


@dataclass(frozen=True, slots=True)
class KeyBox:
    device_id: str
    json: str  # the MessageKeyBox as received (re-serialised compactly, members sorted)


class Append(NamedTuple):
    """One record to append to ``account``'s timeline, readable by the devices of ``boxes``.

    The caller has already kept only the boxes of devices valid at acceptance. (A tuple,
    not a frozen dataclass: a batch makes one per record, on the send path.)
    """

    account: str
    accepted_at: int
    expires_at: int
    from_device_id: str
    envelope: str
    boxes: Sequence[KeyBox]


@dataclass(frozen=True, slots=True)
class SyncItem:
    sequence: int
    envelope: str
    key_box: str
    accepted_at: int
    from_device_id: str


@dataclass(frozen=True, slots=True)
class SyncPage:
    items: tuple[SyncItem, ...]
    certificates: tuple[str, ...]
    has_more: bool
    has_retention_gap: bool


# Sequence assignment. One row per account (account_heads) holds the highest sequence ever
# assigned. An append bumps it with an upsert that RETURNs the new value, in the transaction
# that also inserts the records, so a rolled-back send releases its numbers unused (the
# protocol allows gaps) and commit order equals sequence order: a reader paging by
# `sequence > after` can never pass a sequence that commits later. SQLite has one writer,
# so the upsert alone serialises appends; the PostgreSQL twin of a send
# (_sql_postgres.send_in_one_statement) holds the head row lock until COMMIT instead.


def _heads_sql(accounts: int) -> str:
    # Each row carries how many records the batch appends to that account, minus one: a new
    # account starts at that value (its first record is sequence 0), an existing head moves
    # up by that many.
    values = ", ".join(["(?, ?)"] * accounts)
    return (
        f"INSERT INTO account_heads (account, head) VALUES {values} "
        "ON CONFLICT (account) DO UPDATE SET head = account_heads.head + excluded.head + 1 "
        "RETURNING account, head"
    )


def _records_sql(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)
    return (
        "INSERT INTO timeline_records (account, sequence, accepted_at, expires_at, "
        f"from_device_id, envelope) VALUES {values}"
    )


def _visibility_sql(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?)"] * rows)
    return (
        "INSERT INTO timeline_visibility (account, device_id, sequence, expires_at, key_box) "
        f"VALUES {values}"
    )


def append(tx: Tx, appends: Sequence[Append]) -> list[int]:
    """Append ``appends`` in order; the sequence each one got.

    Per account, consecutive sequences after its head, in the order given: one multi-row
    head upsert (accounts in order), one multi-row insert each for the records and their
    visibility rows, and a notification per record, whatever the number of appends.
    """
    counts: dict[str, int] = {}
    for item in appends:
        counts[item.account] = counts.get(item.account, 0) + 1
    order = sorted(counts)
    heads: dict[str, int] = {}
    for part in chunks(order):
        rows = tx.all(_heads_sql(len(part)), [x for a in part for x in (a, counts[a] - 1)])
        heads.update((str(a), int(h)) for a, h in rows)
    next_seq = {a: heads[a] - counts[a] + 1 for a in order}
    sequences: list[int] = []
    records: list[tuple[object, ...]] = []
    visibility: list[tuple[object, ...]] = []
    for item in appends:
        a = item.account
        seq = next_seq[a]
        next_seq[a] = seq + 1
        records.append(
            (a, seq, item.accepted_at, item.expires_at, item.from_device_id, item.envelope)
        )
        visibility.extend((a, b.device_id, seq, item.expires_at, b.json) for b in item.boxes)
        tx.notify(TIMELINE_CHANNEL, f"{a} {seq}")
        sequences.append(seq)
    for chunk in chunks(records):
        tx.execute(_records_sql(len(chunk)), flat(chunk))
    for chunk in chunks(visibility):
        tx.execute(_visibility_sql(len(chunk)), flat(chunk))
    return sequences


# The head of an account's timeline: a primary-key lookup (-1 when nothing was appended).
HEAD = "SELECT head FROM account_heads WHERE account = ?"

# A device's page: a range scan of timeline_visibility's primary key (account, device_id,
# sequence), joined to timeline_records by its primary key. Expired rows still waiting for
# cleanup are filtered, never counted.
PAGE = (
    "SELECT v.sequence, r.envelope, v.key_box, r.accepted_at, r.from_device_id "
    "FROM timeline_visibility v JOIN timeline_records r "
    "ON r.account = v.account AND r.sequence = v.sequence "
    "WHERE v.account = ? AND v.device_id = ? AND v.sequence > ? AND v.expires_at > ? "
    "ORDER BY v.sequence LIMIT ?"
)

# Retention gap, cleaned-up part: a primary-key lookup.
EXPIRED_THROUGH = "SELECT expired_through FROM retention_gaps WHERE account = ? AND device_id = ?"

# Retention gap, expired but not yet cleaned up: the (account, device_id, expires_at,
# sequence) index touches only rows already past their deadline.
EXPIRED_WAITING = (
    "SELECT 1 FROM timeline_visibility "
    "WHERE account = ? AND device_id = ? AND expires_at <= ? AND sequence > ? LIMIT 1"
)


def _head(tx: Tx, account: str) -> int:
    row = tx.one(HEAD, (account,))
    return -1 if row is None else int(row[0])


def _has_retention_gap(tx: Tx, account: str, device_id: str, after: int, now: int) -> bool:
    row = tx.one(EXPIRED_THROUGH, (account, device_id))
    if row is not None and int(row[0]) > after:
        return True
    return tx.one(EXPIRED_WAITING, (account, device_id, now, after)) is not None


class Timelines:
    """Reading account timelines. Each method is one backend operation."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def head(self, account: str) -> int:
        return await self.backend.read(lambda tx: _head(tx, account))

    async def sync(
        self, account: str, device_id: str, after: int, limit: int, now: int
    ) -> SyncPage:
        def op(tx: Tx) -> SyncPage:
            head = _head(tx, account)
            if after < -1 or after > head:
                raise RelayFailure("bad_request", f"after must be within -1..{head} (the head)")
            rows = tx.all(PAGE, (account, device_id, after, now, limit + 1))
            has_more = len(rows) > limit
            items = tuple(
                SyncItem(int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]))
                for r in rows[:limit]
            )
            gap = _has_retention_gap(tx, account, device_id, after, now)
            certs = certificates(tx, sorted({i.from_device_id for i in items}))
            return SyncPage(items, certs, has_more, gap)

        return await self.backend.read(op)


# Retention. The expired visibility rows of one cleanup batch (the expires_at index).
EXPIRED_VISIBILITY = (
    "SELECT account, device_id, sequence FROM timeline_visibility WHERE expires_at <= ? LIMIT ?"
)

# Raise a device's expired mark, never lower it: a batch (or a record kept under a longer
# retention) may expire a lower sequence after a higher one. One statement for both
# databases: the upsert's WHERE skips the update when the stored mark is already higher.
RAISE_EXPIRED_THROUGH = (
    "INSERT INTO retention_gaps (account, device_id, expired_through) VALUES (?, ?, ?) "
    "ON CONFLICT (account, device_id) DO UPDATE SET expired_through = excluded.expired_through "
    "WHERE excluded.expired_through > retention_gaps.expired_through"
)


def expire(tx: Tx, now: int, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` expired visibility rows and their records, keeping the gap marks.

    Returns (records, visibility rows) deleted; never touches ``account_heads``.
    """
    rows = tx.all(EXPIRED_VISIBILITY, (now, limit))
    # Several relay processes may clean up at once: every multi-row change below goes in
    # primary-key order, so two cleanups lock rows in the same order and cannot deadlock.
    rows = sorted((str(r[0]), str(r[1]), int(r[2])) for r in rows)
    marks: dict[tuple[str, str], int] = {}
    for account, device_id, seq in rows:
        marks[(account, device_id)] = max(marks.get((account, device_id), -1), seq)
    tx.executemany(RAISE_EXPIRED_THROUGH, [(a, d, s) for (a, d), s in sorted(marks.items())])
    tx.executemany(
        "DELETE FROM timeline_visibility WHERE account = ? AND device_id = ? AND sequence = ?",
        rows,
    )
    # A record is appended only with at least one visibility row, all sharing its deadline,
    # so the expired rows name every expired record (primary-key deletes).
    expired_records = sorted({(r[0], r[2]) for r in rows})
    tx.executemany(
        "DELETE FROM timeline_records WHERE account = ? AND sequence = ?", expired_records
    )
    return len(expired_records), len(rows)
