"""Sends: accepting ``message.send`` requests, and the result kept for each one.

A send is keyed on (from, message_id). The first request with a key claims it and gets
its records appended; a retry with the same content gets the stored result and appends
nothing, one with other content is a ``state_conflict``. A send whose target devices are
all unavailable (none valid at acceptance) raises before anything is written, so a later
retry is new. Time checks (``NewSend.refusal``) refuse only new requests.

Two paths, one rule: ``accept_batch`` (generic SQL, used on SQLite, where it accepts many
sends per transaction) and the one-statement send of ``_sql_postgres`` (PostgreSQL).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gapline.relay._errors import RelayFailure
from gapline.relay._store import _sql_postgres
from gapline.relay._store._accounts import device_windows
from gapline.relay._store._rows import chunks, flat
from gapline.relay._store._timeline import TIMELINE_CHANNEL, Append, KeyBox, append
from gapline.storage import Backend, Dialect, IntegrityError, Tx

__all__ = [
    "AcceptedSend",
    "DeliveryResult",
    "NewSend",
    "Sends",
    "accept_batch",
    "expire",
]

ACCEPTED = "target_accepted"  # the delivery status of every send this relay accepts


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


def _timelines(send: NewSend) -> tuple[str, ...]:
    """The timelines a send may write to, in lock (account) order."""
    if send.sender_boxes is None or send.from_account == send.to_account:
        return (send.to_account,)
    return tuple(sorted((send.to_account, send.from_account)))


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


def _as_failure(exc: Exception) -> RelayFailure:
    if isinstance(exc, RelayFailure):
        return exc
    raise exc  # not a relay outcome: a bug, rolled back with the batch


def _stored_sql(keys: int) -> str:
    # An OR of primary-key equalities: SQLite plans it as one index search per key
    # (a row-value IN over VALUES would scan the table).
    terms = " OR ".join(["(from_account = ? AND message_id = ?)"] * keys)
    return (
        "SELECT from_account, message_id, digest, status, error, accepted_at FROM sends"
        f" WHERE {terms}"
    )


def _stored(tx: Tx, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    """(digest, status, error, accepted_at) of each stored (from, message_id) of ``keys``."""
    stored: dict[tuple[str, str], tuple[Any, ...]] = {}
    for part in chunks(keys):
        for row in tx.all(_stored_sql(len(part)), flat(part)):
            stored[(str(row[0]), str(row[1]))] = row[2:]
    return stored


def _claim_sql(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, NULL, ?, ?)"] * rows)
    return (
        "INSERT INTO sends (from_account, message_id, digest, status, error, accepted_at,"
        f" expires_at) VALUES {values}"
        " ON CONFLICT (from_account, message_id) DO NOTHING RETURNING from_account, message_id"
    )


# The generic path. SQLite accepts sends in batches (Backend.write_batched): the sends
# queued together run as ONE call with a fixed number of multi-row statements, whatever
# their number: one device read, one multi-row claim, one multi-row head upsert, one
# multi-row record insert and one multi-row visibility insert per batch (plus one read of
# stored results when the batch holds retries): 5 statements for up to 64 sends. On SQLite
# each statement is a driver call that drops and re-takes the GIL, and under load every
# re-take waits for the busy event loop; with one send per operation the writer spent ~0.35
# ms per send waiting, and it, not the loop, capped the relay (docs/relay.md).
#
# Nothing is written for a send that will not be appended: its outcome (duplicate, refusal,
# no valid device) is decided before the claim, so the batch never has to undo part of
# itself. A (from, message_id) repeated within one batch starts a new run of statements,
# which sees the earlier claim. Twin: _sql_postgres.send_in_one_statement.


def accept_batch(tx: Tx, sends: list[NewSend]) -> list[AcceptedSend | RelayFailure]:
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
    windows = device_windows(tx, sorted({a for send in sends for a in _timelines(send)}))

    # Decide what each send would do if its key is new.
    plans: dict[int, dict[str, list[KeyBox]]] = {}
    failures: dict[int, RelayFailure] = {}
    for i, send in enumerate(sends):
        if send.refusal is not None:
            failures[i] = _as_failure(send.refusal)
            continue
        valid = {
            a: {d for d, nb, exp in windows[a] if nb <= send.now < exp} for a in _timelines(send)
        }
        try:
            plans[i] = _plan(send, valid)
        except RelayFailure as failure:
            failures[i] = failure

    # Claim the keys of the sends that will be appended; a key already taken is a retry.
    claimed: set[tuple[str, str]] = set()
    claim_rows = [
        (s.from_account, s.message_id, s.digest, ACCEPTED, s.now, s.now + s.retention)
        for s in (sends[i] for i in plans)
    ]
    for chunk in chunks(claim_rows):
        rows = tx.all(_claim_sql(len(chunk)), flat(chunk))
        claimed.update((str(a), str(m)) for a, m in rows)
    retries = [i for i, s in enumerate(sends) if (s.from_account, s.message_id) not in claimed]
    stored = _stored(tx, [(sends[i].from_account, sends[i].message_id) for i in retries])
    for i in retries:
        row = stored.get((sends[i].from_account, sends[i].message_id))
        if row is not None:
            outcomes[i] = _stored_result(sends[i], row)
        else:  # a new key that is not appended: its refusal or device failure
            outcomes[i] = failures[i]

    # Append, in batch order: each send's records in account order.
    appending = [(i, sorted(plans[i])) for i in plans if outcomes[i] is None]
    appends: list[Append] = []
    for i, timelines in appending:
        send, plan = sends[i], plans[i]
        expires_at = send.now + send.retention
        for a in timelines:
            appends.append(
                Append(a, send.now, expires_at, send.from_device_id, send.envelope, plan[a])
            )
    sequences = iter(append(tx, appends))
    for i, timelines in appending:
        appended = tuple((a, next(sequences)) for a in timelines)
        outcomes[i] = AcceptedSend(DeliveryResult(ACCEPTED, sends[i].now), False, appended)

    # Every send is now decided: a retry or failure above, or appended here.
    decided = [o for o in outcomes if o is not None]
    assert len(decided) == len(sends), "a send in the batch was left without an outcome"
    return decided


def _accept_one_postgres(tx: Tx, send: NewSend) -> AcceptedSend:
    """A send on PostgreSQL: one statement (its twin is ``accept_batch``)."""
    timelines = _timelines(send)
    boxes = [(send.to_account, b.device_id, b.json) for b in send.recipient_boxes]
    if len(timelines) == 2 and send.sender_boxes is not None:
        boxes += [(send.from_account, b.device_id, b.json) for b in send.sender_boxes]
    sql, params = _sql_postgres.send_in_one_statement(
        from_account=send.from_account,
        message_id=send.message_id,
        digest=send.digest,
        status=ACCEPTED,
        accepted_at=send.now,
        expires_at=send.now + send.retention,
        from_device_id=send.from_device_id,
        envelope=send.envelope,
        accounts=timelines,
        boxes=boxes,
        allowed=send.refusal is None,
        channel=TIMELINE_CHANNEL,
    )
    rows = tx.all(sql, params)
    if not any(r[0] == "c" for r in rows):
        # The key was taken: the stored result of that earlier request.
        key = (send.from_account, send.message_id)
        outcome = _stored_result(send, _stored(tx, [key])[key])
        if isinstance(outcome, RelayFailure):
            raise outcome
        return outcome
    heads = {str(r[1]): int(r[3]) for r in rows if r[0] == "h"}
    if not heads:
        # Claimed, but refused or no visible device: raise (the savepoint drops the claim).
        if send.refusal is not None:
            raise send.refusal
        valid: dict[str, set[str]] = {a: set() for a in timelines}
        for r in rows:
            if r[0] == "d":
                valid[str(r[1])].add(str(r[2]))
        _plan(send, valid)  # raises device_unknown for the timeline without a device
        raise AssertionError("a valid send appended nothing")
    appended = tuple(sorted(heads.items()))
    return AcceptedSend(DeliveryResult(ACCEPTED, send.now), False, appended)


def expire(tx: Tx, now: int, limit: int) -> int:
    """Delete up to ``limit`` send results past their deadline; how many went."""
    deleted = tx.execute(
        "DELETE FROM sends WHERE (from_account, message_id) IN ("
        "SELECT from_account, message_id FROM sends WHERE expires_at <= ? LIMIT ?)",
        (now, limit),
    )
    return max(deleted, 0)


class Sends:
    """Accepting sends and answering for them. Each method is one backend operation."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def accept(self, send: NewSend) -> AcceptedSend:
        if self.backend.dialect is Dialect.SQLITE:
            return await self.backend.write_batched(accept_batch, send)
        try:
            return await self.backend.write(lambda tx: _accept_one_postgres(tx, send))
        except IntegrityError:
            # A concurrent identical key won the race between our claim and its commit on a
            # backend that reports it as a constraint error: read the winner's result.
            return await self.backend.write(lambda tx: _accept_one_postgres(tx, send))

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
