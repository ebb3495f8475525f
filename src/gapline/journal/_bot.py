"""A bot on the journal: sync ingress, the turn runner, the delivery worker.

One :class:`Bot` owns three long-lived tasks in one TaskGroup:

- :class:`~gapline.journal._ingress.Ingress` admits every timeline event and
  only then moves the sync token;
- :class:`~gapline.journal._turns.TurnRunner` takes pending events in receipt
  order, answers cards at once and runs the handler for each turn, one turn per
  room at a time (the steps of one answer are documented there);
- :class:`~gapline.journal._worker.DeliveryWorker` claims, sends and
  acknowledges outbox rows (answers and approval cards alike).

A restart resumes from whichever step was last committed; every resend reuses
its transaction id, so the homeserver collapses it onto the first event.

With a passphrase the bot is a full participant in encrypted rooms
(:class:`~gapline.journal._crypto.BotCrypto`, its state in the journal's database):
ingress decrypts, hydration and the point refetch read through a decrypting source,
the worker encrypts each row once before sending it, and progress edits are
encrypted too. Without one, nothing is ever sent into an encrypted room.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field

import httpx

from gapline.journal._approval_flow import DEFAULT_APPROVAL_TIMEOUT, Approvals
from gapline.journal._crypto import (
    BotCrypto,
    DecryptingSource,
    EncryptingTransport,
    RoomEncryption,
    require_device_owner,
)
from gapline.journal._handlers import Handler
from gapline.journal._hydration import Hydrator
from gapline.journal._ingress import Ingress, IngressPolicy, RuntimeState
from gapline.journal._reader import ConversationReader
from gapline.journal._refetch import PointRefetcher
from gapline.journal._sealing import require_no_seal
from gapline.journal._sidecar import DEFAULT_SIDECAR_LIMIT
from gapline.journal._store import JournalStore, PrincipalJournal
from gapline.journal._turns import TurnRunner
from gapline.journal._types import DepartureSource
from gapline.journal._worker import DeliveryWorker
from gapline.matrix import MatrixClient
from gapline.storage import Backend

__all__ = ["Bot", "BotConfig"]

log = logging.getLogger("gapline.journal.bot")


@dataclass(frozen=True, slots=True)
class BotConfig:
    homeserver: str
    user: str
    password: str
    store: str
    handler: Handler
    allow_inviters: frozenset[str] = frozenset()
    approvers: frozenset[str] = frozenset()  # who may decide approvals (empty: the asker)
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT
    sidecar_limit: int = DEFAULT_SIDECAR_LIMIT
    max_concurrent_turns: int = 32
    sync_timeline_limit: int = 100
    device_display_name: str = "gapline bot"
    passphrase: str | None = None  # the store's at-rest passphrase: encrypted rooms need it
    recovery_key: str | None = None  # restore the account's key backup before syncing

    def __repr__(self) -> str:  # never print the password or the passphrase
        return f"BotConfig(homeserver={self.homeserver!r}, user={self.user!r}, store=...)"


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
    approvals: Approvals | None = None
    crypto: BotCrypto | None = None
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
        if self.config.passphrase is not None:
            # Before anything is written: another principal's encrypted device is here.
            await require_device_owner(backend, self.config.user)
        store = await JournalStore.open(backend)
        state = await RuntimeState.open(backend, self.config.user)
        device_id = await state.device_id()
        if device_id is None:
            # Chosen and persisted before the first login, so a crash right after
            # it cannot leave sends on a device the next run does not reuse.
            device_id = await state.claim_device_id(new_device_id())
        async with MatrixClient(self.config.homeserver, transport=self.transport) as client:
            crypto = None
            if self.config.passphrase is None:
                await require_no_seal(backend, self.config.user)
            else:
                # Before the login: a wrong passphrase or a damaged crypto store fails here,
                # with nothing sent and nothing loaded.
                crypto = await BotCrypto.open(
                    backend,
                    client,
                    self.config.passphrase,
                    user_id=self.config.user,
                    device_id=device_id,
                )
            self.crypto = crypto
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
            guard = crypto if crypto is not None else RoomEncryption(client)
            if crypto is not None:
                await crypto.publish()  # a new device's keys; what a previous run queued
                log.info("end-to-end encryption on", extra=crypto.identity_keys)
            restored = ()
            if crypto is not None and self.config.recovery_key is not None:
                restored = await crypto.recover(self.config.recovery_key)
            source = client if crypto is None else DecryptingSource(client, crypto)
            refetcher = PointRefetcher(journal, source, session.user_id)
            hydrator = Hydrator(journal, source, session.user_id)
            self.reader = ConversationReader(journal, refetcher=refetcher, hydrator=hydrator)
            worker = DeliveryWorker(journal, client, sealer=guard)
            transport = EncryptingTransport(client, crypto, guard)
            self.approvals = Approvals(
                journal,
                session.user_id,
                wake_delivery=worker.wake,
                default_approvers=self.config.approvers,
                timeout=self.config.approval_timeout,
                id_key=None if crypto is None else crypto.sealing.id_key(),
            )
            runner = TurnRunner(
                journal,
                transport,
                self.reader,
                self.config.handler,
                wake_delivery=worker.wake,
                principal_id=session.user_id,
                approvals=self.approvals,
                sidecar_limit=self.config.sidecar_limit,
                max_concurrent=self.config.max_concurrent_turns,
                encrypt_media=transport.encrypt_media,
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
                crypto=crypto,
                encryption=guard if isinstance(guard, RoomEncryption) else None,
            )
            if crypto is not None and restored:
                async with crypto.lock:  # retained decryption failures the backup opens
                    await self.ingress.heal(restored)
                    await crypto.commit()
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
        return store.principal(
            principal_id, sealing=None if self.crypto is None else self.crypto.sealing
        )

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
        if self.approvals is not None:
            self.approvals.wake_all()  # what they wait on was cancelled with the fence
        await self.client.leave(room_id)
