"""Approvals: exact-call cards, the continuations waiting on them, one decision each.

- ``open_approval`` writes, in one epoch-checked transaction, the continuation (the
  turn waits on this approval), the card (the exact call: its name, its canonical
  arguments and their digest, the turn and delivery it belongs to, who may decide)
  and the card's outbox row. It is idempotent by approval id, which is derived from
  the turn and the call, so a turn rerun after a crash finds its card and its
  decision instead of posting a second card.
- The card's Matrix transport state (payload, transaction id, attempts, the event id
  it got) is the generic outbox's; acknowledging the card's row records its event id
  here (``_outbox.acknowledge``).
- ``resolve_approval`` records an answer to a card: the first decision by an allowed
  approver, before the deadline and under the card's membership, wins; the card's
  resolution edit is enqueued and the answering event settled in the same transaction.
- ``reconcile_departure`` runs inside every epoch advance: it cancels what the
  departed membership was waiting on across the principals holding the card and the
  continuation, tombstones the room's cards and retires their fully acknowledged
  deliveries (attempted but unacknowledged ones stay: their outcome is unknown).

The card and the continuation may belong to different principals (a coordinator bot
posting cards for another's turns): each row carries its own principal, and every
query names the one it acts for.

With an active `Sealing` the call (its name, canonical arguments and their digest) is
sealed before its first write, and so is every resolution edit enqueued; the ids and the
approvers stay clear (the approval id is keyed then: it reveals no digest). One database has
one store key, so whoever holds it opens every sealed call. A resolution is sealed when
its card's call is (so the card's principal can send it, whoever decided); a fence run
by a principal without the key (it shares the database with a sealed one) still cancels
a sealed card, with a resolution that names no call rather than one it cannot read.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gapline.journal._approval_cards import resolution_content
from gapline.journal._epochs import current_epoch
from gapline.journal._locks import lock_room
from gapline.journal._outbox import channel, load_turn, write_delivery
from gapline.journal._sealing import Sealing
from gapline.journal._types import (
    AnswerOutcome,
    Approval,
    ApprovalAnswer,
    ApprovalRequest,
    Decision,
    DeliveryPurpose,
    DeliveryStage,
    ToolCall,
    UnknownTurn,
    decode_thread_id,
)
from gapline.storage import Tx

__all__ = [
    "approval",
    "expire_approval",
    "open_approval",
    "reconcile_departure",
    "resolve_approval",
]

_APPROVAL = (
    "SELECT c.approval_id, c.turn_id, c.room_id, c.thread_id, c.tool_name, c.arguments,"
    " c.approvers, c.card_event_id, k.expires_at, k.decision, k.decided_by, k.reason,"
    " c.principal_id, c.continuation_principal_id, c.tombstoned, c.epoch, k.epoch"
    " FROM approval_cards c JOIN approval_continuations k"
    " ON k.principal_id = c.continuation_principal_id AND k.approval_id = c.approval_id"
)


_CLEAR = Sealing()


def _call(row: tuple[Any, ...], seal: Sealing) -> ToolCall:
    name, arguments = seal.open_text(row[4]), seal.open_text(row[5])
    assert name is not None and arguments is not None
    return ToolCall(name, json.loads(arguments))


def _approval(row: tuple[Any, ...], seal: Sealing) -> Approval:
    decision = row[9]
    return Approval(
        approval_id=row[0],
        turn_id=row[1],
        room_id=row[2],
        thread_id=decode_thread_id(row[3]),
        call=_call(row, seal),
        approvers=tuple(json.loads(row[6])),
        expires_at=int(row[8]),
        card_event_id=row[7],
        decision=None if decision is None else Decision(decision),
        decided_by=row[10],
        reason=row[11],
    )


def _lock_both(tx: Tx, room_id: str, *principals: str) -> None:
    """Every principal's shared membership lock, in one global order."""
    for principal in sorted(set(principals)):
        lock_room(tx, principal, room_id, exclusive=False)


def approval(tx: Tx, p: str, approval_id: str, seal: Sealing = _CLEAR) -> Approval | None:
    """The approval a turn of ``p`` waits on, wherever its card is held."""
    row = tx.one(f"{_APPROVAL} WHERE k.principal_id = ? AND k.approval_id = ?", (p, approval_id))
    return None if row is None else _approval(row, seal)


