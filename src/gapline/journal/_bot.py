"""A bot on the journal: sync ingress, the turn runner, the delivery worker.

One :class:`Bot` owns three long-lived tasks in one TaskGroup:

- :class:`~gapline.journal._ingress.Ingress` admits every timeline event and
  only then moves the sync token;
- :class:`TurnRunner` takes pending events in receipt order and runs the
  handler for each actionable one;
- :class:`~gapline.journal._worker.DeliveryWorker` claims, sends and
  acknowledges outbox rows.

One answer, step by step (each step durable before the next; the crash
points of `gapline.journal._faults` sit between them):

1. ``begin_turn`` (idempotent, turn id = source event id);
2. enqueue the INITIAL placeholder (a reply marked ``pending``) and wait for
   the worker to acknowledge it: the turn now knows the event to edit;
3. run the handler; each :class:`Progress` is an ``m.replace`` marked
   ``streaming``, sent directly (progress is transport only, never journaled);
4. ``record_result``: the final text is durable in the turn store, so a
   restart never reruns a completed handler;
5. enqueue the FINAL edit *and* settle the source in one transaction;
6. the worker claims (``attempted``), sends with the deterministic
   transaction id, and acknowledges together with the terminal turn record.

A restart resumes from whichever step was last committed; every resend reuses
its transaction id, so the homeserver collapses it onto the first event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import msgspec

from gapline.journal._faults import FaultPoint, fault_point
from gapline.journal._handlers import Final, Handler, HandlerError, Progress, TriggerMessage
from gapline.journal._hydration import Hydrator
from gapline.journal._ingress import Ingress, IngressPolicy, RuntimeState
from gapline.journal._reader import ConversationReader
from gapline.journal._refetch import PointRefetcher
from gapline.journal._sidecar import DEFAULT_SIDECAR_LIMIT, attach_sidecar
from gapline.journal._store import JournalStore, PrincipalJournal
from gapline.journal._types import (
    ConversationKey,
    Delivery,
    DeliveryRequest,
    DeliveryStage,
    DepartureSource,
    EnqueueOutcome,
    EventKind,
    PendingEvent,
    TurnRecord,
    TurnState,
)
from gapline.journal._views import ReplayView, TurnView
from gapline.journal._worker import DeliveryWorker, edit_content, placeholder_content
from gapline.matrix import MatrixClient, MatrixError
from gapline.storage import Backend

__all__ = ["Bot", "BotConfig", "TurnRunner"]

log = logging.getLogger("gapline.journal.bot")


@dataclass(frozen=True, slots=True)
class BotConfig:
    homeserver: str
    user: str
    password: str
    store: str
    handler: Handler
    allow_inviters: frozenset[str] = frozenset()
    sidecar_limit: int = DEFAULT_SIDECAR_LIMIT
    max_concurrent_turns: int = 32
    sync_timeline_limit: int = 100
    device_display_name: str = "gapline bot"

    def __repr__(self) -> str:  # never print the password
        return f"BotConfig(homeserver={self.homeserver!r}, user={self.user!r}, store=...)"


class TurnJournal(ReplayView, TurnView, Protocol):
    """The turn runner's slice: pending events, turns, enqueue-and-settle."""

    async def epoch(self, room_id: str) -> int: ...


class AnswerTransport(Protocol):
    """Direct sends the turn runner makes itself: progress edits and sidecar uploads."""

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str | None = None,
    ) -> str: ...

    async def upload(
        self, data: bytes, *, content_type: str = ..., filename: str | None = None
    ) -> str: ...


