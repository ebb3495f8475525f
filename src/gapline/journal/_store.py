"""The journal store and its principal-bound view.

:class:`JournalStore` owns the backend and the schema; runtime code only ever holds a
:class:`PrincipalJournal` (``store.principal(mxid)``), which satisfies every narrow view
in ``_views.py``. Each public method runs one operation (one transaction) on the
backend's DB thread; writes resolve only once their commit is durable.

The methods are thin: each forwards to the module-level operation in the module of the
rule it implements, which takes an open transaction and the principal id.

- ``_admission``: admit (and ``_sql_postgres``, its one-statement PostgreSQL form);
- ``_decryption``: retained decryption failures and their one upgrade;
- ``_replay``: pending, settle, consumer claims;
- ``_projection``: hydration chunks, coverage, refetch installs (the reducer itself);
- ``_projection_reads``: conversation pages, one message, coverage, refresh debts;
- ``_membership``: epochs, departure fences, owed departure reports;
- ``_outbox``: turns, enqueue, claim, acknowledge;
- ``_approvals``: approval cards, continuations, decisions;
- ``_relations``: what a reply or reaction relates to, interactive targets;
- ``_recovery``: history recovery records.

A new operation goes beside its rule there, with a forward here and a line in the
narrow view (``_views.py``) of the collaborator that calls it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from gapline.journal import (
    _admission,
    _approvals,
    _decryption,
    _epochs,
    _membership,
    _outbox,
    _projection,
    _projection_reads,
    _recovery,
    _relations,
    _replay,
)
from gapline.journal._schema import MIGRATIONS, SCHEMA
from gapline.journal._sealing import Sealing
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
    DepartureOutcome,
    DepartureSource,
    EnqueueOutcome,
    EventRole,
    InboundEvent,
    PendingEvent,
    RefreshDebt,
    Revision,
    TurnRecord,
)
from gapline.storage import Backend

__all__ = ["MAX_CHUNK_EVENTS", "JournalStore", "PrincipalJournal"]

MAX_CHUNK_EVENTS = _projection.MAX_CHUNK_EVENTS


def _positive(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise ValueError(f"limit must be a positive integer, not {limit!r}")
    return limit


class JournalStore:
    """A journal database shared by any number of principals."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    @classmethod
    async def open(cls, backend: Backend) -> JournalStore:
        """Apply the journal's migrations and return the store."""
        await backend.migrate(SCHEMA, MIGRATIONS)
        return cls(backend)

    @property
    def backend(self) -> Backend:
        return self._backend

    def principal(self, principal_id: str, *, sealing: Sealing | None = None) -> PrincipalJournal:
        """The view bound to one principal (a bot's MXID); with an active ``sealing`` every
        content it stores is sealed (``_sealing``)."""
        if not principal_id:
            raise ValueError("a principal id is required")
        return PrincipalJournal(self._backend, principal_id, sealing or Sealing())

    async def open_delegated_approval(
        self,
        card_principal: str,
        continuation_principal: str,
        request: ApprovalRequest,
        *,
        sealing: Sealing | None = None,
    ) -> Approval | None:
        """Open an approval whose card ``card_principal`` posts (say, a coordinator bot)
        for a turn of ``continuation_principal``. Each row keeps its own principal; an
        epoch advance of either reconciles both (``_approvals.reconcile_departure``).
        With an active ``sealing`` the call and the card are sealed (``_sealing``)."""
        seal = sealing or Sealing()
        return await self._backend.write(
            partial(
                _approvals.open_approval,
                card_p=card_principal,
                continuation_p=continuation_principal,
                request=replace(request, card_content=seal.data(request.card_content)),
                seal=seal,
            )
        )