def open_approval(
    tx: Tx, card_p: str, continuation_p: str, request: ApprovalRequest, seal: Sealing = _CLEAR
) -> Approval | None:
    """Open (idempotently) the card and the continuation for one exact call.

    None, with nothing written, when the turn's membership ended: a card must never
    ask about a turn whose answer the fence will refuse. ``request.card_content`` is
    stored as given (the caller seals it with the rest of its outbox payloads).
    """
    turn = load_turn(tx, continuation_p, request.turn_id)
    if turn is None:
        raise UnknownTurn(request.turn_id)
    existing = approval(tx, continuation_p, request.approval_id, seal)
    if existing is not None:
        return existing
    room = turn.room_id
    _lock_both(tx, room, card_p, continuation_p)
    if current_epoch(tx, continuation_p, room) != turn.epoch:
        return None
    thread = "" if turn.thread_id is None else turn.thread_id
    call = request.call
    tx.execute(
        "INSERT INTO approval_continuations (principal_id, approval_id, turn_id, room_id, epoch,"
        " expires_at) VALUES (?, ?, ?, ?, ?, ?)",
        (continuation_p, request.approval_id, turn.turn_id, room, turn.epoch, request.expires_at),
    )
    tx.execute(
        "INSERT INTO approval_cards (principal_id, approval_id, continuation_principal_id, turn_id,"
        " room_id, thread_id, tool_name, arguments, call_digest, approvers, epoch)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            card_p,
            request.approval_id,
            continuation_p,
            turn.turn_id,
            room,
            thread,
            seal.text(call.name),
            seal.text(call.canonical_arguments()),
            seal.text(call.digest()),
            json.dumps(sorted(request.approvers)),
            current_epoch(tx, card_p, room),
        ),
    )
    content = request.card_content
    _card_delivery(
        tx,
        card_p,
        request.approval_id,
        DeliveryStage.INITIAL,
        turn_id=turn.turn_id,
        room_id=room,
        thread=thread,
        content=content.encode("utf-8") if isinstance(content, str) else bytes(content),
    )
    return approval(tx, continuation_p, request.approval_id, seal)


def _card_delivery(
    tx: Tx,
    card_p: str,
    approval_id: str,
    stage: DeliveryStage,
    *,
    turn_id: str,
    room_id: str,
    thread: str,
    content: bytes,
) -> None:
    """A card (INITIAL) or its resolution edit (FINAL), in the card principal's outbox."""
    write_delivery(
        tx,
        card_p,
        delivery_id=approval_id,
        stage=stage,
        turn_id=turn_id,
        room_id=room_id,
        thread=thread,
        event_type="m.room.message",
        content=content,
        purpose=DeliveryPurpose.APPROVAL_CARD,
        outbox_channel=channel("outbox", card_p),
    )


def _decide(
    tx: Tx,
    row: tuple[Any, ...],
    seal: Sealing,
    decision: Decision,
    *,
    by: str | None,
    reason: str | None,
) -> bool:
    """Record the decision once; enqueue the card's resolution (sealed like every outbox
    payload) when the card can still speak (its event id is known and no fence retired
    it). True if this call decided."""
    approval_id, turn_id, room_id, thread, card_event_id = row[0], row[1], row[2], row[3], row[7]
    card_p, continuation_p, tombstoned = row[12], row[13], row[14]
    decided = tx.execute(
        "UPDATE approval_continuations SET decision = ?, decided_by = ?, reason = ?"
        " WHERE principal_id = ? AND approval_id = ? AND decision IS NULL",
        (decision.value, by, reason, continuation_p, approval_id),
    )
    if decided != 1:
        return False
    if card_event_id is not None and not tombstoned:
        # The card's own row says whether its principal seals: its resolution is sealed
        # alike, so the principal that sends it can read it.
        sealed_card = Sealing.is_sealed_text(row[4])
        call = None if sealed_card and not seal.active else _call(row, seal)
        edit = msgspec.json.encode(
            resolution_content(card_event_id, approval_id, call, decision, by=by, reason=reason)
        )
        _card_delivery(
            tx,
            card_p,
            approval_id,
            DeliveryStage.FINAL,
            turn_id=turn_id,
            room_id=room_id,
            thread=thread,
            content=seal.data(edit) if sealed_card else edit,
        )
    return True