@dataclass
class TurnRunner:
    """Runs the handler for pending actionable events, several rooms at once."""

    journal: TurnJournal
    transport: AnswerTransport
    reader: ConversationReader
    handler: Handler
    wake_delivery: Callable[[], None]
    sidecar_limit: int = DEFAULT_SIDECAR_LIMIT
    max_concurrent: int = 32
    poll_interval: float = 2.0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _running: set[str] = field(default_factory=set)
    _retry_after: dict[str, float] = field(default_factory=dict)
    _initial: dict[str, asyncio.Future[str]] = field(default_factory=dict)

    def wake(self) -> None:
        self._wake.set()

    def acknowledged(self, delivery: Delivery, event_id: str) -> None:
        """Worker callback: an INITIAL placeholder now has its event id."""
        if delivery.stage is DeliveryStage.INITIAL:
            waiter = self._initial.get(delivery.turn_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(event_id)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                await self._start_due(group)
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with the wake-up, and this loop would never end.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()

    async def _start_due(self, group: asyncio.TaskGroup) -> None:
        free = self.max_concurrent - len(self._running)
        if free <= 0:
            return
        # Always from the start: on PostgreSQL a lower seq may commit after a higher one.
        batch = await self.journal.pending(self.max_concurrent * 2)
        now = time.monotonic()
        for pending in batch:
            event_id = pending.event.event_id
            if event_id in self._running or self._retry_after.get(event_id, 0.0) > now:
                continue
            if free <= 0:
                break
            free -= 1
            self._running.add(event_id)
            group.create_task(self._guarded(pending), name=f"turn {event_id}")

    async def _guarded(self, pending: PendingEvent) -> None:
        event_id = pending.event.event_id
        try:
            await self.answer(pending)
            self._retry_after.pop(event_id, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The event stays pending (no durable running state); retry after a pause.
            self._retry_after[event_id] = time.monotonic() + 5.0
            log.exception(
                "turn failed; the event stays pending",
                extra={"event_id": event_id, "room_id": pending.event.room_id, "error": repr(exc)},
            )
        finally:
            self._running.discard(event_id)
            self._wake.set()

    async def answer(self, pending: PendingEvent) -> None:
        event = pending.event
        if event.kind is not EventKind.ACTIONABLE:
            # Reactions, redactions: their projection work was done at admission.
            await self.journal.settle(event.event_id)
            return
        content = msgspec.json.decode(event.content)
        turn = await self.journal.begin_turn(event.event_id)
        if turn.state is TurnState.DELIVERED:
            await self.journal.settle(event.event_id)
            return
        if turn.state is TurnState.OPEN:
            initial_event_id = turn.initial_event_id or await self._placeholder(turn, pending)
            if initial_event_id is None:
                return  # the membership fence settled this source
            text = await self._run_handler(pending, content, initial_event_id)
            turn = await self.journal.record_result(turn.turn_id, text.encode("utf-8"))
            fault_point(FaultPoint.AFTER_HANDLER_RESULT_BEFORE_ENQUEUE)
        await self._enqueue_final(turn)

    async def _placeholder(self, turn: TurnRecord, pending: PendingEvent) -> str | None:
        event = pending.event
        request = DeliveryRequest(
            turn_id=turn.turn_id,
            delivery_id=turn.turn_id,
            stage=DeliveryStage.INITIAL,
            room_id=event.room_id,
            thread_id=event.thread_id,
            event_type="m.room.message",
            content=msgspec.json.encode(placeholder_content(event.event_id, event.thread_id)),
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
        self, pending: PendingEvent, content: Mapping[str, Any], initial_event_id: str
    ) -> str:
        event = pending.event
        trigger = TriggerMessage(
            room_id=event.room_id,
            event_id=event.event_id,
            sender=event.sender,
            body=str(content.get("body", "")),
            thread_id=event.thread_id,
            origin_server_ts=event.origin_server_ts,
        )
        conversation = self.reader.bind(ConversationKey(event.room_id, event.thread_id))
        stream = self.handler(conversation, trigger)
        async with contextlib.aclosing(stream):  # ty: ignore[invalid-argument-type]
            async for item in stream:
                if isinstance(item, Final):
                    return item.text
                if isinstance(item, Progress):
                    await self._progress(event.room_id, initial_event_id, item.text)
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

        body, extra = await attach_sidecar(text, self.sidecar_limit, upload)
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


def new_device_id() -> str:
    return "GAPLINE" + secrets.token_hex(5).upper()


@dataclass
class Bot:
    """``gapline bot``: log in as the persisted device and run until cancelled."""

    config: BotConfig
    backend: Backend | None = None  # an already open backend (tests); else opened from config
    transport: httpx.AsyncBaseTransport | None = None  # tests: a fake homeserver's transport
    journal: PrincipalJournal | None = None
    client: MatrixClient | None = None
    ingress: Ingress | None = None
    reader: ConversationReader | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        from gapline.storage import open_backend

        backend = self.backend or await open_backend(self.config.store)
        try:
            await self._run(backend)
        finally:
            if self.backend is None:
                await backend.close()

    async def _run(self, backend: Backend) -> None:
        store = await JournalStore.open(backend)
        state = await RuntimeState.open(backend, self.config.user)
        device_id = await state.device_id()
        if device_id is None:
            # Chosen and persisted before the first login, so a crash right after
            # it cannot leave sends on a device the next run does not reuse.
            device_id = new_device_id()
            await state.save_device_id(device_id)
        async with MatrixClient(self.config.homeserver, transport=self.transport) as client:
            session = await client.login(
                self.config.user,
                self.config.password,
                device_id=device_id,
                initial_device_display_name=self.config.device_display_name,
            )
            journal = self.bind(store, session.user_id)
            self.journal, self.client = journal, client
            log.info(
                "logged in", extra={"user_id": session.user_id, "device_id": session.device_id}
            )
            refetcher = PointRefetcher(journal, client, session.user_id)
            hydrator = Hydrator(journal, client, session.user_id)
            self.reader = ConversationReader(journal, refetcher=refetcher, hydrator=hydrator)
            worker = DeliveryWorker(journal, client)
            runner = TurnRunner(
                journal,
                client,
                self.reader,
                self.config.handler,
                wake_delivery=worker.wake,
                sidecar_limit=self.config.sidecar_limit,
                max_concurrent=self.config.max_concurrent_turns,
            )
            worker.on_acknowledged = runner.acknowledged

            async def synced() -> None:
                if not self.ready.is_set():
                    log.info("ready", extra={"user_id": session.user_id})
                    self.ready.set()
                runner.wake()

            self.ingress = Ingress(
                journal,
                client,
                state,
                IngressPolicy(
                    allow_inviters=self.config.allow_inviters,
                    timeline_limit=self.config.sync_timeline_limit,
                ),
                on_admitted=runner.wake,
                on_synced=synced,
            )
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self.ingress.run(), name="ingress")
                    group.create_task(runner.run(), name="turns")
                    group.create_task(worker.run(), name="delivery")
            except BaseExceptionGroup as failed:
                # One task failed for good (the others were cancelled because of it):
                # surface that failure itself, so callers catch MatrixError/StorageError.
                if len(failed.exceptions) == 1:
                    raise failed.exceptions[0] from failed
                raise
            finally:
                await refetcher.aclose()
                await hydrator.aclose()
                log.info("stopped", extra={"user_id": session.user_id})

    def bind(self, store: JournalStore, principal_id: str) -> PrincipalJournal:
        """The principal-bound journal every collaborator gets a view of.

        A seam for instrumentation (bench/bot.py wraps it to time each
        transaction); nothing else should need to override it.
        """
        return store.principal(principal_id)

    async def leave(self, room_id: str) -> None:
        """Leave a room: fence first (one owed report), then ask the server.

        Fencing first means the sync echo always finds the owed report it
        retires; leaving first would let a fast echo advance the epoch and the
        local fence advance it a second time.
        """
        if self.journal is None or self.client is None:
            raise RuntimeError("the bot is not running")
        outcome = await self.journal.fence_departure(room_id, source=DepartureSource.LOCAL)
        log.info("leaving", extra={"room_id": room_id, "outcome": outcome.value})
        await self.client.leave(room_id)
