"""Sync ingress: every timeline event admitted durably before the sync token moves.

The loop takes one ``/sync`` answer, admits each timeline event through the
:class:`AdmissionView` (each ``admit`` returns only after its commit), and
only then persists ``next_batch``. A crash in between redelivers the batch;
admission deduplicates by event id, so nothing is lost and nothing doubles.

Provenance is what the sync answer says, never a local guess: ``_timeline`` reads it
off the answer (``HISTORY`` for a first sync, ``LIVE``, ``RECOVERED`` for a limited
timeline and the gap its completion paged back) and ingress admits every event with
it. A gap the completion could not fetch whole is recorded
(``HistoryRecoveryRecordView``) before the token moves past it.

Room-lifecycle state (our own membership) has its own rule and is never
labelled LIVE/RECOVERED/HISTORY: an invite is a *dispatch* (join or reject,
per ``--allow-inviter``); a room under ``rooms.leave``, our leave in a
timeline, or our leave in a limited room's state block
(``room_member_sync_state_plan``) is a *reported departure* fenced exactly
once; our join seen in a room's timeline or state block is a baseline record:
events before it were sent while we were not a member and are admitted as
context, never dispatched, and the gap before it is not completed.

A reply to one of our approval cards, or a reaction to one, is admitted as
``APPROVAL_REPLY`` (``RelationView`` knows the card): it answers the card and
is never a turn of its own.

Self-authored progress edits are not admitted at all: streaming progress is
transport, never conversation content.

Encrypted rooms (with a `BotCrypto`): one sync is one crypto step under the crypto
lock. Room state and the sync's to-device events go to the machine first (the room
keys they carry decrypt this very timeline), every ``m.room.encrypted`` event is
admitted decrypted, as what it is, or as a ``DECRYPTION_FAILURE`` (retained, no answer),
the failures whose keys arrived are upgraded in place (``AdmissionView``), and only then
do the Olm state, the room keys and the sync token commit, in one transaction: a crash
before it replays the same to-device batch into the same Olm state, and admission and
the upgrade deduplicate what it redelivers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gapline.e2ee import DecryptedEvent, RoomKeyId
from gapline.journal._approval_cards import related_answer
from gapline.journal._classify import (
    MediaDownloader,
    classify_kind,
    inbound_event,
    is_own_progress,
    resolve_text,
    thread_of,
    visible_content,
)
from gapline.journal._crypto import (
    BotCrypto,
    RoomEncryption,
    as_client_event,
    decrypted_view,
    is_encrypted_event,
    session_of,
)
from gapline.journal._faults import CryptoFaultPoint, FaultPoint, fault_point
from gapline.journal._membership import MembershipView
from gapline.journal._timeline import (
    TimelineSource,
    complete_timeline,
    is_own_departure,
    is_own_membership,
    is_own_new_join,
    room_member_sync_state_plan,
)
from gapline.journal._types import (
    AdmitOutcome,
    DepartureSource,
    EventKind,
    EventRoleKind,
    InboundEvent,
    Provenance,
)
from gapline.journal._views import AdmissionView, HistoryRecoveryRecordView, RelationView
from gapline.matrix import ClientEvent, MatrixError, SyncResponse, UnknownToken
from gapline.storage import Backend, Migration, Tx

__all__ = [
    "Ingress",
    "IngressPolicy",
    "RuntimeState",
    "classify_kind",
    "inbound_event",
    "is_own_progress",
    "thread_of",
    "visible_content",
]

log = logging.getLogger("gapline.journal.ingress")

_RUNTIME_MIGRATIONS = [
    Migration(
        1,
        "runtime state: sync token and device id per principal",
        # key: 'sync_token' | 'device_id' | 'reported:<leave event id>'
        sqlite="""
        CREATE TABLE journal_runtime_state (
            principal_id TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (principal_id, key)
        )
        """,
    )
]


class RuntimeState:
    """The runtime's own per-principal facts: the sync position and the device.

    The device id must survive restarts: homeservers deduplicate transaction
    ids per device, so a new device would turn a deterministic retry into a
    second answer.
    """

    def __init__(self, backend: Backend, principal_id: str) -> None:
        self._backend = backend
        self._principal = principal_id

    @classmethod
    async def open(cls, backend: Backend, principal_id: str) -> RuntimeState:
        await backend.migrate("journal_runtime", _RUNTIME_MIGRATIONS)
        return cls(backend, principal_id)

    async def get(self, key: str) -> str | None:
        row = await self._backend.read(
            lambda tx: tx.one(
                "SELECT value FROM journal_runtime_state WHERE principal_id = ? AND key = ?",
                (self._principal, key),
            )
        )
        return None if row is None else str(row[0])

    async def put(self, key: str, value: str) -> None:
        await self._backend.write(self.put_op(key, value))

    def put_op(self, key: str, value: str) -> Callable[[Tx], None]:
        """The write of ``put``, to run inside another transaction (the crypto commit)."""

        def write(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO journal_runtime_state (principal_id, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (principal_id, key) DO UPDATE SET value = excluded.value",
                (self._principal, key, value),
            )

        return write

    async def sync_token(self) -> str | None:
        return await self.get("sync_token")

    async def save_sync_token(self, token: str) -> None:
        await self.put("sync_token", token)

    async def device_id(self) -> str | None:
        return await self.get("device_id")

    async def claim_device_id(self, candidate: str) -> str:
        """The principal's device id: the one stored, else ``candidate``, stored now.

        The first writer wins (an insert that leaves an existing row alone, then a
        read in the same transaction), so two bots racing through their first start
        both come out with the same device rather than the loser's id overwriting
        the winner's after the winner logged in with it.
        """

        def claim(tx: Tx) -> str:
            tx.execute(
                "INSERT INTO journal_runtime_state (principal_id, key, value) "
                "VALUES (?, 'device_id', ?) ON CONFLICT (principal_id, key) DO NOTHING",
                (self._principal, candidate),
            )
            row = tx.one(
                "SELECT value FROM journal_runtime_state WHERE principal_id = ? "
                "AND key = 'device_id'",
                (self._principal,),
            )
            assert row is not None  # inserted above, or there before
            return str(row[0])

        return await self._backend.write(claim)


# -- the loop ----------------------------------------------------------------------------


class SyncSource(MediaDownloader, TimelineSource, Protocol):
    async def sync(
        self,
        *,
        since: str | None = None,
        timeout_ms: int | None = None,
        filter: str | Mapping[str, Any] | None = None,
        timeline_limit: int | None = None,
        full_state: bool | None = None,
        set_presence: str | None = None,
    ) -> SyncResponse: ...

    async def join(self, room_id_or_alias: str, *, via: Sequence[str] = ()) -> str: ...

    async def leave(self, room_id: str, *, reason: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class IngressPolicy:
    """Who may invite the bot (empty: anyone) and how a sync is asked for."""

    allow_inviters: frozenset[str] = frozenset()
    timeline_limit: int = 100
    long_poll_ms: int = 10_000
    recovery_page_size: int = 100
    recovery_max_pages: int = 10
    room_concurrency: int = 32

    def may_invite(self, inviter: str) -> bool:
        return not self.allow_inviters or inviter in self.allow_inviters


class IngressJournal(
    AdmissionView, MembershipView, RelationView, HistoryRecoveryRecordView, Protocol
):
    """Ingress admits events (and upgrades decryption failures), reports departures, asks
    what a reply relates to and records gaps it could not complete: exactly these four
    views."""


@dataclass
class Ingress:
    """Owns the sync loop of one principal."""

    journal: IngressJournal
    client: SyncSource
    state: RuntimeState
    policy: IngressPolicy = field(default_factory=IngressPolicy)
    on_admitted: Callable[[], None] | None = None
    on_synced: Callable[[], Awaitable[None]] | None = None
    crypto: BotCrypto | None = None  # encrypted rooms are read only with it
    encryption: RoomEncryption | None = None  # without it: which rooms must not get plaintext
    _first_sync_done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def principal_id(self) -> str:
        return self.journal.principal_id

    async def wait_first_sync(self) -> None:
        await self._first_sync_done.wait()

    async def run(self) -> None:
        """Sync until cancelled; transient homeserver failures are retried with backoff."""
        since = await self.state.sync_token()
        if since is None:
            await self.retire_reports_of_lost_position()
        failures = 0
        while True:
            try:
                response = await self.client.sync(
                    since=since,
                    timeout_ms=0 if since is None else self.policy.long_poll_ms,
                    filter={
                        "room": {"timeline": {"limit": self.policy.timeline_limit}},
                        "presence": {"not_types": ["*"]},
                    },
                )
            except UnknownToken:
                raise  # the login is dead: retrying cannot help, the operator must know
            except MatrixError as exc:
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                log.warning("sync failed", extra={"error": str(exc), "retry_in_s": delay})
                await asyncio.sleep(delay)
                continue
            failures = 0
            await self.step(response, since=since)
            since = response.next_batch
            self._first_sync_done.set()
            if self.on_synced is not None:
                await self.on_synced()

    async def step(self, response: SyncResponse, *, since: str | None) -> None:
        """Admit one sync answer, then move the position (with the crypto state it
        produced, in one commit, when the bot has a crypto store)."""
        initial = since is None
        crypto = self.crypto
        if crypto is None:
            if self.encryption is not None:
                for room_id, room in response.rooms.join.items():
                    self.encryption.observe(room_id, [*room.state.events, *room.timeline.events])
            await self.process(response, initial=initial, since=since)
            # Only now, with every delivered event committed, may the position move.
            await self.state.save_sync_token(response.next_batch)
            return
        async with crypto.lock:
            keys = crypto.receive(response, initial=initial)
            await self.process(response, initial=initial, since=since)
            await self.heal(keys.room_keys, everything=initial)
            if response.to_device.events:
                fault_point(CryptoFaultPoint.AFTER_TO_DEVICE_BEFORE_COMMIT)
            token = self.state.put_op("sync_token", response.next_batch)
            audience = crypto.audience(response, initial=initial)

            def position(tx: Tx) -> None:
                audience(tx)
                token(tx)

            await crypto.commit(position)
            sent = await crypto.send_outgoing()
            if sent.room_keys:
                await self.heal(sent.room_keys)
                await crypto.commit()
            await crypto.back_up()

    async def heal(self, room_keys: Sequence[RoomKeyId], *, everything: bool = False) -> int:
        """Upgrade the retained decryption failures of these sessions (of every session
        the machine can now open, with ``everything``); returns how many were upgraded.
        The caller holds the crypto lock and commits the seen-index rows it adds."""
        crypto = self.crypto
        if crypto is None or not (room_keys or everything):
            return 0
        sessions = {(k.room_id, k.session_id) for k in room_keys}
        retained = await self.journal.undecrypted_events(
            None if everything else [k.room_id for k in room_keys], limit=10_000
        )
        by_room: dict[str, list[InboundEvent]] = {}
        for event in retained:
            if everything or (event.room_id, session_of(event)) in sessions:
                by_room.setdefault(event.room_id, []).append(event)
        upgraded = 0
        for room_id, events in by_room.items():
            ciphertexts = [as_client_event(e) for e in events]
            results = await crypto.decrypt(room_id, ciphertexts)
            for stored, cipher, result in zip(events, ciphertexts, results, strict=True):
                if not isinstance(result, DecryptedEvent):
                    continue
                plain = decrypted_view(cipher, result)
                if await self._upgrade(room_id, plain, stored.provenance):
                    upgraded += 1
        if upgraded:
            log.info("decryption failures upgraded", extra={"events": upgraded})
        return upgraded

    async def _upgrade(self, room_id: str, event: ClientEvent, provenance: Provenance) -> bool:
        """Admit the decrypted form of a retained failure as what it is; True if this
        call did it (a second key, a redelivery or a restart finds it done)."""
        if is_own_progress(event, self.principal_id):
            kind = EventKind.CONTEXT_ONLY  # progress is transport: recorded, never projected
        else:
            kind = await self._kind(room_id, event, provenance)
        resolved = await resolve_text(event, self.client)
        outcome = await self.journal.upgrade_decrypted(
            inbound_event(room_id, event, kind=kind, provenance=provenance, resolved_text=resolved)
        )
        admitted = outcome is AdmitOutcome.ADMITTED
        if admitted and kind is not EventKind.CONTEXT_ONLY and self.on_admitted is not None:
            self.on_admitted()
        return admitted

    async def _plaintext(
        self, room_id: str, events: Sequence[ClientEvent]
    ) -> tuple[list[ClientEvent], set[str]]:
        """The events as their senders wrote them, and the ids of those that were
        encrypted and decrypted (their failure may be retained from before)."""
        encrypted = [e for e in events if is_encrypted_event(e)]
        if not encrypted or self.crypto is None:
            return list(events), set()
        results = await self.crypto.decrypt(room_id, encrypted)
        plain: dict[str, DecryptedEvent] = {}
        for result in results:
            if isinstance(result, DecryptedEvent):
                plain[result.event_id] = result
            else:
                log.info(
                    "undecryptable event retained",
                    extra={
                        "room_id": room_id,
                        "event_id": result.event_id,
                        "session_id": result.session_id,
                        "reason": result.reason.value,
                        "refusal": None if result.refusal is None else result.refusal.value,
                    },
                )
        out = [decrypted_view(e, plain[e.event_id]) if e.event_id in plain else e for e in events]
        return out, set(plain)

    async def retire_reports_of_lost_position(self) -> int:
        """Drop every owed departure report; returns how many.

        Called when there is no sync position: a first sync never delivers the
        echo of an earlier local leave, so reports owed from before would
        otherwise swallow the next real departure of those rooms.
        """
        retired = 0
        for room_id in await self.journal.rooms_owing_departure_reports():
            retired += await self.journal.retire_owed_departure_reports(room_id)
        return retired

    async def process(
        self, response: SyncResponse, *, initial: bool, since: str | None = None
    ) -> None:
        """Admit one sync answer. Rooms are admitted concurrently (so their commits can
        share a group commit) and each room's events strictly in order: receipt order
        is per-room order, which is the order the pending worker answers in."""
        rooms = response.rooms
        room_ids = list(dict.fromkeys([*rooms.join, *rooms.leave]))
        gate = asyncio.Semaphore(self.policy.room_concurrency)

        async def one(room_id: str) -> None:
            async with gate:
                await self._process_room(response, room_id, initial=initial, since=since)

        try:
            async with asyncio.TaskGroup() as group:
                for room_id in room_ids:
                    group.create_task(one(room_id))
        except BaseExceptionGroup as failed:
            # Nothing of a failed room's batch past the failure was admitted and the
            # token does not move: the caller sees the failure itself.
            raise failed.exceptions[0] from failed
        for room_id, invited in rooms.invite.items():
            await self._invited(room_id, invited.invite_state.events)

    async def _process_room(
        self, response: SyncResponse, room_id: str, *, initial: bool, since: str | None
    ) -> None:
        joined = response.rooms.join.get(room_id)
        if joined is not None:
            plan = room_member_sync_state_plan(
                joined, principal_id=self.principal_id, initial=initial
            )
            for departure in plan.dispatch:
                # Before the timeline: its events belong to the membership that followed.
                await self._reported_departure(room_id, departure.event_id)
            for join in () if initial else plan.record:
                log.info(
                    "membership began inside the gap",
                    extra={"room_id": room_id, "event_id": join.event_id},
                )
            completed = await complete_timeline(
                self.client,
                room_id,
                joined,
                principal_id=self.principal_id,
                since=None if initial else since,
                page_size=self.policy.recovery_page_size,
                max_pages=self.policy.recovery_max_pages,
            )
            if not completed.complete:
                # Written down before the token moves past the hole: the room's
                # conversations go cold, and the next read hydrates them.
                await self.journal.record_history_gap(room_id)
            await self._admit_timeline(room_id, completed.gap, completed.provenance)
            await self._admit_timeline(room_id, completed.events, completed.provenance)
        left = response.rooms.leave.get(room_id)
        if left is not None:
            provenance = Provenance.HISTORY if initial else Provenance.LIVE
            await self._admit_timeline(room_id, left.timeline.events, provenance)
            if not any(is_own_membership(e, self.principal_id) for e in left.timeline.events):
                # A limited timeline left our leave event out: the section itself is
                # the report. (No event id to remember it by; a redelivery after a
                # crash can fence this one twice, which only advances the epoch again.)
                await self._reported_departure(room_id, None)

    async def _kind(self, room_id: str, event: ClientEvent, provenance: Provenance) -> EventKind:
        """The runtime's kind for ``event``; a reply or reaction to one of our approval
        cards is an ``APPROVAL_REPLY`` (the card's event id is known by then: its
        delivery was acknowledged before anyone could see the card to answer it, or the
        dispatcher holds the answer back until it is)."""
        if is_encrypted_event(event):
            return EventKind.DECRYPTION_FAILURE  # still ciphertext: no key, or no crypto store
        kind = classify_kind(event, self.principal_id, provenance)
        if kind not in (EventKind.ACTIONABLE, EventKind.REACTION):
            return kind
        if event.sender == self.principal_id or provenance is Provenance.HISTORY:
            return kind
        answer = related_answer(event.type, event.content)
        if answer is None:
            return kind
        role = await self.journal.event_role(room_id, answer.target_event_id)
        if role is not None and role.kind is EventRoleKind.APPROVAL_CARD:
            return EventKind.APPROVAL_REPLY
        return kind

    async def _admit_timeline(
        self, room_id: str, events: Sequence[ClientEvent], provenance: Provenance
    ) -> int:
        """Admit ``events`` in order; returns how many departures of ours they reported.

        Our own leave is a room-lifecycle event: it is journaled like any other
        event but, in addition, reported to the membership fence at its place in
        the timeline, and the epoch is re-read so later events of the same batch
        (a rejoin) are admitted under the membership they belong to.
        """
        if not events:
            return 0
        events, decrypted = await self._plaintext(room_id, events)
        echoes = 0
        epoch = await self.journal.epoch(room_id)
        # Baseline record: what the timeline holds from before our (re)join was said
        # while we were not a member. It is journaled and projected as context, never
        # dispatched; its provenance label is left as the sync gave it.
        joined_at = max(
            (i + 1 for i, e in enumerate(events) if is_own_new_join(e, self.principal_id)),
            default=0,
        )
        for index, event in enumerate(events):
            if is_own_progress(event, self.principal_id):
                continue
            kind = await self._kind(room_id, event, provenance)
            if index < joined_at and kind is EventKind.ACTIONABLE:
                kind = EventKind.CONTEXT_ONLY
            resolved = await resolve_text(event, self.client)
            inbound = inbound_event(
                room_id, event, kind=kind, provenance=provenance, resolved_text=resolved
            )
            if index < joined_at and kind is EventKind.DECRYPTION_FAILURE:
                # Healed later, it is still what was said before we came: context.
                inbound = replace(inbound, before_join=True)
            outcome = await self.journal.admit(inbound, epoch=epoch)
            if outcome is AdmitOutcome.DUPLICATE and event.event_id in decrypted:
                # Redelivered with its key this time: its retained failure, if any, is
                # upgraded now (once: the row's own state guards it).
                outcome = await self.journal.upgrade_decrypted(inbound)
            if outcome is AdmitOutcome.STALE_EPOCH:
                # Membership moved under this batch (a local leave): the event belongs to
                # the membership that ended, and the new epoch must not inherit it.
                log.info(
                    "event refused by membership fence",
                    extra={"room_id": room_id, "event_id": event.event_id},
                )
            elif outcome is AdmitOutcome.ADMITTED and kind is not EventKind.CONTEXT_ONLY:
                if kind is EventKind.ACTIONABLE:
                    fault_point(FaultPoint.AFTER_ADMISSION_BEFORE_DISPATCH)
                if self.on_admitted is not None:
                    self.on_admitted()
            if is_own_departure(event, self.principal_id):
                echoes += 1
                await self._reported_departure(room_id, event.event_id)
                epoch = await self.journal.epoch(room_id)
        return echoes

    async def _reported_departure(self, room_id: str, leave_event_id: str | None) -> None:
        """Fence a departure the server reported, once per leave event.

        The leave event's id is the report's identity, recorded by the store in the
        fence's own transaction, so a batch redelivered after a crash (or after a
        cancellation between the two) does not fence twice, and two leaves before one
        sync are two reports, each retiring the report its local leave owes. (Stores
        written by an earlier gapline remembered reports in the runtime state; those
        markers are still honoured.)
        """
        legacy = None if leave_event_id is None else f"reported:{leave_event_id}"
        if legacy is not None and await self.state.get(legacy) is not None:
            return
        outcome = await self.journal.fence_departure(
            room_id, source=DepartureSource.REPORTED, report_id=leave_event_id
        )
        log.info(
            "departure reported",
            extra={"room_id": room_id, "event_id": leave_event_id, "outcome": outcome.value},
        )

    async def _invited(self, room_id: str, invite_state: Sequence[Any]) -> None:
        inviter = next(
            (
                e.sender
                for e in invite_state
                if e.type == "m.room.member" and e.state_key == self.principal_id
            ),
            None,
        )
        if inviter is not None and self.policy.may_invite(inviter):
            try:
                await self.client.join(room_id)
                log.info("joined on invite", extra={"room_id": room_id, "inviter": inviter})
            except MatrixError as exc:
                log.warning("join failed", extra={"room_id": room_id, "error": str(exc)})
            return
        try:
            await self.client.leave(room_id, reason="inviter not allowed")
        except MatrixError as exc:
            log.warning("invite rejection failed", extra={"room_id": room_id, "error": str(exc)})
        else:
            log.info("invite rejected", extra={"room_id": room_id, "inviter": inviter})
