"""Cross-relay deliveries: the source relay's durable obligation after ``message.send``.

Accepting a send to an account homed elsewhere claims its (from, message_id) in ``sends``
with status ``delivering``, appends the sent record when ``sender_boxes`` came, and
queues the complete ``message.deliver`` params, all in one commit. A worker resends them
unchanged until the target accepts or refuses for good, or the deadline passes; the
terminal status is written once (``finish`` never changes a final status) and the
queue row goes in the same commit. After a restart the queue is simply read again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gapline.relay._errors import RelayFailure
from gapline.relay._store._accounts import device_windows
from gapline.relay._store._sends import (
    AcceptedSend,
    DeliveryResult,
    NewSend,
    _stored,
    _stored_result,
)
from gapline.relay._store._timeline import Append, append
from gapline.storage import Backend, Tx

__all__ = ["DELIVERING", "Deliveries", "PendingDelivery"]

DELIVERING = "delivering"


@dataclass(frozen=True, slots=True)
class PendingDelivery:
    from_account: str
    message_id: str
    to_account: str
    params: str  # the message.deliver params, JSON, exactly as first queued
    deadline: int
    attempts: int


def _accept(tx: Tx, send: NewSend, params: str, deadline: int) -> AcceptedSend:
    key = (send.from_account, send.message_id)
    stored = _stored(tx, [key])
    if key in stored:
        outcome = _stored_result(send, stored[key])
        if isinstance(outcome, RelayFailure):
            raise outcome
        return outcome
    if send.refusal is not None:
        raise send.refusal
    appends: list[Append] = []
    expires_at = send.now + send.retention
    if send.sender_boxes is not None:
        windows = device_windows(tx, [send.from_account])[send.from_account]
        valid = {d for d, nb, exp in windows if nb <= send.now < exp}
        boxes = [b for b in send.sender_boxes if b.device_id in valid]
        if not boxes:
            raise RelayFailure("device_unknown", "no sender key-box device is currently valid")
        appends.append(
            Append(
                send.from_account, send.now, expires_at, send.from_device_id, send.envelope, boxes
            )
        )
    tx.execute(
        "INSERT INTO sends (from_account, message_id, digest, status, error, accepted_at,"
        " expires_at) VALUES (?, ?, ?, ?, NULL, ?, ?)",
        (*key, send.digest, DELIVERING, send.now, expires_at),
    )
    tx.execute(
        "INSERT INTO deliveries (from_account, message_id, to_account, params, deadline,"
        " next_attempt, attempts) VALUES (?, ?, ?, ?, ?, ?, 0)",
        (*key, send.to_account, params, deadline, send.now),
    )
    sequences = append(tx, appends) if appends else []
    appended = tuple((a.account, seq) for a, seq in zip(appends, sequences, strict=True))
    return AcceptedSend(DeliveryResult(DELIVERING, send.now), False, appended)


def _accept_batch(
    tx: Tx, items: list[tuple[NewSend, str, int]]
) -> list[AcceptedSend | BaseException]:
    """Each send as if alone, in one transaction: ``_accept`` raises before it writes."""
    out: list[AcceptedSend | BaseException] = []
    for send, params, deadline in items:
        try:
            out.append(_accept(tx, send, params, deadline))
        except RelayFailure as exc:
            out.append(exc)
    return out


def _finish_batch(tx: Tx, items: list[tuple[PendingDelivery, str, str | None]]) -> list[None]:
    tx.executemany(
        "UPDATE sends SET status = ?, error = ? "
        "WHERE from_account = ? AND message_id = ? AND status = ?",
        [(status, error, i.from_account, i.message_id, DELIVERING) for i, status, error in items],
    )
    tx.executemany(
        "DELETE FROM deliveries WHERE from_account = ? AND message_id = ?",
        [(i.from_account, i.message_id) for i, _, _ in items],
    )
    return [None] * len(items)


class Deliveries:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def accept(self, send: NewSend, params: str, deadline: int) -> AcceptedSend:
        """Accept a send to be delivered to another relay (or its stored result)."""
        # Batched like local sends: concurrent sends share one commit.
        return await self.backend.write_batched(_accept_batch, (send, params, deadline))

    async def due(self, now: int, limit: int) -> list[PendingDelivery]:
        def op(tx: Tx) -> list[PendingDelivery]:
            rows = tx.all(
                "SELECT from_account, message_id, to_account, params, deadline, attempts"
                " FROM deliveries WHERE next_attempt <= ? ORDER BY next_attempt LIMIT ?",
                (now, limit),
            )
            return [
                PendingDelivery(str(a), str(m), str(t), str(p), int(d), int(n))
                for a, m, t, p, d, n in rows
            ]

        return await self.backend.read(op)

    async def pending(self) -> int:
        row = await self.backend.read(lambda tx: tx.one("SELECT COUNT(*) FROM deliveries", ()))
        return 0 if row is None else int(row[0])

    async def postpone(self, item: PendingDelivery, next_attempt: int) -> None:
        await self.backend.write(
            lambda tx: tx.execute(
                "UPDATE deliveries SET next_attempt = ?, attempts = ? "
                "WHERE from_account = ? AND message_id = ?",
                (next_attempt, item.attempts + 1, item.from_account, item.message_id),
            )
        )

    async def finish(
        self, item: PendingDelivery, status: str, error: dict[str, Any] | None
    ) -> None:
        """Write the terminal status (only over ``delivering``) and drop the queue row."""
        text = None if error is None else json.dumps(error)
        await self.backend.write_batched(_finish_batch, (item, status, text))
