"""The account message timelines, device state and sessions of one relay, on a storage Backend.

Every rule of the timeline page (seeds/account-message-timeline.md) lives here, in
SQL that runs the same on SQLite and PostgreSQL:

- one sequence per record per account, from ``account_heads`` (the highest ever
  assigned; cleanup never touches it, so restarts and cleanup cannot lower the head);
- device visibility fixed at acceptance: a record gets one ``timeline_visibility``
  row per key-box device valid at that instant, and nothing else ever adds one;
- a delivery whose target devices are all unavailable raises before anything is written;
- each record's deadline is ``accepted_at`` plus the retention in force then, stored with
  the record, so later configuration cannot shorten it;
- ``retention_gaps`` keeps, per device, the highest expired sequence that was visible to
  it, so the gap answer stays exact after cleanup deletes the content.

The store knows nothing of cryptography: callers pass objects already verified.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gapline.relay._errors import RelayFailure
from gapline.relay._schema import MIGRATIONS, SCHEMA
from gapline.storage import Backend, Dialect, IntegrityError, Tx

__all__ = [
    "DEVICE_STATE_CHANNEL",
    "TIMELINE_CHANNEL",
    "AcceptedSend",
    "CleanupReport",
    "DeliveryResult",
    "DeviceEntry",
    "KeyBox",
    "NewSend",
    "NewState",
    "Session",
    "SyncItem",
    "SyncPage",
    "TimelineStore",
]

# Notification channels (Tx.notify): payload "<account> <number>".
TIMELINE_CHANNEL = "meshline_timeline"
DEVICE_STATE_CHANNEL = "meshline_device_state"

_CLEANUP_BATCH = 2000


@dataclass(frozen=True, slots=True)
class KeyBox:
    device_id: str
    json: str  # the MessageKeyBox as received (re-serialised compactly, members sorted)


@dataclass(frozen=True, slots=True)
class NewSend:
    """A verified ``message.send`` request, ready to accept."""

    from_account: str
    to_account: str
    from_device_id: str
    message_id: str
    digest: str  # sha256 of the canonical JSON of the complete params
    envelope: str
    recipient_boxes: tuple[KeyBox, ...]
    sender_boxes: tuple[KeyBox, ...] | None
    retention: int
    now: int
    # Raised instead of accepting, unless the request is a retry of an accepted one.
    refusal: Exception | None = None


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    status: str
    accepted_at: int
    error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "accepted_at": self.accepted_at}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class AcceptedSend:
    result: DeliveryResult
    duplicate: bool
    appended: tuple[tuple[str, int], ...]  # (account, sequence) per timeline record written


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    device_id: str
    not_before: int
    expires_at: int
    certificate: str  # canonical JSON of the DeviceCertificate


@dataclass(frozen=True, slots=True)
class NewState:
    """A verified ``AccountDeviceState``."""

    account: str
    revision: int
    canonical: str
    devices: tuple[DeviceEntry, ...]


@dataclass(frozen=True, slots=True)
class Session:
    account: str
    mode: str  # "device" | "account"
    device_id: str | None
    origin: str
    expires_at: int


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


@dataclass(frozen=True, slots=True)
class CleanupReport:
    records: int
    visibility_rows: int
    sends: int

    @property
    def total(self) -> int:
        return self.records + self.visibility_rows + self.sends


def _greatest(tx: Tx) -> str:
    return "GREATEST" if tx.dialect is Dialect.POSTGRES else "MAX"


# Sequence assignment. One row per account (account_heads) holds the highest sequence ever
# assigned. A send bumps it with an upsert that RETURNs the new value, in the transaction
# that also inserts the record. On PostgreSQL the UPDATE takes the row lock on account_heads
# and holds it until COMMIT, so concurrent senders to one account (from any relay process)
# are serialised: each sees the previous committed head, values are strictly increasing,
# and commit order equals sequence order, so a reader paging by `sequence > after` can never
# pass a sequence that commits later. A rolled-back send releases its number unused (the
# spec allows gaps). SQLite has one writer, so the same statement suffices.
#
# Lock order: a send with sender boxes bumps two heads. Both are bumped by ONE multi-row
# upsert whose rows come in account order (PostgreSQL inserts the rows of INSERT ... SELECT
# ... ORDER BY in that order, locking as it goes), so two opposite sends between the same
# accounts (A->B and B->A, both with sender boxes) cannot deadlock.
#
# Statement budget (the per-send cost is what issue 9 measures; see docs/relay.md):
# - SQLite (in-process, no round trips; each statement is one driver call that drops and
#   re-takes the GIL the event loop needs): sends are accepted in batches, with one device
#   read, one multi-row claim, one multi-row head upsert, one multi-row record insert and
#   one multi-row visibility insert per BATCH (plus one read of stored results when the
#   batch holds retries): 5 statements for up to 64 sends (_accept_sends_sqlite).
# - PostgreSQL (round trips dominate, and the head row lock is held from the head upsert
#   to COMMIT): the whole send is ONE statement (_SEND_POSTGRES), so an operation costs
#   one round trip besides the group-commit savepoint (was three with sender boxes).

_CLAIM_SQL = (
    "INSERT INTO sends (from_account, message_id, digest, status, error, accepted_at,"
    " expires_at) VALUES (?, ?, ?, ?, NULL, ?, ?)"
    " ON CONFLICT (from_account, message_id) DO NOTHING"
)


def _devices_sql(accounts: int) -> str:
    # Covered by the primary key of account_devices (account, device_id); at most 8 rows each.
    marks = ", ".join("?" * accounts)
    return (
        f"SELECT account, device_id FROM account_devices WHERE account IN ({marks})"
        " AND not_before <= ? AND expires_at > ? LIMIT 64"
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


def _send_postgres_sql(accounts: int, boxes: int) -> str:
    """The whole of a send on PostgreSQL, in one statement.

    Data-modifying CTEs all run whatever the outer query reads, on one snapshot:
    ``c`` claims (from, message_id) (a concurrent holder of the same key makes it wait
    for that outcome); ``d`` reads the devices valid now (at acceptance); ``vis`` keeps
    the key boxes of those devices; ``go`` lets the appends happen only when the claim
    is new, no time check refused the request (a parameter) and every timeline to write
    has a visible device; ``h`` bumps the heads (the row locks, in account order);
    ``r`` and ``v`` insert the records and their visibility rows; ``n`` is the
    ``pg_notify`` that ``Tx.notify`` would send (same channel and payload, delivered at
    COMMIT, dropped on rollback). The caller reads what happened from the rows returned
    ('c' claimed, 'd' valid device, 'h' head assigned) and raises when the claim was new
    but nothing was appended, which rolls the claim back with the operation's savepoint.
    """
    account_values = ", ".join(["(?)"] * accounts)
    box_values = ", ".join(["(?, ?, ?)"] * boxes)
    return (
        f"WITH c AS ({_CLAIM_SQL} RETURNING 1), "
        f"d AS ({_devices_sql(accounts)}), "
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


def _duplicate(tx: Tx, send: NewSend) -> AcceptedSend:
    """The stored result of an earlier request with this (from, message_id)."""
    row = tx.one(
        "SELECT digest, status, error, accepted_at FROM sends "
        "WHERE from_account = ? AND message_id = ?",
        (send.from_account, send.message_id),
    )
    assert row is not None
    outcome = _stored_result(send, row)
    if isinstance(outcome, RelayFailure):
        raise outcome
    return outcome


def _plan(send: NewSend, valid: dict[str, set[str]]) -> dict[str, list[KeyBox]]:
    """The visible key boxes per timeline to append to; raises when a target has none.

    Visibility is decided here, once: a box counts only if its device is valid now.
    """
    recipient = [b for b in send.recipient_boxes if b.device_id in valid[send.to_account]]
    if not recipient:
        raise RelayFailure("device_unknown", "no recipient key-box device is currently valid")
    plan = {send.to_account: recipient}
    if send.sender_boxes is not None and send.from_account != send.to_account:
        sender = [b for b in send.sender_boxes if b.device_id in valid[send.from_account]]
        if not sender:
            raise RelayFailure("device_unknown", "no sender key-box device is currently valid")
        plan[send.from_account] = sender
    return plan


def _accounts(send: NewSend) -> tuple[str, ...]:
    """The timelines a send may write to, in lock (account) order."""
    if send.sender_boxes is None or send.from_account == send.to_account:
        return (send.to_account,)
    return tuple(sorted((send.to_account, send.from_account)))


# SQLite accepts sends in batches (Backend.write_batched): the sends queued together run
# as ONE call with a fixed number of multi-row statements, whatever their number. On SQLite
# each statement is a driver call that drops and re-takes the GIL, and under load every
# re-take waits for the busy event loop; with one send per operation the writer spent ~0.35
# ms per send waiting, and it, not the loop, capped the relay (docs/relay.md).
#
# Nothing is written for a send that will not be appended: its outcome (duplicate, refusal,
# no valid device) is decided before the claim, so the batch never has to undo part of
# itself. A (from, message_id) repeated within one batch starts a new run of statements,
# which sees the earlier claim.
_DEVICE_WINDOWS_SQL = (
    "SELECT account, device_id, not_before, expires_at FROM account_devices"
    " WHERE account IN ({marks}) LIMIT ?"
)
# A device state holds at most 8 certificates (DEVICE_STATE_MAX_CERTIFICATES): the LIMIT
# of 64 per account bounds the read without ever cutting a real state short.


def _claim_many_sql(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, NULL, ?, ?)"] * rows)
    return (
        "INSERT INTO sends (from_account, message_id, digest, status, error, accepted_at,"
        f" expires_at) VALUES {values}"
        " ON CONFLICT (from_account, message_id) DO NOTHING RETURNING from_account, message_id"
    )


def _stored_sends_sql(keys: int) -> str:
    # An OR of primary-key equalities: SQLite plans it as one index search per key
    # (a row-value IN over VALUES would scan the table).
    terms = " OR ".join(["(from_account = ? AND message_id = ?)"] * keys)
    return (
        "SELECT from_account, message_id, digest, status, error, accepted_at FROM sends"
        f" WHERE {terms}"
    )


def _heads_many_sql(accounts: int) -> str:
    # Each row carries how many records the batch appends to that account, minus one: a new
    # account starts at that value (its first record is sequence 0), an existing head moves
    # up by that many.
    values = ", ".join(["(?, ?)"] * accounts)
    return (
        f"INSERT INTO account_heads (account, head) VALUES {values} "
        "ON CONFLICT (account) DO UPDATE SET head = account_heads.head + excluded.head + 1 "
        "RETURNING account, head"
    )


_Row = TypeVar("_Row")
_MAX_ROWS = 500  # rows per multi-row statement: far below SQLite's 32,766 parameters


def _chunks(rows: list[_Row]) -> list[list[_Row]]:
    """``rows`` in slices of at most ``_MAX_ROWS``, one multi-row statement each."""
    return [rows[i : i + _MAX_ROWS] for i in range(0, len(rows), _MAX_ROWS)]


def _accept_sends_sqlite(tx: Tx, sends: list[NewSend]) -> list[AcceptedSend | RelayFailure]:
    """The outcome of each send, exactly as if each had been accepted alone in queue order.

    The batch is cut into runs without a repeated (from, message_id), each decided whole
    before the next: a repeat then sees the earlier claim, and sequences follow the queue.
    """
    outcomes: list[AcceptedSend | RelayFailure] = []
    run: list[NewSend] = []
    keys: set[tuple[str, str]] = set()
    for send in sends:
        key = (send.from_account, send.message_id)
        if key in keys:
            outcomes += _accept_run(tx, run)
            run, keys = [], set()
        run.append(send)
        keys.add(key)
    outcomes += _accept_run(tx, run)
    return outcomes


def _accept_run(tx: Tx, sends: list[NewSend]) -> list[AcceptedSend | RelayFailure]:
    """Sends with distinct (from, message_id): a few multi-row statements for all."""
    outcomes: list[AcceptedSend | RelayFailure | None] = [None] * len(sends)

    # Device windows of every account involved; validity is judged per send at its own
    # acceptance instant (send.now).
    accounts = sorted({a for send in sends for a in _accounts(send)})
    windows: dict[str, list[tuple[str, int, int]]] = {a: [] for a in accounts}
    for part in _chunks(accounts):
        sql = _DEVICE_WINDOWS_SQL.format(marks=", ".join("?" * len(part)))
        for account, device_id, not_before, expires_at in tx.all(sql, (*part, 64 * len(part))):
            windows[str(account)].append((str(device_id), int(not_before), int(expires_at)))

    # Decide what each send would do if its key is new.
    plans: dict[int, dict[str, list[KeyBox]]] = {}
    failures: dict[int, RelayFailure] = {}
    for i, send in enumerate(sends):
        if send.refusal is not None:
            failures[i] = _as_failure(send.refusal)
            continue
        valid = {
            a: {d for d, nb, exp in windows[a] if nb <= send.now < exp} for a in _accounts(send)
        }
        try:
            plans[i] = _plan(send, valid)
        except RelayFailure as failure:
            failures[i] = failure

    # Claim the keys of the sends that will be appended; a key already taken is a retry.
    claimed: set[tuple[str, str]] = set()
    claim_rows = [
        (s.from_account, s.message_id, s.digest, "target_accepted", s.now, s.now + s.retention)
        for s in (sends[i] for i in plans)
    ]
    for chunk in _chunks(claim_rows):
        rows = tx.all(_claim_many_sql(len(chunk)), [x for row in chunk for x in row])
        claimed.update((str(a), str(m)) for a, m in rows)
    retries = [i for i, s in enumerate(sends) if (s.from_account, s.message_id) not in claimed]
    stored: dict[tuple[str, str], tuple[Any, ...]] = {}
    for part in _chunks(retries):
        params = [x for i in part for x in (sends[i].from_account, sends[i].message_id)]
        for row in tx.all(_stored_sends_sql(len(part)), params):
            stored[(str(row[0]), str(row[1]))] = row[2:]
    for i in retries:
        row = stored.get((sends[i].from_account, sends[i].message_id))
        if row is not None:
            outcomes[i] = _stored_result(sends[i], row)
        else:  # a new key that is not appended: its refusal or device failure
            outcomes[i] = failures[i]

    # Sequences: per account, consecutive numbers in batch order after the current head.
    appending = [i for i in plans if outcomes[i] is None]
    counts: dict[str, int] = {}
    for i in appending:
        for a in plans[i]:
            counts[a] = counts.get(a, 0) + 1
    order = sorted(counts)
    heads: dict[str, int] = {}
    for part in _chunks(order):
        rows = tx.all(_heads_many_sql(len(part)), [x for a in part for x in (a, counts[a] - 1)])
        heads.update((str(a), int(h)) for a, h in rows)
    next_seq = {a: heads[a] - counts[a] + 1 for a in order}
    records: list[tuple[Any, ...]] = []
    visibility: list[tuple[Any, ...]] = []
    for i in appending:
        send = sends[i]
        expires_at = send.now + send.retention
        appended: list[tuple[str, int]] = []
        for a in sorted(plans[i]):
            seq = next_seq[a]
            next_seq[a] = seq + 1
            records.append((a, seq, send.now, expires_at, send.from_device_id, send.envelope))
            visibility.extend((a, b.device_id, seq, expires_at, b.json) for b in plans[i][a])
            tx.notify(TIMELINE_CHANNEL, f"{a} {seq}")
            appended.append((a, seq))
        outcomes[i] = AcceptedSend(
            DeliveryResult("target_accepted", send.now), False, tuple(appended)
        )
    for chunk in _chunks(records):
        tx.execute(_records_sql(len(chunk)), [x for row in chunk for x in row])
    for chunk in _chunks(visibility):
        tx.execute(_visibility_sql(len(chunk)), [x for row in chunk for x in row])

    # Every send is now decided: a retry or failure above, or appended here.
    decided = [o for o in outcomes if o is not None]
    assert len(decided) == len(sends), "a send in the batch was left without an outcome"
    return decided


def _as_failure(exc: Exception) -> RelayFailure:
    if isinstance(exc, RelayFailure):
        return exc
    raise exc  # not a relay outcome: a bug, rolled back with the batch


def _stored_result(send: NewSend, row: tuple[Any, ...]) -> AcceptedSend | RelayFailure:
    """A retry's answer from the stored (digest, status, error, accepted_at)."""
    digest, status, error, accepted_at = row
    if digest != send.digest:
        return RelayFailure(
            "state_conflict",
            "this (from, message_id) was accepted with different request content",
        )
    return AcceptedSend(
        DeliveryResult(status, int(accepted_at), json.loads(error) if error else None), True, ()
    )


