"""Narrow structural views of one principal's journal.

Each collaborator takes the slice it calls, and ty enforces it: a hydrator holding a
:class:`HydrationView` that reaches for ``enqueue`` fails the type check before any
test runs. :class:`gapline.journal.PrincipalJournal` satisfies every view; none of
these methods takes a principal id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gapline.journal._types import (
    AckOutcome,
    AdmitOutcome,
    ChunkOutcome,
    ConsumerClaim,
    ConversationKey,
    ConversationPage,
    ConversationRow,
    Coverage,
    Cursor,
    Delivery,
    DeliveryRequest,
    DepartureOutcome,
    DepartureSource,
    EnqueueOutcome,
    InboundEvent,
    PendingEvent,
    RefreshDebt,
    Revision,
    TurnRecord,
)

__all__ = [
    "AdmissionView",
    "ConversationReadView",
    "DeliveryView",
    "DispatchView",
    "HydrationView",
    "MembershipView",
    "PendingView",
    "RefetchView",
    "ReplayView",
    "TurnView",
]


class AdmissionView(Protocol):
    """Sync ingress: durable admission, returning only after the commit."""

    @property
    def principal_id(self) -> str: ...

    async def epoch(self, room_id: str) -> int: ...

    async def admit(self, event: InboundEvent, *, epoch: int) -> AdmitOutcome: ...


class ReplayView(Protocol):
    """The pending worker: committed events in receipt order, terminal settlement."""

    @property
    def pending_channel(self) -> str: ...

    async def pending(
        self, limit: int, *, after: int | None = None
    ) -> tuple[PendingEvent, ...]: ...

    async def settle(self, event_id: str) -> bool: ...


PendingView = ReplayView


class DispatchView(Protocol):
    """Semantic consumers (interactive reactions) claiming a pending event."""

    async def claim_consumer(self, event_id: str, consumer: str) -> ConsumerClaim: ...

    async def settle(self, event_id: str) -> bool: ...


class ConversationReadView(Protocol):
    """Prompt assembly and export: bounded pages, never a body-cleared row."""

    async def read_conversation(
        self, room_id: str, thread_id: str | None, limit: int, *, before: Cursor | None = None
    ) -> ConversationPage: ...

    async def message(self, room_id: str, logical_event_id: str) -> ConversationRow | None: ...

    async def coverage(self, key: ConversationKey) -> Coverage | None: ...


class HydrationView(Protocol):
    """The hydrator: bounded epoch-checked chunks, then one coverage publication."""

    async def epoch(self, room_id: str) -> int: ...

    async def project_chunk(
        self, room_id: str, events: Sequence[InboundEvent], *, expected_epoch: int
    ) -> ChunkOutcome: ...

    async def publish_coverage(
        self, key: ConversationKey, *, reached_start: bool, messages: int, expected_epoch: int
    ) -> bool: ...

    async def coverage(self, key: ConversationKey) -> Coverage | None: ...


class RefetchView(Protocol):
    """The point refetch: install only if epoch and token still match."""

    async def epoch(self, room_id: str) -> int: ...

    async def refresh_debt(self, room_id: str, logical_event_id: str) -> RefreshDebt | None: ...

    async def install_refetched(
        self,
        room_id: str,
        logical_event_id: str,
        revision: Revision | None,
        *,
        expected_epoch: int,
        expected_refresh_token: str,
    ) -> bool: ...


class MembershipView(Protocol):
    """Membership fences, each departure applied exactly once across restarts."""

    async def epoch(self, room_id: str) -> int: ...

    async def fence_departure(
        self, room_id: str, *, source: DepartureSource
    ) -> DepartureOutcome: ...

    async def rooms_owing_departure_reports(self, limit: int = 1000) -> tuple[str, ...]: ...

    async def retire_owed_departure_reports(self, room_id: str) -> int: ...


class TurnView(Protocol):
    """The turn runner: durable handler result, then enqueue-and-settle."""

    async def begin_turn(self, source_event_id: str) -> TurnRecord: ...

    async def record_result(self, turn_id: str, result: bytes) -> TurnRecord: ...

    async def turn(self, turn_id: str) -> TurnRecord | None: ...

    async def enqueue(
        self, request: DeliveryRequest, *, settle_source: bool = False
    ) -> EnqueueOutcome: ...


class DeliveryView(Protocol):
    """The delivery worker accepts only this: claim before I/O, acknowledge after."""

    @property
    def outbox_channel(self) -> str: ...

    async def claim(self, limit: int) -> tuple[Delivery, ...]: ...

    async def acknowledge(self, delivery: Delivery, event_id: str) -> AckOutcome: ...
