"""The turn runner: pending events routed in receipt order, one turn per room at a time.

Each round reads the pending events from the start of receipt order (on PostgreSQL a
lower seq may commit after a higher one), routes each (``_dispatch``), records answers
to approval cards at once, settles what needs nothing more, and starts, per room, the
first turn in line when no turn of that room runs (``_dispatch.due_turns``). Rooms run
concurrently, up to ``max_concurrent`` turns in all.

One answer, step by step (each step durable before the next; the crash points of
``_faults`` sit between them):

1. ``begin_turn`` (idempotent, turn id = source event id);
2. enqueue the INITIAL placeholder (a reply marked ``pending``) and wait for the worker
   to acknowledge it: the turn now knows the event to edit;
3. run the handler; each :class:`Progress` is an ``m.replace`` marked ``streaming``,
   sent directly (progress is transport only, never journaled). The handler may ask
   for an approval (``turn.request_approval``) or for reactions
   (``turn.accept_reactions``);
4. ``record_result``: the final text is durable, so a restart never reruns a completed
   handler;
5. enqueue the FINAL edit *and* settle the source in one transaction;
6. the worker claims, sends with the deterministic transaction id, and acknowledges
   together with the terminal turn record.

A reaction a turn asked for is claimed (``INTERACTIVE_REACTION``) and then answered
through the same steps, by the same handler, with ``message.reaction`` set; the claim
is refused, and the reaction settled against the new epoch, when the bot left the room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from gapline.journal._approval_flow import Approvals, AskingTurn
from gapline.journal._dispatch import Route, Routed, due_turns, route
from gapline.journal._faults import FaultPoint, fault_point
from gapline.journal._handlers import (
    Final,
    Handler,
    HandlerError,
    Progress,
    Reaction,
    TriggerMessage,
    with_turn,
)
from gapline.journal._membership import INTERACTIVE_REACTION
from gapline.journal._reader import ConversationReader
from gapline.journal._sidecar import DEFAULT_SIDECAR_LIMIT, attach_sidecar
from gapline.journal._types import (
    Approval,
    ConsumerClaim,
    ConversationKey,
    Delivery,
    DeliveryPurpose,
    DeliveryRequest,
    DeliveryStage,
    EnqueueOutcome,
    PendingEvent,
    ToolCall,
    TurnRecord,
    TurnState,
)
from gapline.journal._views import DispatchView, PendingTurnView, RelationView, ReplayView
from gapline.journal._worker import DeliverySender, edit_content, placeholder_content
from gapline.matrix import MatrixError

__all__ = ["AnswerTransport", "TurnJournal", "TurnRunner"]

log = logging.getLogger("gapline.journal.bot")


class TurnJournal(ReplayView, DispatchView, PendingTurnView, RelationView, Protocol):
    """The turn runner's slice: pending events and claims, turns, what replies relate to."""


class AnswerTransport(DeliverySender, Protocol):
    """Direct sends the turn runner makes itself: progress edits and sidecar uploads."""

    async def upload(
        self, data: bytes, *, content_type: str = ..., filename: str | None = None
    ) -> str: ...


@dataclass
class _RunningTurn:
    """The :class:`~gapline.journal._handlers.Turn` a handler receives."""

    runner: TurnRunner
    record: TurnRecord
    trigger: TriggerMessage
    answer_event_id: str
    _asked: int = 0

    @property
    def turn_id(self) -> str:
        return self.record.turn_id

    async def request_approval(
        self,
        call: ToolCall,
        *,
        approvers: Iterable[str] | None = None,
        expires_in: float | None = None,
    ) -> Approval:
        approvals = self.runner.approvals
        if approvals is None:
            raise HandlerError("this bot runs without approvals")
        ordinal, self._asked = self._asked, self._asked + 1
        asking = AskingTurn(
            turn_id=self.record.turn_id,
            room_id=self.record.room_id,
            thread_id=self.trigger.thread_id,
            source_event_id=self.trigger.event_id,
            sender=self.trigger.sender,
        )
        return await approvals.request(
            asking, ordinal, call, approvers=approvers, expires_in=expires_in
        )

    async def accept_reactions(self, *keys: str) -> None:
        accepted = await self.runner.journal.offer_reactions(
            self.record.turn_id, self.answer_event_id, keys
        )
        if not accepted:
            log.info("reactions refused: the room was left", extra={"turn_id": self.turn_id})


