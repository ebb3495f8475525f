"""Turns and the deterministic outbox.

- The handler's completed result is durable in the turn before the final enqueue, so
  recovery never reruns a completed call merely to rebuild what it delivers.
- Transaction ids are derived from (principal, delivery id, stage), so a retry after a
  crash reuses the id and the homeserver collapses it onto the same event.
- ``enqueue`` creates a row or updates an unattempted one; it refuses a turn admitted
  under an older membership epoch; with ``settle_source`` it settles the turn's source
  in the same transaction: the journal owns an event until its answer is durably
  handed off, so no turn is delivered while its source is pending, or settled with
  nothing owing it.
- ``claim`` commits ``attempted`` before any network I/O and returns the exact stored
  row, so an older deterministic transaction Matrix may already have accepted can never
  be followed by different content under the same id.
- ``acknowledge`` commits the acknowledgement and the turn record together; the loser
  of a race writes neither, so the outbox and the turn record never name different events.
  An approval card's row (purpose ``approval_card``) records the card's event id in
  ``approval_cards`` instead: the card's transport state is here, its call is there.
"""

from __future__ import annotations

import hashlib

from gapline.journal._epochs import current_epoch
from gapline.journal._locks import lock_room
from gapline.journal._sql_postgres import CLAIM_DELIVERIES_FOR_UPDATE
from gapline.journal._types import (
    AckOutcome,
    Delivery,
    DeliveryPurpose,
    DeliveryRequest,
    DeliveryStage,
    EnqueueOutcome,
    TurnNotCompleted,
    TurnRecord,
    TurnState,
    UnknownEvent,
    UnknownTurn,
    decode_thread_id,
    encode_thread_id,
)
from gapline.storage import Dialect, Tx

__all__ = [
    "CLAIM_DELIVERIES",
    "DELIVERY_COLUMNS",
    "ENCRYPTED_EVENT_TYPE",
    "acknowledge",
    "begin_turn",
    "channel",
    "claim",
    "enqueue",
    "load_turn",
    "record_result",
    "seal_delivery",
    "transaction_id",
    "write_delivery",
]


def channel(kind: str, principal_id: str) -> str:
    """The notification channel of one principal's ``kind`` of wake-ups (``pending``,
    ``outbox``). PostgreSQL channel names are identifiers of at most 63 bytes, which an
    MXID is not, hence the digest."""
    return f"gl_journal_{kind}_{hashlib.sha256(principal_id.encode()).hexdigest()[:24]}"


def transaction_id(principal_id: str, delivery_id: str, stage: DeliveryStage) -> str:
    """Deterministic Matrix transaction id for one delivery stage (pure)."""
    digest = hashlib.sha256(
        "\x1f".join((principal_id, delivery_id, stage.value)).encode("utf-8")
    ).hexdigest()
    return f"gl{digest[:40]}"


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else bytes(content)


_TURN_COLUMNS = (
    "turn_id, room_id, thread_id, source_event_id, epoch, state, result,"
    " initial_event_id, final_event_id"
)


def _turn(row: tuple) -> TurnRecord:
    return TurnRecord(
        turn_id=row[0],
        room_id=row[1],
        thread_id=decode_thread_id(row[2]),
        source_event_id=row[3],
        epoch=int(row[4]),
        state=TurnState(row[5]),
        result=None if row[6] is None else bytes(row[6]),
        initial_event_id=row[7],
        final_event_id=row[8],
    )


def load_turn(tx: Tx, p: str, turn_id: str) -> TurnRecord | None:
    row = tx.one(
        f"SELECT {_TURN_COLUMNS} FROM journal_turns WHERE principal_id = ? AND turn_id = ?",
        (p, turn_id),
    )
    return None if row is None else _turn(row)


def begin_turn(tx: Tx, p: str, source_event_id: str) -> TurnRecord:
    """Open (idempotently) the turn answering ``source_event_id``; its id is the source's."""
    source = tx.one(
        "SELECT room_id, thread_id, epoch FROM journal_events WHERE principal_id = ? AND event_id = ?",
        (p, source_event_id),
    )
    if source is None:
        raise UnknownEvent(source_event_id)
    tx.execute(
        "INSERT INTO journal_turns (principal_id, turn_id, room_id, thread_id, source_event_id,"
        " epoch, state) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (
            p,
            source_event_id,
            source[0],
            source[1],
            source_event_id,
            source[2],
            TurnState.OPEN.value,
        ),
    )
    turn = load_turn(tx, p, source_event_id)
    assert turn is not None
    return turn


