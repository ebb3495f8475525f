"""Narrow structural views of one principal's journal.

Eleven views: the ten below and :class:`~gapline.journal._membership.MembershipView`,
which lives with the fence it calls. Each collaborator takes the slice it calls, and ty
enforces it: a hydrator holding a :class:`HydrationView` that reaches for ``enqueue``,
or an approval collaborator reaching for the worker's ``claim``, fails the type check
before any test runs. :class:`gapline.journal.PrincipalJournal` satisfies every view;
none of these methods takes a principal id.

Who holds what: ingress ``AdmissionView`` + ``MembershipView`` + ``RelationView`` +
``HistoryRecoveryRecordView``; the turn runner ``ReplayView`` + ``DispatchView`` +
``PendingTurnView`` + ``RelationView``; the hydrator and the point refetch
``HydrationView``; reads and exports ``ConversationReadView``; the delivery worker only
``MatrixDeliveryView``; approvals only ``ApprovalDeliveryView``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gapline.journal._types import (
    AckOutcome,
    AdmitOutcome,
    AnswerOutcome,
    Approval,
    ApprovalRequest,
    ChunkOutcome,
    ConsumerClaim,
    ConversationKey,
    ConversationPage,
    ConversationRow,
    Coverage,
    Cursor,
    Decision,
    Delivery,
    DeliveryRequest,
    EnqueueOutcome,
    EventRole,
    InboundEvent,
    PendingEvent,
    RefreshDebt,
    Revision,
    TurnRecord,
)

__all__ = [
    "AdmissionView",
    "ApprovalDeliveryView",
    "ConversationReadView",
    "DispatchView",
    "HistoryRecoveryRecordView",
    "HydrationView",
    "MatrixDeliveryView",
    "PendingTurnView",
    "RelationView",
    "ReplayView",
]


class AdmissionView(Protocol):
    """Sync ingress: durable admission, returning only after the commit."""

    @property
    def principal_id(self) -> str: ...

    async def epoch(self, room_id: str) -> int: ...

    async def admit(self, event: InboundEvent, *, epoch: int) -> AdmitOutcome: ...

    # A decryption failure is admitted retained (no answer) and upgraded once, in place,
    # when its room key arrives: the second half of its admission (``_decryption``).
    async def undecrypted_events(
        self, room_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> tuple[InboundEvent, ...]: ...

    async def upgrade_decrypted(self, event: InboundEvent) -> AdmitOutcome: ...


class ReplayView(Protocol):
    """The pending worker: committed events in receipt order, terminal settlement."""

    @property
    def pending_channel(self) -> str: ...

    async def pending(
        self, limit: int, *, after: int | None = None
    ) -> tuple[PendingEvent, ...]: ...

    async def settle(self, event_id: str) -> bool: ...


class DispatchView(Protocol):
    """Semantic consumers (interactive reactions) claiming a pending event; a claim
    racing a departure is refused and settles the event against the new epoch."""

    async def claim_consumer(self, event_id: str, consumer: str) -> ConsumerClaim: ...

    async def settle(self, event_id: str) -> bool: ...


class PendingTurnView(Protocol):
    """A turn from its source to its durable handoff: the result before the final
    enqueue, enqueue-and-settle in one transaction, reactions the turn asks for, and the
    room's epoch (a turn of an older one is abandoned)."""

    async def epoch(self, room_id: str) -> int: ...

    async def begin_turn(self, source_event_id: str) -> TurnRecord: ...

    async def record_result(self, turn_id: str, result: bytes) -> TurnRecord: ...

    async def turn(self, turn_id: str) -> TurnRecord | None: ...

    async def enqueue(
        self, request: DeliveryRequest, *, settle_source: bool = False
    ) -> EnqueueOutcome: ...

    async def offer_reactions(
        self, turn_id: str, target_event_id: str, keys: Sequence[str]
    ) -> bool: ...


class RelationView(Protocol):
    """What the journal knows about an event another one relates to (a reply, a
    reaction): one of our approval cards, an interactive message, or nothing."""

    async def event_role(self, room_id: str, event_id: str) -> EventRole | None: ...


class ConversationReadView(Protocol):
    """Prompt assembly and export: bounded pages, never a body-cleared row."""

    async def read_conversation(
        self,
        room_id: str,
        thread_id: str | None,
        limit: int,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
    ) -> ConversationPage: ...

    async def message(self, room_id: str, logical_event_id: str) -> ConversationRow | None: ...

    async def coverage(self, key: ConversationKey) -> Coverage | None: ...


class HistoryRecoveryRecordView(Protocol):
    """Writing down that a room's history could not be proven continuous, and nothing
    else: the writer is ingress, deciding about the sync position, and nothing it could
    read back may steer that decision."""

    async def record_history_gap(self, room_id: str) -> int: ...


class HydrationView(Protocol):
    """Building a conversation from the server (bounded, epoch-checked chunks, then one
    coverage publication) and repairing one message of it (the point refetch: install
    only while the epoch and the exact refresh token still match)."""

    async def epoch(self, room_id: str) -> int: ...

    async def project_chunk(
        self, room_id: str, events: Sequence[InboundEvent], *, expected_epoch: int
    ) -> ChunkOutcome: ...

    async def publish_coverage(
        self, key: ConversationKey, *, reached_start: bool, messages: int, expected_epoch: int
    ) -> bool: ...

    async def coverage(self, key: ConversationKey) -> Coverage | None: ...

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


class MatrixDeliveryView(Protocol):
    """The generic delivery worker accepts only this: claim before I/O, acknowledge
    after. It delivers every row, an approval card's too, and can write nothing else."""

    @property
    def outbox_channel(self) -> str: ...

    async def claim(self, limit: int) -> tuple[Delivery, ...]: ...

    async def acknowledge(self, delivery: Delivery, event_id: str) -> AckOutcome: ...


class ApprovalDeliveryView(Protocol):
    """Approval collaborators accept only this: exact-call cards and their
    continuations. A card's delivery is written here, never by the generic enqueue;
    its transport (claim, send, acknowledge) is the generic worker's."""

    async def open_approval(self, request: ApprovalRequest) -> Approval | None: ...

    async def approval(self, approval_id: str) -> Approval | None: ...

    async def resolve_approval(
        self,
        room_id: str,
        card_event_id: str,
        *,
        decision: Decision,
        approver: str,
        answer_event_id: str,
        now: int,
    ) -> AnswerOutcome: ...

    async def expire_approval(self, approval_id: str, *, now: int) -> Approval | None: ...