def _accept_send_postgres(tx: Tx, send: NewSend) -> AcceptedSend:
    expires_at = send.now + send.retention
    accounts = _accounts(send)
    boxes = [(send.to_account, b) for b in send.recipient_boxes]
    if len(accounts) == 2 and send.sender_boxes is not None:
        boxes += [(send.from_account, b) for b in send.sender_boxes]
    rows = tx.all(
        _send_postgres_sql(len(accounts), len(boxes)),
        (
            send.from_account,
            send.message_id,
            send.digest,
            "target_accepted",
            send.now,
            expires_at,
            *accounts,
            send.now,
            send.now,
            *(x for a, b in boxes for x in (a, b.device_id, b.json)),
            send.refusal is None,
            len(accounts),
            *accounts,
            send.now,
            expires_at,
            send.from_device_id,
            send.envelope,
            expires_at,
            TIMELINE_CHANNEL,
        ),
    )
    if not any(r[0] == "c" for r in rows):
        return _duplicate(tx, send)
    heads = {str(r[1]): int(r[3]) for r in rows if r[0] == "h"}
    if not heads:
        # Claimed, but refused or no visible device: raise (the savepoint drops the claim).
        if send.refusal is not None:
            raise send.refusal
        valid: dict[str, set[str]] = {a: set() for a in accounts}
        for r in rows:
            if r[0] == "d":
                valid[str(r[1])].add(str(r[2]))
        _plan(send, valid)  # raises device_unknown for the timeline without a device
        raise AssertionError("a valid send appended nothing")
    appended = tuple(sorted(heads.items()))
    return AcceptedSend(DeliveryResult("target_accepted", send.now), False, appended)