@dataclass
class TurnRunner:
    """Runs the handler for pending turns: rooms concurrently, each room in order."""

    journal: TurnJournal
    transport: AnswerTransport
    reader: ConversationReader
    handler: Handler
    wake_delivery: Callable[[], None]
    principal_id: str
    approvals: Approvals | None = None
    sidecar_limit: int = DEFAULT_SIDECAR_LIMIT
    # Whether this room's attachments must be encrypted (an encrypted room's): a long
    # answer's sidecar is then an encrypted attachment whose key rides in the event.
    encrypt_media: Callable[[str], Awaitable[bool]] | None = None
    max_concurrent: int = 32
    poll_interval: float = 2.0
    retry_pause: float = 5.0
    defer_pause: float = 0.5
    scan_limit: int = 2048
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _running: dict[str, str] = field(default_factory=dict)  # event id -> room id
    _retry_after: dict[str, float] = field(default_factory=dict)
    _initial: dict[str, asyncio.Future[str]] = field(default_factory=dict)
    _routes: dict[str, Routed] = field(default_factory=dict)
    _deferred: set[str] = field(default_factory=set)

    def wake(self) -> None:
        self._wake.set()

    def acknowledged(self, delivery: Delivery, event_id: str) -> None:
        """Worker callback: a placeholder now has its event id, or a card its id (an
        answer held back for it may go on)."""
        if delivery.purpose is DeliveryPurpose.APPROVAL_CARD:
            self._wake.set()
            return
        if delivery.stage is DeliveryStage.INITIAL:
            waiter = self._initial.get(delivery.turn_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(event_id)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                await self._round(group)
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with the wake-up, and this loop would never end.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()

    async def _pending(self) -> list[PendingEvent]:
        """Pending events from the start of receipt order, at most ``scan_limit``."""
        events: list[PendingEvent] = []
        after: int | None = None
        while len(events) < self.scan_limit:
            page = await self.journal.pending(min(256, self.scan_limit - len(events)), after=after)
            events.extend(page)
            if len(page) < 256:
                break
            after = page[-1].seq
        return events

    async def _round(self, group: asyncio.TaskGroup) -> None:
        now = time.monotonic()
        batch = await self._pending()
        seen = {p.event.event_id for p in batch}
        for stale in [e for e in self._routes if e not in seen]:
            del self._routes[stale]
        self._deferred &= seen
        routed: list[Routed] = []
        for pending in batch:
            event_id = pending.event.event_id
            if event_id in self._running:
                continue
            item = self._routes.get(event_id)
            if item is None and self._retry_after.get(event_id, 0.0) > now:
                if event_id in self._deferred:  # still holds its room's later turns
                    routed.append(Routed(pending, Route.DEFER))
                continue  # a failed turn steps aside during its pause
            try:
                item = item or await route(pending, self.principal_id, self.journal)
                await self._dispatch(item, routed, now)
            except Exception as exc:
                # A storage or homeserver failure on one event: it stays pending and is
                # looked at again after a pause; the other events go on.
                self._retry_after[event_id] = now + self.retry_pause
                log.exception(
                    "dispatch failed; the event stays pending",
                    extra={
                        "event_id": event_id,
                        "room_id": pending.event.room_id,
                        "error": repr(exc),
                    },
                )
        free = self.max_concurrent - len(self._running)
        for item in due_turns(
            routed,
            busy_rooms=set(self._running.values()),
            stepping_aside=lambda e: self._retry_after.get(e, 0.0) > now,
            free=free,
        ):
            event_id = item.pending.event.event_id
            self._running[event_id] = item.room_id
            group.create_task(self._guarded(item), name=f"turn {event_id}")

    async def _dispatch(self, item: Routed, routed: list[Routed], now: float) -> None:
        """Everything but starting a turn: answers recorded, settlements made, turns and
        held-back answers lined up (in receipt order) for ``due_turns``."""
        event_id = item.pending.event.event_id
        self._deferred.discard(event_id)
        if item.route in (Route.TURN, Route.REACTION_TURN):
            self._routes[event_id] = item
            routed.append(item)
        elif item.route is Route.APPROVAL_ANSWER:
            await self._answer_card(item)
        elif item.route is Route.DEFER:
            self._retry_after[event_id] = now + self.defer_pause
            self._deferred.add(event_id)
            routed.append(item)
        else:
            await self.journal.settle(event_id)

    async def _answer_card(self, item: Routed) -> None:
        assert item.answer is not None
        outcome = None
        if self.approvals is not None:
            outcome = await self.approvals.answer(item.pending, item.answer)
        if outcome is None or outcome.approval is None:
            # It decides nothing (no verdict in it, or no approvals here): settled.
            await self.journal.settle(item.pending.event.event_id)

    async def _guarded(self, item: Routed) -> None:
        pending = item.pending
        event_id = pending.event.event_id
        try:
            if item.route is Route.REACTION_TURN:
                await self._reaction(item)
            else:
                await self.answer(pending)
            self._retry_after.pop(event_id, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The event stays pending (no durable running state); retried after a pause,
            # during which the room's later messages go first.
            self._retry_after[event_id] = time.monotonic() + self.retry_pause
            log.exception(
                "turn failed; the event stays pending",
                extra={"event_id": event_id, "room_id": pending.event.room_id, "error": repr(exc)},
            )
        finally:
            self._running.pop(event_id, None)
            self._routes.pop(event_id, None)
            self._wake.set()

    async def _reaction(self, item: Routed) -> None:
        """A reaction a turn asked for: claimed once, then answered as a turn of its own."""
        pending, answer, role = item.pending, item.answer, item.role
        assert answer is not None and role is not None and role.turn_id is not None
        claim = await self.journal.claim_consumer(pending.event.event_id, INTERACTIVE_REACTION)
        if claim is not ConsumerClaim.CLAIMED:
            log.info(
                "reaction not dispatched",
                extra={"event_id": pending.event.event_id, "claim": claim.value},
            )
            return  # settled already, or settled now against the new epoch
        asked = await self.journal.turn(role.turn_id)
        await self.answer(
            pending,
            reaction=Reaction(answer.text, answer.target_event_id),
            thread_id=None if asked is None else asked.thread_id,
        )

    async def answer(
        self,
        pending: PendingEvent,
        *,
        reaction: Reaction | None = None,
        thread_id: str | None = None,
    ) -> None:
        event = pending.event
        content = msgspec.json.decode(event.content)
        turn = await self.journal.begin_turn(event.event_id)
        if turn.state is TurnState.DELIVERED:
            await self.journal.settle(event.event_id)
            return
        thread = event.thread_id if reaction is None else thread_id
        trigger = TriggerMessage(
            room_id=event.room_id,
            event_id=event.event_id,
            sender=event.sender,
            body=reaction.key if reaction is not None else str(content.get("body", "")),
            thread_id=thread,
            origin_server_ts=event.origin_server_ts,
            reaction=reaction,
        )
        if turn.state is TurnState.OPEN:
            replied_to = event.event_id if reaction is None else reaction.target_event_id
            initial_event_id = turn.initial_event_id or await self._placeholder(
                turn, pending, replied_to, thread
            )
            if initial_event_id is None:
                return  # the membership fence settled this source
            text = await self._run_handler(turn, trigger, initial_event_id)
            turn = await self.journal.record_result(turn.turn_id, text.encode("utf-8"))
            fault_point(FaultPoint.AFTER_HANDLER_RESULT_BEFORE_ENQUEUE)
        await self._enqueue_final(turn)

    async def _placeholder(
        self, turn: TurnRecord, pending: PendingEvent, replied_to: str, thread_id: str | None
    ) -> str | None:
        event = pending.event
        request = DeliveryRequest(
            turn_id=turn.turn_id,
            delivery_id=turn.turn_id,
            stage=DeliveryStage.INITIAL,
            room_id=event.room_id,
            thread_id=thread_id,
            event_type="m.room.message",
            content=msgspec.json.encode(placeholder_content(replied_to, thread_id)),
        )
        loop = asyncio.get_running_loop()
        waiter = self._initial.setdefault(turn.turn_id, loop.create_future())
        try:
            outcome = await self.journal.enqueue(request)
            if outcome is EnqueueOutcome.STALE_EPOCH:
                return None
            self.wake_delivery()
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        return await asyncio.shield(waiter)
                # Missed callback (another process acknowledged) or a fence meanwhile.
                current = await self.journal.turn(turn.turn_id)
                if current is not None and current.initial_event_id is not None:
                    return current.initial_event_id
                if await self.journal.epoch(event.room_id) != pending.epoch:
                    return None
        finally:
            self._initial.pop(turn.turn_id, None)

    async def _run_handler(
        self, record: TurnRecord, trigger: TriggerMessage, initial_event_id: str
    ) -> str:
        conversation = self.reader.bind(ConversationKey(trigger.room_id, trigger.thread_id))
        running = _RunningTurn(self, record, trigger, initial_event_id)
        stream = with_turn(self.handler)(conversation, trigger, running)
        async with contextlib.aclosing(stream):  # ty: ignore[invalid-argument-type]
            async for item in stream:
                if isinstance(item, Final):
                    return item.text
                if isinstance(item, Progress):
                    await self._progress(trigger.room_id, initial_event_id, item.text)
                else:
                    raise HandlerError(f"handler yielded {type(item).__name__}, not Progress/Final")
        raise HandlerError("handler ended without yielding Final")

    async def _progress(self, room_id: str, initial_event_id: str, text: str) -> None:
        """A streaming edit: transport-only, best effort, never durable."""
        try:
            await self.transport.send_event(
                room_id,
                "m.room.message",
                edit_content(initial_event_id, text, status="streaming"),
            )
        except MatrixError as exc:
            log.warning("progress edit failed", extra={"room_id": room_id, "error": str(exc)})

    async def _enqueue_final(self, turn: TurnRecord) -> None:
        if turn.result is None or turn.initial_event_id is None:
            raise HandlerError(f"turn {turn.turn_id} has no result or placeholder")
        text = turn.result.decode("utf-8")

        async def upload(data: bytes, content_type: str) -> str:
            return await self.transport.upload(data, content_type=content_type)

        encrypted = self.encrypt_media is not None and await self.encrypt_media(turn.room_id)
        body, extra = await attach_sidecar(text, self.sidecar_limit, upload, encrypted=encrypted)
        request = DeliveryRequest(
            turn_id=turn.turn_id,
            delivery_id=turn.turn_id,
            stage=DeliveryStage.FINAL,
            room_id=turn.room_id,
            thread_id=turn.thread_id,
            event_type="m.room.message",
            content=msgspec.json.encode(
                edit_content(turn.initial_event_id, body, status="complete", extra=extra)
            ),
        )
        outcome = await self.journal.enqueue(request, settle_source=True)
        log.info(
            "answer enqueued",
            extra={"turn_id": turn.turn_id, "room_id": turn.room_id, "outcome": outcome.value},
        )
        fault_point(FaultPoint.AFTER_ENQUEUE_BEFORE_CLAIM)
        self.wake_delivery()