def record_result(tx: Tx, p: str, turn_id: str, result: bytes) -> TurnRecord:
    """Make the handler result durable. The first result recorded wins: a rerun after a
    crash must deliver what the completed call produced, not a second answer."""
    tx.execute(
        "UPDATE journal_turns SET result = ?, state = ? WHERE principal_id = ? AND turn_id = ?"
        " AND state = ?",
        (bytes(result), TurnState.COMPLETED.value, p, turn_id, TurnState.OPEN.value),
    )
    turn = load_turn(tx, p, turn_id)
    if turn is None:
        raise UnknownTurn(turn_id)
    return turn


def enqueue(
    tx: Tx, p: str, request: DeliveryRequest, settle_source: bool, outbox_channel: str
) -> EnqueueOutcome:
    """Write the delivery row; a created or updated row wakes the delivery worker."""
    turn = load_turn(tx, p, request.turn_id)
    if turn is None:
        raise UnknownTurn(request.turn_id)
    if request.room_id != turn.room_id:
        raise ValueError(f"turn {turn.turn_id} belongs to {turn.room_id}, not {request.room_id}")
    lock_room(tx, p, turn.room_id, exclusive=False)
    if current_epoch(tx, p, turn.room_id) != turn.epoch:
        return EnqueueOutcome.STALE_EPOCH
    if request.stage is DeliveryStage.FINAL and turn.state is TurnState.OPEN:
        raise TurnNotCompleted(turn.turn_id)
    outcome = write_delivery(
        tx,
        p,
        delivery_id=request.delivery_id,
        stage=request.stage,
        turn_id=turn.turn_id,
        room_id=request.room_id,
        thread=encode_thread_id(request.thread_id),
        event_type=request.event_type,
        content=_as_bytes(request.content),
        purpose=DeliveryPurpose.ANSWER,
        outbox_channel=outbox_channel,
    )
    if settle_source:
        tx.execute(
            "UPDATE journal_events SET settled = 1, source = NULL, consumer = NULL"
            " WHERE principal_id = ? AND event_id = ? AND settled = 0",
            (p, turn.source_event_id),
        )
    return outcome


def write_delivery(
    tx: Tx,
    p: str,
    *,
    delivery_id: str,
    stage: DeliveryStage,
    turn_id: str,
    room_id: str,
    thread: str,
    event_type: str,
    content: bytes,
    purpose: DeliveryPurpose,
    outbox_channel: str,
) -> EnqueueOutcome:
    """Create the row, or update it while unattempted; an attempted row keeps its frozen
    payload and transaction id. A created or updated row wakes the delivery worker.
    The caller has checked the membership epoch. (Approval cards write through here too.)
    """
    created = tx.one(
        "INSERT INTO journal_outbox (principal_id, delivery_id, stage, turn_id, room_id, thread_id,"
        " event_type, content, txn_id, purpose) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (principal_id, delivery_id, stage) DO NOTHING RETURNING seq",
        (
            p,
            delivery_id,
            stage.value,
            turn_id,
            room_id,
            thread,
            event_type,
            content,
            transaction_id(p, delivery_id, stage),
            purpose.value,
        ),
    )
    if created is not None:
        outcome = EnqueueOutcome.CREATED
    elif (
        tx.execute(
            "UPDATE journal_outbox SET content = ?, thread_id = ?, event_type = ?"
            " WHERE principal_id = ? AND delivery_id = ? AND stage = ? AND attempted = 0"
            " AND acked_event_id IS NULL",
            (content, thread, event_type, p, delivery_id, stage.value),
        )
        == 1
    ):
        outcome = EnqueueOutcome.UPDATED
    else:
        row = tx.one(
            "SELECT acked_event_id FROM journal_outbox"
            " WHERE principal_id = ? AND delivery_id = ? AND stage = ?",
            (p, delivery_id, stage.value),
        )
        outcome = (
            EnqueueOutcome.ACKNOWLEDGED
            if row is not None and row[0] is not None
            else EnqueueOutcome.FROZEN
        )
    if outcome in (EnqueueOutcome.CREATED, EnqueueOutcome.UPDATED):
        tx.notify(outbox_channel, delivery_id)
    return outcome


