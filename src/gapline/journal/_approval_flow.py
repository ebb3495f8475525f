"""Approvals at run time: a turn asking, an answer deciding, the turn resuming.

:class:`Approvals` holds only an :class:`ApprovalDeliveryView`. A turn asks
(``request``): the card, its continuation and the card's delivery are opened in one
transaction, the worker is woken to send the card, and the turn waits for the decision.
An answer (``answer``: a reply or reaction the dispatcher routed here) is recorded
once by the store, together with the card's resolution edit and the answer's
settlement; then the waiting turn resumes with the decision.

The waiting is a continuation, not a held coroutine: the decision is durable, so a
turn cut short by a crash is run again after the restart, asks for the same call at
the same point, and gets the recorded decision at once (no second card). A turn in
this process is woken the moment an answer is recorded; one in another process finds
the decision on its next look (``poll_interval``). Nobody answering in time is a
decision too (``EXPIRED``), made by the waiting turn when its deadline passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from gapline.journal._approval_cards import (
    RelatedAnswer,
    approval_id_for,
    card_content,
    decision_of,
)
from gapline.journal._faults import ApprovalFaultPoint, fault_point
from gapline.journal._types import (
    AnswerOutcome,
    Approval,
    ApprovalAnswer,
    ApprovalRequest,
    Decision,
    PendingEvent,
    ToolCall,
)
from gapline.journal._views import ApprovalDeliveryView

__all__ = ["DEFAULT_APPROVAL_TIMEOUT", "Approvals", "AskingTurn"]

log = logging.getLogger("gapline.journal.approvals")

DEFAULT_APPROVAL_TIMEOUT = 3600.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AskingTurn:
    """What a card needs to know of the turn that asks."""

    turn_id: str
    room_id: str
    thread_id: str | None
    source_event_id: str
    sender: str


@dataclass
class Approvals:
    """Requests, answers and waits for one principal's approvals."""

    view: ApprovalDeliveryView
    principal_id: str
    wake_delivery: Callable[[], None]
    default_approvers: frozenset[str] = frozenset()
    timeout: float = DEFAULT_APPROVAL_TIMEOUT
    poll_interval: float = 1.0
    id_key: bytes | None = None  # a sealed journal's: approval ids keyed (`Sealing.id_key`)
    _waiters: dict[str, asyncio.Event] = field(default_factory=dict)

    async def request(
        self,
        turn: AskingTurn,
        ordinal: int,
        call: ToolCall,
        *,
        approvers: Iterable[str] | None = None,
        expires_in: float | None = None,
    ) -> Approval:
        """The decision on ``call``, asked the ``ordinal``-th time in ``turn``."""
        allowed = frozenset(approvers or self.default_approvers or {turn.sender})
        approval_id = approval_id_for(
            self.principal_id, turn.turn_id, ordinal, call, key=self.id_key
        )
        wait = self.timeout if expires_in is None else expires_in
        request = ApprovalRequest(
            approval_id=approval_id,
            turn_id=turn.turn_id,
            call=call,
            approvers=allowed,
            expires_at=_now_ms() + int(wait * 1000),
            card_content=msgspec.json.encode(
                card_content(
                    approval_id,
                    call,
                    allowed,
                    source_event_id=turn.source_event_id,
                    thread_id=turn.thread_id,
                )
            ),
        )
        approval = await self.view.open_approval(request)
        if approval is None:
            # The turn's membership ended: nothing was written, nothing will be answered.
            return Approval(
                approval_id, turn.turn_id, turn.room_id, turn.thread_id, call,
                tuple(sorted(allowed)), request.expires_at, None, Decision.CANCELLED,
                None, "the bot left the room",
            )  # fmt: skip
        if approval.decision is None:
            self.wake_delivery()
        return await self._until_decided(approval)

    async def _until_decided(self, approval: Approval) -> Approval:
        waiter = self._waiters.setdefault(approval.approval_id, asyncio.Event())
        try:
            while approval.decision is None:
                remaining = (approval.expires_at - _now_ms()) / 1000
                if remaining <= 0:
                    expired = await self.view.expire_approval(approval.approval_id, now=_now_ms())
                    if expired is None:
                        raise LookupError(f"approval {approval.approval_id} disappeared")
                    approval = expired
                    self.wake_delivery()
                    continue
                # Cleared before the read that follows it: a wake-up in between is kept.
                waiter.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.poll_interval, remaining)):
                        await waiter.wait()
                current = await self.view.approval(approval.approval_id)
                if current is None:
                    raise LookupError(f"approval {approval.approval_id} disappeared")
                approval = current
        finally:
            self._waiters.pop(approval.approval_id, None)
        return approval

    def wake_all(self) -> None:
        """Every waiting turn looks again (a fence may have cancelled what it waits on)."""
        for waiter in self._waiters.values():
            waiter.set()

    async def answer(self, pending: PendingEvent, answer: RelatedAnswer) -> AnswerOutcome | None:
        """Record ``pending`` (a reply or reaction to one of our cards) as an answer.

        None when it says neither approve nor deny: then it decides nothing, and the
        caller settles it.
        """
        decision = decision_of(answer.text)
        if decision is None:
            return None
        event = pending.event
        outcome = await self.view.resolve_approval(
            event.room_id,
            answer.target_event_id,
            decision=decision,
            approver=event.sender,
            answer_event_id=event.event_id,
            now=_now_ms(),
        )
        log.info(
            "approval answered",
            extra={
                "room_id": event.room_id,
                "event_id": event.event_id,
                "card_event_id": answer.target_event_id,
                "outcome": outcome.answer.value,
                "decision": decision.value,
            },
        )
        if outcome.answer in (ApprovalAnswer.RECORDED, ApprovalAnswer.EXPIRED):
            fault_point(ApprovalFaultPoint.AFTER_DECISION_BEFORE_CONTINUATION)
            assert outcome.approval is not None
            waiter = self._waiters.get(outcome.approval.approval_id)
            if waiter is not None:
                waiter.set()
            self.wake_delivery()
        return outcome
