"""The delivery worker and the shapes of an answer on the wire.

The worker holds only a :class:`MatrixDeliveryView`. Its loop delivers deterministically,
in order, with a crash point between each step:

1. ``claim`` commits ``attempted`` before any network I/O. From here the
   payload, target and transaction id are frozen.
2. ``PUT /send/{type}/{txn_id}``. The homeserver deduplicates a repeated
   transaction id per sending device, so a retry after a crash collapses onto
   the event the first attempt created (the device is persisted for this).
3. ``acknowledge`` commits the acknowledgement and the turn record together.
   A losing acknowledger writes neither.

An attempted row whose send failed stays attempted; ``claim`` offers it again
and it is retried with the same payload and transaction id after a backoff.

Answer contents: the INITIAL stage is a placeholder reply (``m.in_reply_to``
the source, inside its thread when it has one) marked ``pending``; progress
edits are ``m.replace`` marked ``streaming`` and are sent directly, never
through the outbox (progress is transport, never durable); the FINAL stage is an
``m.replace`` marked ``complete``, the only revision the projection keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from gapline.journal._crypto import EncryptionUnavailable
from gapline.journal._faults import FaultPoint, fault_point
from gapline.journal._progress import STREAM_STATUS_KEY
from gapline.journal._types import AckOutcome, Delivery, DeliveryStage
from gapline.journal._views import MatrixDeliveryView
from gapline.matrix import Forbidden, MatrixError, MatrixHTTPError

__all__ = [
    "DeliverySealer",
    "DeliverySender",
    "DeliveryWorker",
    "edit_content",
    "placeholder_content",
]

log = logging.getLogger("gapline.journal.worker")

PLACEHOLDER_BODY = "…"


class DeliverySender(Protocol):
    """The slice of `MatrixClient` the worker needs."""

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str | None = None,
    ) -> str: ...


def placeholder_content(source_event_id: str, thread_id: str | None) -> dict[str, Any]:
    """The INITIAL stage: a reply to the source, in its thread, marked pending."""
    relates: dict[str, Any] = {"m.in_reply_to": {"event_id": source_event_id}}
    if thread_id is not None:
        relates.update({"rel_type": "m.thread", "event_id": thread_id, "is_falling_back": False})
    return {
        "msgtype": "m.text",
        "body": PLACEHOLDER_BODY,
        STREAM_STATUS_KEY: "pending",
        "m.relates_to": relates,
    }


def edit_content(
    initial_event_id: str, body: str, *, status: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An ``m.replace`` of the placeholder: ``status`` is ``streaming`` or ``complete``.

    ``extra`` (a sidecar reference) goes into both the fallback and ``m.new_content``.
    """
    new_content: dict[str, Any] = {"msgtype": "m.text", "body": body, STREAM_STATUS_KEY: status}
    new_content.update(extra or {})
    content: dict[str, Any] = {
        "msgtype": "m.text",
        "body": f"* {body}",
        STREAM_STATUS_KEY: status,
        "m.new_content": new_content,
        "m.relates_to": {"rel_type": "m.replace", "event_id": initial_event_id},
    }
    content.update(extra or {})
    return content


AckListener = Callable[[Delivery, str], None]


class DeliverySealer(Protocol):
    """Turns a claimed row into what may be sent: its stored ciphertext in an encrypted
    room (encrypting and storing it once), the row itself elsewhere. Raises when the
    room is encrypted and the row cannot be encrypted: nothing goes out in the clear."""

    async def seal(self, delivery: Delivery) -> Delivery: ...


@dataclass
class _Backoff:
    failures: int = 0
    not_before: float = 0.0