def resolve_approval(
    tx: Tx,
    p: str,
    room_id: str,
    card_event_id: str,
    decision: Decision,
    approver: str,
    answer_event_id: str,
    now: int,
    seal: Sealing = _CLEAR,
) -> AnswerOutcome:
    """Record one answer (APPROVED or DENIED) to the card ``card_event_id`` of ``p``.

    Whatever it decides, the answering event is settled in the same transaction, unless
    no card of ``p`` has that event id (then it is no answer at all, and the caller
    treats it as the event it otherwise is).
    """
    if decision not in (Decision.APPROVED, Decision.DENIED):
        raise ValueError(f"an answer approves or denies, not {decision.value}")
    row = tx.one(
        f"{_APPROVAL} WHERE c.principal_id = ? AND c.room_id = ? AND c.card_event_id = ?",
        (p, room_id, card_event_id),
    )
    if row is None:
        return AnswerOutcome(ApprovalAnswer.UNKNOWN_CARD, None)
    tx.execute(
        "UPDATE journal_events SET settled = 1, source = NULL, consumer = NULL"
        " WHERE principal_id = ? AND event_id = ? AND settled = 0",
        (p, answer_event_id),
    )
    current = _approval(row, seal)
    if row[14]:
        return AnswerOutcome(ApprovalAnswer.TOMBSTONED, current)
    continuation_p = row[13]
    _lock_both(tx, room_id, p, continuation_p)
    if current_epoch(tx, p, room_id) != int(row[15]) or current_epoch(
        tx, continuation_p, room_id
    ) != int(row[16]):
        return AnswerOutcome(ApprovalAnswer.STALE_EPOCH, current)
    if approver not in current.approvers:
        return AnswerOutcome(ApprovalAnswer.NOT_APPROVER, current)
    if current.decision is not None:
        return AnswerOutcome(ApprovalAnswer.ALREADY_DECIDED, current)
    if now >= current.expires_at:
        _decide(tx, row, seal, Decision.EXPIRED, by=None, reason="no answer in time")
        return AnswerOutcome(
            ApprovalAnswer.EXPIRED, approval(tx, continuation_p, current.approval_id, seal)
        )
    if not _decide(tx, row, seal, decision, by=approver, reason=None):
        return AnswerOutcome(
            ApprovalAnswer.ALREADY_DECIDED, approval(tx, continuation_p, current.approval_id, seal)
        )
    return AnswerOutcome(
        ApprovalAnswer.RECORDED, approval(tx, continuation_p, current.approval_id, seal)
    )


def expire_approval(
    tx: Tx, p: str, approval_id: str, now: int, seal: Sealing = _CLEAR
) -> Approval | None:
    """Decide EXPIRED when the deadline passed and nobody decided; the approval as it is."""
    row = tx.one(f"{_APPROVAL} WHERE k.principal_id = ? AND k.approval_id = ?", (p, approval_id))
    if row is None:
        return None
    current = _approval(row, seal)
    if current.decision is None and now >= current.expires_at:
        _lock_both(tx, current.room_id, row[12], p)
        _decide(tx, row, seal, Decision.EXPIRED, by=None, reason="no answer in time")
    return approval(tx, p, approval_id, seal)


def reconcile_departure(tx: Tx, p: str, room_id: str, seal: Sealing = _CLEAR) -> None:
    """The approval half of ``p``'s epoch advance in ``room_id`` (its caller holds the
    room's exclusive lock and has already removed the unattempted deliveries).

    1. Every turn of ``p`` in the room still waiting is cancelled; a card of another
       principal asking for it is resolved as cancelled (that principal is still in the
       room, so its card must not stay answerable).
    2. Every card ``p`` holds in the room is tombstoned: its event id is kept, and no
       answer to it decides anything again. A turn of another principal waiting on one
       is cancelled: nobody can answer a card whose bot left.
    3. ``p``'s card deliveries in the room that are fully acknowledged are retired;
       attempted but unacknowledged rows survive (their outcome is unknown).
    """
    waiting = tx.all(
        f"{_APPROVAL} WHERE k.principal_id = ? AND k.room_id = ? AND k.decision IS NULL",
        (p, room_id),
    )
    for row in waiting:
        # Cards held by p are tombstoned below: only another principal's card may speak.
        if row[12] == p:
            row = (*row[:14], 1, *row[15:])
        _decide(tx, row, seal, Decision.CANCELLED, by=None, reason="the bot left the room")
    held = tx.all(
        f"{_APPROVAL} WHERE c.principal_id = ? AND c.room_id = ? AND c.tombstoned = 0"
        " AND k.decision IS NULL",
        (p, room_id),
    )
    for row in held:
        _decide(
            tx, (*row[:14], 1, *row[15:]), seal, Decision.CANCELLED, by=None, reason="the bot left"
        )
    tx.execute(
        "UPDATE approval_cards SET tombstoned = 1"
        " WHERE principal_id = ? AND room_id = ? AND tombstoned = 0",
        (p, room_id),
    )
    tx.execute(
        "DELETE FROM journal_outbox WHERE principal_id = ? AND purpose = ? AND delivery_id IN ("
        " SELECT approval_id FROM approval_cards WHERE principal_id = ? AND room_id = ?)"
        " AND NOT EXISTS (SELECT 1 FROM journal_outbox AS unacked"
        " WHERE unacked.principal_id = journal_outbox.principal_id"
        " AND unacked.delivery_id = journal_outbox.delivery_id"
        " AND unacked.acked_event_id IS NULL)",
        (p, DeliveryPurpose.APPROVAL_CARD.value, p, room_id),
    )