class PrincipalJournal:
    """Everything one principal may do; no method takes a principal id."""

    __slots__ = ("_backend", "_outbox_channel", "_p", "_pending_channel", "_seal")

    def __init__(self, backend: Backend, principal_id: str, sealing: Sealing | None = None) -> None:
        self._backend = backend
        self._p = principal_id
        self._seal = sealing or Sealing()
        self._pending_channel = _outbox.channel("pending", principal_id)
        self._outbox_channel = _outbox.channel("outbox", principal_id)

    @property
    def principal_id(self) -> str:
        return self._p

    @property
    def pending_channel(self) -> str:
        """Channel notified (payload: receipt seq) when an event becomes pending."""
        return self._pending_channel

    @property
    def outbox_channel(self) -> str:
        """Channel notified (payload: delivery id) when a delivery is enqueued."""
        return self._outbox_channel

    # -- membership (_membership) -------------------------------------------------------

    async def epoch(self, room_id: str) -> int:
        """The room's current membership epoch (0 until the first departure)."""
        return await self._backend.read(partial(_epochs.current_epoch, p=self._p, room_id=room_id))

    async def fence_departure(
        self, room_id: str, *, source: DepartureSource, report_id: str | None = None
    ) -> DepartureOutcome:
        """Apply a departure exactly once (``_membership``); ``report_id``, the event that
        reported it, makes a redelivered report a no-op (``ALREADY_REPORTED``)."""
        return await self._backend.write(
            partial(
                _membership.fence_departure,
                p=self._p,
                room_id=room_id,
                source=source,
                report_id=report_id,
                seal=self._seal,
            )
        )

    async def rooms_owing_departure_reports(self, limit: int = 1000) -> tuple[str, ...]:
        """Rooms with a LOCAL departure whose REPORTED echo has not been seen."""
        return await self._backend.read(
            partial(_membership.rooms_owing_departure_reports, p=self._p, limit=_positive(limit))
        )

    async def retire_owed_departure_reports(self, room_id: str) -> int:
        """Drop every owed report for the room (its echo will never come); return how many."""
        return await self._backend.write(
            partial(_membership.retire_owed_departure_reports, p=self._p, room_id=room_id)
        )

    # -- admission (_admission) and replay (_replay) ----------------------------------------

    async def admit(self, event: InboundEvent, *, epoch: int) -> AdmitOutcome:
        """Journal (or deduplicate), epoch-check and project ``event`` in one transaction.

        Returns only after the commit, so a crash before it returns redelivers the event.
        """
        event, parsed = self._sealed(event)
        return await self._backend.write(
            partial(
                _admission.admit,
                p=self._p,
                event=event,
                epoch=epoch,
                parsed=parsed,
                pending_channel=self._pending_channel,
            )
        )

    def _sealed(self, event: InboundEvent) -> tuple[InboundEvent, _projection.ParsedEvent]:
        """``event`` and its projection parse, as stored: contents sealed when active."""
        parsed = _projection.parse_inbound(self._p, event)
        if not self._seal.active:
            return event, parsed
        return self._seal.event(event), replace(parsed, body=self._seal.text(parsed.body))

    async def undecrypted_events(
        self, room_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> tuple[InboundEvent, ...]:
        """Retained decryption failures (ciphertext as content), oldest first."""
        events = await self._backend.read(
            partial(_decryption.undecrypted, p=self._p, room_ids=room_ids, limit=_positive(limit))
        )
        return tuple(self._seal.open_event(e) for e in events)

    async def upgrade_decrypted(self, event: InboundEvent) -> AdmitOutcome:
        """Upgrade the retained failure of ``event.event_id`` into ``event``, once
        (``DUPLICATE`` when nothing awaits, ``STALE_EPOCH`` when a fence came between)."""
        event, parsed = self._sealed(event)
        return await self._backend.write(
            partial(
                _decryption.upgrade,
                p=self._p,
                event=event,
                parsed=parsed,
                pending_channel=self._pending_channel,
            )
        )

    async def pending(self, limit: int, *, after: int | None = None) -> tuple[PendingEvent, ...]:
        """Up to ``limit`` unsettled events in durable receipt order, after ``after``."""
        pending = await self._backend.read(
            partial(_replay.pending, p=self._p, limit=_positive(limit), after=after)
        )
        return tuple(self._seal.open_pending(e) for e in pending)

    async def settle(self, event_id: str) -> bool:
        """Terminal settlement: clears the replay input. False if already settled or unknown."""
        return await self._backend.write(partial(_replay.settle, p=self._p, event_id=event_id))

    async def claim_consumer(self, event_id: str, consumer: str) -> ConsumerClaim:
        """Claim a pending event for a semantic consumer (e.g. ``interactive_reaction``);
        rejected, and the event settled, when a departure fenced it."""
        return await self._backend.write(
            partial(_replay.claim_consumer, p=self._p, event_id=event_id, consumer=consumer)
        )

    # -- conversation reads (_projection_reads) ---------------------------------------------

    async def read_conversation(
        self,
        room_id: str,
        thread_id: str | None,
        limit: int,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
    ) -> ConversationPage:
        """The newest ``limit`` logical messages strictly before ``before`` (or, with
        ``after``, the oldest ``limit`` strictly after it), oldest first; a thread's page
        carries its root too.

        Never returns a body-cleared row: those are reported in ``owing_refresh``.
        """
        if before is not None and after is not None:
            raise ValueError("a page is read before a cursor or after one, not both")
        rows = await self._backend.read(
            partial(
                _projection_reads.conversation_rows,
                p=self._p,
                room_id=room_id,
                thread_id=thread_id,
                limit=_positive(limit),
                before=before,
                after=after,
            )
        )
        return self._seal.open_page(
            _projection_reads.conversation_page(
                rows, room_id, thread_id, limit, forward=after is not None
            )
        )

    async def message(self, room_id: str, logical_event_id: str) -> ConversationRow | None:
        """One logical message, or None when absent, tombstoned or body-cleared."""
        row = await self._backend.read(
            partial(
                _projection_reads.message,
                p=self._p,
                room_id=room_id,
                logical_event_id=logical_event_id,
            )
        )
        return None if row is None else self._seal.open_row(row)

    async def coverage(self, key: ConversationKey) -> Coverage | None:
        return await self._backend.read(partial(_projection_reads.coverage, p=self._p, key=key))

    # -- hydration (_projection) ------------------------------------------------------------

    async def project_chunk(
        self, room_id: str, events: Sequence[InboundEvent], *, expected_epoch: int
    ) -> ChunkOutcome:
        """Project one bounded chunk of fetched history (never journaled) in one
        epoch-checked transaction, through the same reducer as admission."""
        if len(events) > MAX_CHUNK_EVENTS:
            raise ValueError(f"a hydration chunk holds at most {MAX_CHUNK_EVENTS} events")
        for event in events:
            if event.room_id != room_id:
                raise ValueError(f"event {event.event_id} is not in {room_id}")
        parsed = [self._sealed(event) for event in events]
        locks = tuple(
            {
                i
                for e, parsed_event in parsed
                for i in _projection.lock_ids(parsed_event, e.event_id)
            }
        )
        return await self._backend.write(
            partial(
                _projection.project_chunk,
                p=self._p,
                room_id=room_id,
                events=parsed,
                locks=locks,
                expected_epoch=expected_epoch,
            )
        )

    async def publish_coverage(
        self, key: ConversationKey, *, reached_start: bool, messages: int, expected_epoch: int
    ) -> bool:
        """Hydration's final transaction; False (nothing written) if the epoch moved."""
        return await self._backend.write(
            partial(
                _projection.publish_coverage,
                p=self._p,
                key=key,
                reached_start=reached_start,
                messages=messages,
                expected_epoch=expected_epoch,
            )
        )

    # -- point refetch (_projection_reads, _projection) -------------------------------------

    async def refresh_debt(self, room_id: str, logical_event_id: str) -> RefreshDebt | None:
        return await self._backend.read(
            partial(
                _projection_reads.refresh_debt,
                p=self._p,
                room_id=room_id,
                logical_event_id=logical_event_id,
            )
        )

    async def install_refetched(
        self,
        room_id: str,
        logical_event_id: str,
        revision: Revision | None,
        *,
        expected_epoch: int,
        expected_refresh_token: str,
    ) -> bool:
        """Install the server's revision only if the epoch and the exact token still match.

        Success clears the token. ``revision=None``: the server holds no visible revision
        (the original is redacted), so the logical message is tombstoned.
        """
        return await self._backend.write(
            partial(
                _projection.install_refetched,
                p=self._p,
                room_id=room_id,
                logical_event_id=logical_event_id,
                revision=revision,
                body=self._seal.text(_projection.refetched_body(revision)),
                expected_epoch=expected_epoch,
                expected_refresh_token=expected_refresh_token,
            )
        )

    # -- turns and outbox (_outbox) ---------------------------------------------------------

    async def begin_turn(self, source_event_id: str) -> TurnRecord:
        return self._seal.open_turn(
            await self._backend.write(
                partial(_outbox.begin_turn, p=self._p, source_event_id=source_event_id)
            )
        )

    async def record_result(self, turn_id: str, result: bytes) -> TurnRecord:
        sealed = self._seal.data(result)
        return self._seal.open_turn(
            await self._backend.write(
                partial(_outbox.record_result, p=self._p, turn_id=turn_id, result=sealed)
            )
        )

    async def turn(self, turn_id: str) -> TurnRecord | None:
        turn = await self._backend.read(partial(_outbox.load_turn, p=self._p, turn_id=turn_id))
        return None if turn is None else self._seal.open_turn(turn)

    async def enqueue(
        self, request: DeliveryRequest, *, settle_source: bool = False
    ) -> EnqueueOutcome:
        return await self._backend.write(
            partial(
                _outbox.enqueue,
                p=self._p,
                request=replace(request, content=self._seal.data(request.content)),
                settle_source=settle_source,
                outbox_channel=self._outbox_channel,
            )
        )

    async def claim(self, limit: int) -> tuple[Delivery, ...]:
        claimed = await self._backend.write(
            partial(_outbox.claim, p=self._p, limit=_positive(limit))
        )
        return tuple(self._seal.open_delivery(d) for d in claimed)

    async def acknowledge(self, delivery: Delivery, event_id: str) -> AckOutcome:
        return await self._backend.write(
            partial(_outbox.acknowledge, p=self._p, delivery=delivery, event_id=event_id)
        )

    async def offer_reactions(
        self, turn_id: str, target_event_id: str, keys: Sequence[str]
    ) -> bool:
        """Reactions with ``keys`` on the turn's message ``target_event_id`` become turns
        (``INTERACTIVE_REACTION``); False when the turn's membership ended."""
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError("reaction keys must be non-empty strings")
        return await self._backend.write(
            partial(
                _relations.offer_reactions,
                p=self._p,
                turn_id=turn_id,
                target_event_id=target_event_id,
                keys=tuple(keys),
            )
        )

    # -- relations (_relations) and history recovery records (_recovery) ----------------

    async def event_role(self, room_id: str, event_id: str) -> EventRole | None:
        return await self._backend.read(
            partial(_relations.event_role, p=self._p, room_id=room_id, event_id=event_id)
        )

    async def record_history_gap(self, room_id: str) -> int:
        """The room's history could not be proven continuous: its conversations are cold
        again (their next read hydrates them). Returns how many were covered."""
        return await self._backend.write(
            partial(_recovery.record_history_gap, p=self._p, room_id=room_id)
        )

    # -- approvals (_approvals) -------------------------------------------------------------

    async def open_approval(self, request: ApprovalRequest) -> Approval | None:
        """Open the card and the continuation for one exact call of one of our turns, its
        card posted by us; None (nothing written) when the turn's membership ended."""
        return await self._backend.write(
            partial(
                _approvals.open_approval,
                card_p=self._p,
                continuation_p=self._p,
                request=replace(request, card_content=self._seal.data(request.card_content)),
                seal=self._seal,
            )
        )

    async def approval(self, approval_id: str) -> Approval | None:
        """The approval one of our turns waits on (wherever its card is held)."""
        return await self._backend.read(
            partial(_approvals.approval, p=self._p, approval_id=approval_id, seal=self._seal)
        )

    async def resolve_approval(
        self,
        room_id: str,
        card_event_id: str,
        *,
        decision: Decision,
        approver: str,
        answer_event_id: str,
        now: int | None = None,
    ) -> AnswerOutcome:
        """Record an answer to one of our cards; the first allowed decision wins, and the
        answering event is settled with it (unless no card of ours has that id)."""
        return await self._backend.write(
            partial(
                _approvals.resolve_approval,
                p=self._p,
                room_id=room_id,
                card_event_id=card_event_id,
                decision=decision,
                approver=approver,
                answer_event_id=answer_event_id,
                now=_now_ms() if now is None else now,
                seal=self._seal,
            )
        )

    async def expire_approval(self, approval_id: str, *, now: int | None = None) -> Approval | None:
        """Decide EXPIRED if the deadline passed undecided; the approval as it stands."""
        return await self._backend.write(
            partial(
                _approvals.expire_approval,
                p=self._p,
                approval_id=approval_id,
                now=_now_ms() if now is None else now,
                seal=self._seal,
            )
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