class TimelineStore:
    """The relay's durable state. Methods are awaitable; each is one backend operation."""

    def __init__(self, backend: Backend, clock: Callable[[], int]) -> None:
        self.backend = backend
        self.clock = clock

    async def migrate(self) -> None:
        await self.backend.migrate(SCHEMA, MIGRATIONS)

    # -- relay key ---------------------------------------------------------------------

    async def meta_get_or_set(self, name: str, value: str) -> str:
        """The stored value of ``name``, storing ``value`` first if there is none (race-safe)."""

        def op(tx: Tx) -> str:
            tx.execute(
                "INSERT INTO relay_meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                (name, value),
            )
            row = tx.one("SELECT value FROM relay_meta WHERE name = ?", (name,))
            assert row is not None
            return str(row[0])

        return await self.backend.write(op)

    # -- device state ------------------------------------------------------------------

    async def publish_state(self, state: NewState) -> bool:
        """Accept ``state`` as authoritative. True when it is new (not an identical repeat).

        Raises ``stale_state`` for a lower revision and ``state_conflict`` for an equal
        revision with different canonical content. Device sessions of devices that left
        the state are deleted in the same transaction.
        """

        def op(tx: Tx) -> bool:
            cur = tx.one(
                "SELECT revision, canonical FROM device_states WHERE account = ?"
                + (" FOR UPDATE" if tx.dialect is Dialect.POSTGRES else ""),
                (state.account,),
            )
            if cur is not None:
                if state.revision < int(cur[0]):
                    raise RelayFailure("stale_state", "a higher revision is already accepted")
                if state.revision == int(cur[0]):
                    if state.canonical == cur[1]:
                        return False
                    raise RelayFailure(
                        "state_conflict", "this revision was accepted with different content"
                    )
                tx.execute(
                    "UPDATE device_states SET revision = ?, canonical = ? WHERE account = ?",
                    (state.revision, state.canonical, state.account),
                )
            else:
                tx.execute(
                    "INSERT INTO device_states (account, revision, canonical) VALUES (?, ?, ?)",
                    (state.account, state.revision, state.canonical),
                )
            tx.execute("DELETE FROM account_devices WHERE account = ?", (state.account,))
            tx.executemany(
                "INSERT INTO account_devices (account, device_id, not_before, expires_at) "
                "VALUES (?, ?, ?, ?)",
                [(state.account, d.device_id, d.not_before, d.expires_at) for d in state.devices],
            )
            for d in state.devices:
                tx.execute(
                    "INSERT INTO device_certificates (device_id, account, certificate) "
                    "VALUES (?, ?, ?) ON CONFLICT (device_id) DO UPDATE SET "
                    "certificate = excluded.certificate, account = excluded.account",
                    (d.device_id, state.account, d.certificate),
                )
            keep = [d.device_id for d in state.devices]
            marks = ",".join("?" * len(keep))
            tx.execute(
                "DELETE FROM sessions WHERE account = ? AND mode = 'device'"
                + (f" AND device_id NOT IN ({marks})" if keep else ""),
                (state.account, *keep),
            )
            tx.notify(DEVICE_STATE_CHANNEL, f"{state.account} {state.revision}")
            return True

        try:
            return await self.backend.write(op)
        except IntegrityError as exc:  # a concurrent first publish for the same account
            raise RelayFailure("state_conflict", "concurrent device state publish") from exc

    async def resolve_state(self, account: str) -> str | None:
        def op(tx: Tx) -> str | None:
            row = tx.one("SELECT canonical FROM device_states WHERE account = ?", (account,))
            return None if row is None else str(row[0])

        return await self.backend.read(op)

    async def device_window(self, account: str, device_id: str) -> tuple[int, int] | None:
        """(not_before, expires_at) of ``device_id`` in ``account``'s current state, if present."""

        def op(tx: Tx) -> tuple[int, int] | None:
            row = tx.one(
                "SELECT not_before, expires_at FROM account_devices "
                "WHERE account = ? AND device_id = ?",
                (account, device_id),
            )
            return None if row is None else (int(row[0]), int(row[1]))

        return await self.backend.read(op)

    async def certificate(self, device_id: str) -> str | None:
        def op(tx: Tx) -> str | None:
            row = tx.one(
                "SELECT certificate FROM device_certificates WHERE device_id = ?", (device_id,)
            )
            return None if row is None else str(row[0])

        return await self.backend.read(op)

    # -- challenges and sessions -------------------------------------------------------

    async def add_challenge(self, nonce: str, account: str, expires_at: int) -> None:
        def op(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO auth_challenges (nonce, account, expires_at) VALUES (?, ?, ?)",
                (nonce, account, expires_at),
            )

        await self.backend.write(op)

    async def consume_challenge(self, nonce: str) -> tuple[str, int] | None:
        """(account, expires_at) of ``nonce``, deleting it: a nonce is consumed on first use."""

        def op(tx: Tx) -> tuple[str, int] | None:
            row = tx.one(
                "DELETE FROM auth_challenges WHERE nonce = ? RETURNING account, expires_at",
                (nonce,),
            )
            return None if row is None else (str(row[0]), int(row[1]))

        return await self.backend.write(op)

    async def add_session(self, token_hash: str, session: Session) -> None:
        def op(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO sessions (token_hash, account, mode, device_id, origin, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    token_hash,
                    session.account,
                    session.mode,
                    session.device_id,
                    session.origin,
                    session.expires_at,
                ),
            )

        await self.backend.write(op)

    async def get_session(self, token_hash: str) -> Session | None:
        def op(tx: Tx) -> Session | None:
            row = tx.one(
                "SELECT account, mode, device_id, origin, expires_at FROM sessions "
                "WHERE token_hash = ?",
                (token_hash,),
            )
            if row is None:
                return None
            return Session(str(row[0]), str(row[1]), row[2], str(row[3]), int(row[4]))

        return await self.backend.read(op)

    # -- messages ----------------------------------------------------------------------

    async def accept_send(self, send: NewSend) -> AcceptedSend:
        if self.backend.dialect is Dialect.SQLITE:
            return await self.backend.write_batched(_accept_sends_sqlite, send)
        try:
            return await self.backend.write(lambda tx: _accept_send_postgres(tx, send))
        except IntegrityError:
            # A concurrent identical key won the race between our claim and its commit on a
            # backend that reports it as a constraint error: read the winner's result.
            return await self.backend.write(lambda tx: _accept_send_postgres(tx, send))

    async def delivery_status(self, from_account: str, message_id: str, now: int) -> DeliveryResult:
        def op(tx: Tx) -> DeliveryResult:
            # Primary-key lookup on sends.
            row = tx.one(
                "SELECT status, error, accepted_at, expires_at FROM sends "
                "WHERE from_account = ? AND message_id = ?",
                (from_account, message_id),
            )
            if row is None:
                raise RelayFailure("not_found", "no message.send result for this message_id")
            if int(row[3]) <= now:
                raise RelayFailure("message_expired", "the result retention period has ended")
            return DeliveryResult(str(row[0]), int(row[2]), json.loads(row[1]) if row[1] else None)

        return await self.backend.read(op)

    async def head(self, account: str) -> int:
        def op(tx: Tx) -> int:
            row = tx.one("SELECT head FROM account_heads WHERE account = ?", (account,))
            return -1 if row is None else int(row[0])

        return await self.backend.read(op)

    async def sync(
        self, account: str, device_id: str, after: int, limit: int, now: int
    ) -> SyncPage:
        def op(tx: Tx) -> SyncPage:
            row = tx.one("SELECT head FROM account_heads WHERE account = ?", (account,))
            head = -1 if row is None else int(row[0])
            if after < -1 or after > head:
                raise RelayFailure("bad_request", f"after must be within -1..{head} (the head)")
            # The page: a range scan of timeline_visibility's primary key
            # (account, device_id, sequence), joined to timeline_records by its primary key.
            # Expired rows still waiting for cleanup are filtered, never counted.
            rows = tx.all(
                "SELECT v.sequence, r.envelope, v.key_box, r.accepted_at, r.from_device_id "
                "FROM timeline_visibility v JOIN timeline_records r "
                "ON r.account = v.account AND r.sequence = v.sequence "
                "WHERE v.account = ? AND v.device_id = ? AND v.sequence > ? AND v.expires_at > ? "
                "ORDER BY v.sequence LIMIT ?",
                (account, device_id, after, now, limit + 1),
            )
            has_more = len(rows) > limit
            items = tuple(
                SyncItem(int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]))
                for r in rows[:limit]
            )
            gap = _has_retention_gap(tx, account, device_id, after, now)
            senders = sorted({i.from_device_id for i in items})
            certs: tuple[str, ...] = ()
            if senders:
                marks = ",".join("?" * len(senders))
                certs = tuple(
                    str(r[0])
                    for r in tx.all(
                        f"SELECT certificate FROM device_certificates WHERE device_id IN ({marks})",
                        senders,
                    )
                )
            return SyncPage(items, certs, has_more, gap)

        return await self.backend.read(op)

    # -- retention ---------------------------------------------------------------------

    async def cleanup(self, now: int) -> CleanupReport:
        """Remove expired content in bounded batches; never touches ``account_heads``."""
        total = CleanupReport(0, 0, 0)
        while True:
            report = await self.backend.write(lambda tx: _cleanup_batch(tx, now))
            total = CleanupReport(
                total.records + report.records,
                total.visibility_rows + report.visibility_rows,
                total.sends + report.sends,
            )
            if report.total == 0:
                return total