@dataclass
class DeliveryWorker:
    """Claims, sends and acknowledges outbox rows until cancelled.

    ``wake()`` nudges it after an enqueue in this process; a poll interval
    covers enqueues it was not told about.
    """

    view: MatrixDeliveryView
    sender: DeliverySender
    on_acknowledged: AckListener | None = None
    sealer: DeliverySealer | None = None
    batch: int = 32
    poll_interval: float = 2.0
    max_backoff: float = 30.0
    coalesce: float = 0.005
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _backoff: dict[tuple[str, DeliveryStage], _Backoff] = field(default_factory=dict)
    _inflight: set[tuple[str, DeliveryStage]] = field(default_factory=set)
    _saturated: bool = False

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Deliver until cancelled, each row in its own task (owned by this TaskGroup).

        A slow send must not hold up the rows claimed after it, so rows are not
        delivered in lock-step batches here; a row still in flight is skipped
        when a later claim offers it again (it is attempted and unacknowledged).
        """
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                await self._start_due(group)
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with the wake-up, and this loop would never end.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._next_wait()):
                        await self._wake.wait()
                # Coalesce a burst of enqueues into one claim: every claim also re-marks
                # the rows still in flight, so claiming per enqueue would contend with
                # their acknowledgements for the same rows.
                await asyncio.sleep(self.coalesce)

    async def _start_due(self, group: asyncio.TaskGroup) -> None:
        free = self.batch - len(self._inflight)
        if free <= 0:
            return
        deliveries = await self.view.claim(self.batch + len(self._inflight) + len(self._backoff))
        now = time.monotonic()
        for delivery in deliveries:
            key = (delivery.delivery_id, delivery.stage)
            if key in self._inflight or self._backoff.get(key, _Backoff()).not_before > now:
                continue
            if free <= 0:
                self._saturated = True
                break
            free -= 1
            self._inflight.add(key)
            group.create_task(self._guarded(delivery), name=f"deliver {delivery.txn_id}")

    async def _guarded(self, delivery: Delivery) -> None:
        key = (delivery.delivery_id, delivery.stage)
        try:
            await self._deliver(delivery)
        except Exception:
            # A storage failure on acknowledge: the row stays attempted and is retried
            # with the same transaction id, which the homeserver collapses.
            state = self._backoff.setdefault(key, _Backoff())
            state.failures += 1
            state.not_before = time.monotonic() + min(self.max_backoff, 2.0**state.failures)
            log.exception("delivery failed", extra={"turn_id": delivery.turn_id})
        finally:
            self._inflight.discard(key)
            if self._saturated or key in self._backoff:
                # Rows were left waiting for a free slot, or this one must be retried.
                self._saturated = False
                self._wake.set()

    def _next_wait(self) -> float:
        now = time.monotonic()
        waits = [b.not_before - now for b in self._backoff.values()]
        soonest = min([w for w in waits if w > 0], default=self.poll_interval)
        return max(0.05, min(self.poll_interval, soonest))

    async def run_once(self) -> bool:
        """Claim one batch and deliver what is due, all of it before returning; True when
        something was acknowledged. (Tests and tools; `run` does not wait per batch.)"""
        deliveries = await self.view.claim(self.batch + len(self._backoff))
        now = time.monotonic()
        due = [
            d
            for d in deliveries
            if self._backoff.get((d.delivery_id, d.stage), _Backoff()).not_before <= now
        ][: self.batch]
        if not due:
            return False
        results = await asyncio.gather(*(self._deliver(d) for d in due))
        return any(results)

    async def _deliver(self, delivery: Delivery) -> bool:
        stage = delivery.stage.value
        fault_point(FaultPoint.AFTER_CLAIM_BEFORE_SEND, stage=stage)
        key = (delivery.delivery_id, delivery.stage)
        try:
            if self.sealer is not None:
                delivery = await self.sealer.seal(delivery)
            content = msgspec.json.decode(delivery.content)
            event_id = await self.sender.send_event(
                delivery.room_id, delivery.event_type, content, txn_id=delivery.txn_id
            )
        except MatrixError as exc:
            self._record_failure(key, delivery, exc)
            return False
        except EncryptionUnavailable as exc:
            self._record_failure(key, delivery, exc)
            return False
        fault_point(FaultPoint.AFTER_SEND_BEFORE_ACKNOWLEDGEMENT, stage=stage)
        outcome = await self.view.acknowledge(delivery, event_id)
        self._backoff.pop(key, None)
        fault_point(FaultPoint.AFTER_ACKNOWLEDGEMENT, stage=stage)
        log.info(
            "delivery acknowledged",
            extra={
                "turn_id": delivery.turn_id,
                "stage": delivery.stage.value,
                "room_id": delivery.room_id,
                "event_id": event_id,
                "outcome": outcome.value,
            },
        )
        if outcome is AckOutcome.ACKNOWLEDGED and self.on_acknowledged is not None:
            self.on_acknowledged(delivery, event_id)
        return outcome is AckOutcome.ACKNOWLEDGED

    def _record_failure(
        self,
        key: tuple[str, DeliveryStage],
        delivery: Delivery,
        exc: MatrixError | EncryptionUnavailable,
    ) -> None:
        state = self._backoff.setdefault(key, _Backoff())
        state.failures += 1
        # Forbidden (we left the room) is retried slowly: the row is attempted, its
        # outcome unknown, and a rejoin must still collapse onto the same event.
        # So is a row that cannot be encrypted for its room (it stays unsent, in the clear
        # nowhere): the operator has to act, and the log says what to do.
        base = 5.0 if isinstance(exc, Forbidden | EncryptionUnavailable) else 0.5
        delay = min(self.max_backoff, base * 2 ** (state.failures - 1))
        state.not_before = time.monotonic() + delay
        log.warning(
            "delivery failed; will retry with the same transaction id",
            extra={
                "turn_id": delivery.turn_id,
                "stage": delivery.stage.value,
                "room_id": delivery.room_id,
                "error": str(exc),
                "status": exc.status if isinstance(exc, MatrixHTTPError) else None,
                "retry_in_s": round(delay, 2),
            },
        )