DELIVERY_COLUMNS = (
    "seq, turn_id, delivery_id, stage, room_id, thread_id, event_type, content, txn_id,"
    " attempted, purpose"
)
"""What ``claim`` returns of a row, in :func:`_delivery`'s order (both claim twins)."""


def _delivery(row: tuple) -> Delivery:
    return Delivery(
        seq=int(row[0]),
        turn_id=row[1],
        delivery_id=row[2],
        stage=DeliveryStage(row[3]),
        room_id=row[4],
        thread_id=decode_thread_id(row[5]),
        event_type=row[6],
        content=bytes(row[7]),
        txn_id=row[8],
        attempted=bool(row[9]),
        purpose=DeliveryPurpose(row[10]),
    )


CLAIM_DELIVERIES = (
    "UPDATE journal_outbox SET attempted = 1 WHERE seq IN ("
    " SELECT seq FROM journal_outbox WHERE principal_id = ? AND acked_event_id IS NULL"
    f" ORDER BY seq LIMIT ?) RETURNING {DELIVERY_COLUMNS}"
)
"""Mark the oldest unacknowledged rows attempted and return them as stored. PostgreSQL
twin: ``_sql_postgres.CLAIM_DELIVERIES_FOR_UPDATE`` (the same claim, locking its rows)."""


def claim(tx: Tx, p: str, limit: int) -> tuple[Delivery, ...]:
    """Commit ``attempted`` on the oldest unacknowledged rows and return them as stored.

    One statement, so a concurrent fence on PostgreSQL either deletes a row before this
    locks it (the row is not returned) or finds it attempted (the row survives).
    """
    sql = CLAIM_DELIVERIES_FOR_UPDATE if tx.dialect is Dialect.POSTGRES else CLAIM_DELIVERIES
    rows = tx.all(sql, (p, limit))
    return tuple(sorted((_delivery(r) for r in rows), key=lambda d: d.seq))


def acknowledge(tx: Tx, p: str, delivery: Delivery, event_id: str) -> AckOutcome:
    won = tx.one(
        "UPDATE journal_outbox SET acked_event_id = ? WHERE principal_id = ? AND delivery_id = ?"
        " AND stage = ? AND txn_id = ? AND attempted = 1 AND acked_event_id IS NULL"
        " RETURNING purpose",
        (event_id, p, delivery.delivery_id, delivery.stage.value, delivery.txn_id),
    )
    if won is None:
        return AckOutcome.LOST
    if won[0] == DeliveryPurpose.APPROVAL_CARD.value:
        if delivery.stage is DeliveryStage.INITIAL:
            # The card's event id: what an answer to the card names (first writer wins).
            tx.execute(
                "UPDATE approval_cards SET card_event_id = ? WHERE principal_id = ?"
                " AND approval_id = ? AND card_event_id IS NULL",
                (event_id, p, delivery.delivery_id),
            )
        return AckOutcome.ACKNOWLEDGED
    if delivery.stage is DeliveryStage.INITIAL:
        tx.execute(
            "UPDATE journal_turns SET initial_event_id = ? WHERE principal_id = ? AND turn_id = ?",
            (event_id, p, delivery.turn_id),
        )
    else:
        tx.execute(
            "UPDATE journal_turns SET final_event_id = ?, state = ?"
            " WHERE principal_id = ? AND turn_id = ?",
            (event_id, TurnState.DELIVERED.value, p, delivery.turn_id),
        )
    return AckOutcome.ACKNOWLEDGED


ENCRYPTED_EVENT_TYPE = "m.room.encrypted"


def seal_delivery(tx: Tx, p: str, delivery: Delivery, content: bytes) -> bool:
    """Replace a claimed row's plaintext payload by its ``m.room.encrypted`` form, once.

    Run in the transaction that saves the advanced Megolm session, so the ciphertext and
    the ratchet step that produced it are durable together; a resend sends the stored
    ciphertext, never a second encryption. False when the row is no longer the one
    claimed (acknowledged, or sealed already): the caller must not send its own copy.
    """
    return (
        tx.execute(
            "UPDATE journal_outbox SET event_type = ?, content = ? WHERE principal_id = ?"
            " AND delivery_id = ? AND stage = ? AND txn_id = ? AND event_type = ?"
            " AND attempted = 1 AND acked_event_id IS NULL",
            (
                ENCRYPTED_EVENT_TYPE,
                content,
                p,
                delivery.delivery_id,
                delivery.stage.value,
                delivery.txn_id,
                delivery.event_type,
            ),
        )
        == 1
    )