def _has_retention_gap(tx: Tx, account: str, device_id: str, after: int, now: int) -> bool:
    # Cleaned-up part: a primary-key lookup.
    row = tx.one(
        "SELECT expired_through FROM retention_gaps WHERE account = ? AND device_id = ?",
        (account, device_id),
    )
    if row is not None and int(row[0]) > after:
        return True
    # Expired but not yet cleaned up: the (account, device_id, expires_at, sequence) index
    # touches only rows already past their deadline.
    row = tx.one(
        "SELECT 1 FROM timeline_visibility "
        "WHERE account = ? AND device_id = ? AND expires_at <= ? AND sequence > ? LIMIT 1",
        (account, device_id, now, after),
    )
    return row is not None


def _cleanup_batch(tx: Tx, now: int) -> CleanupReport:
    rows = tx.all(
        "SELECT account, device_id, sequence FROM timeline_visibility "
        "WHERE expires_at <= ? LIMIT ?",
        (now, _CLEANUP_BATCH),
    )
    # Several relay processes may clean up at once: every multi-row change below goes in
    # primary-key order, so two cleanups lock rows in the same order and cannot deadlock.
    rows = sorted((str(r[0]), str(r[1]), int(r[2])) for r in rows)
    marks: dict[tuple[str, str], int] = {}
    for account, device_id, seq in rows:
        marks[(account, device_id)] = max(marks.get((account, device_id), -1), seq)
    greatest = _greatest(tx)
    tx.executemany(
        "INSERT INTO retention_gaps (account, device_id, expired_through) VALUES (?, ?, ?) "
        "ON CONFLICT (account, device_id) DO UPDATE SET expired_through = "
        f"{greatest}(retention_gaps.expired_through, excluded.expired_through)",
        [(a, d, s) for (a, d), s in sorted(marks.items())],
    )
    tx.executemany(
        "DELETE FROM timeline_visibility WHERE account = ? AND device_id = ? AND sequence = ?",
        [(r[0], r[1], r[2]) for r in rows],
    )
    # A record is appended only with at least one visibility row, all sharing its deadline,
    # so the expired rows name every expired record (primary-key deletes).
    expired_records = sorted({(r[0], r[2]) for r in rows})
    tx.executemany(
        "DELETE FROM timeline_records WHERE account = ? AND sequence = ?", expired_records
    )
    records = len(expired_records)
    sends = tx.execute(
        "DELETE FROM sends WHERE (from_account, message_id) IN ("
        "SELECT from_account, message_id FROM sends WHERE expires_at <= ? LIMIT ?)",
        (now, _CLEANUP_BATCH),
    )
    tx.execute("DELETE FROM auth_challenges WHERE expires_at <= ?", (now,))
    tx.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
    return CleanupReport(records, len(rows), max(sends, 0))
