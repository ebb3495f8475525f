"""The client engine: one account's event cache, its sync loop, one history operation per room.

::

    async with Engine.open(store_dir, client, passphrase="pw", sink=publisher) as engine:
        answer = await engine.execute(OpenRoom("!r:example.org"))
        items = engine.timeline("!r:example.org").state.items

:class:`Engine` is the facade: it opens the store, owns the tasks and
dispatches commands. The work lives beside it:

- ``_open_rooms``: the open rooms (opening, closing, cancelling, reloading);
- ``_operations``: each room's one operation slot, and how cancelling an
  operation becomes its published outcome;
- ``_walks``: the operations themselves (recent load, fill, back-pagination);
- ``_drive``: the driver of one backwards walk (fetch, commit, flush);
- ``_sync``: the sync loop and the ingestion of a sync answer;
- ``_commits``: the one path every history write takes;
- ``_sending``: the commands that write to a room (messages, reactions,
  redactions, edits, read markers, typing);
- ``_send_queue``: the durable send queue messages go through, and its worker;
- ``_joining``: joining, leaving, invites, creating rooms, topics;
- ``_threads``: thread views; ``_quotes``: fetching replied-to events;
- ``_backup_fetch``: keys from the key backup for what the open rooms show;
- ``_verifying``: interactive verification (SAS) flows, fed from sync.

Task ownership: the engine owns one ``TaskGroup``. In it run the sync loop,
the send queue's worker, the key-backup fetch (``_backup_fetch``, with
``e2ee``) and, per open room, at most one *operation*. ``Cancel``, ``CloseRoom`` and
``Shutdown`` cancel an operation; the operation itself turns the cancellation
into its published outcome (``Cancelled``) and its answer (``Interrupted``),
so every outcome is published by the task that owns it.

Ordering: every write of history goes through ``Commits``, which queues a
write's updates on the room's timeline in commit order; a commit is shielded,
so a cancelled caller never loses the updates of a write that landed. A
command's answer is returned only after its outcome was published (``await
sink.publish``) and its timeline fenced with ``flush_history``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from gapline.e2ee import Device, KeyUpdates, RestoreReport
from gapline.history._backup_fetch import BackupFetcher
from gapline.history._cache_store import CacheStore, Cipher
from gapline.history._commits import Commits
from gapline.history._crypto import EngineCrypto
from gapline.history._joining import Joining, MembershipCommand
from gapline.history._open_rooms import OpenRooms
from gapline.history._operations import Operations, Room
from gapline.history._quotes import Quotes
from gapline.history._send_queue import SendQueue
from gapline.history._sending import Sending
from gapline.history._store_lock import store_locked
from gapline.history._sync import Sync
from gapline.history._threads import Threads
from gapline.history._timeline import Timeline
from gapline.history._types import (
    Answer,
    Cancel,
    CancelSend,
    CloseRoom,
    Command,
    DumpState,
    EditMessage,
    EngineConfig,
    Event,
    EventNotFound,
    Failed,
    FillGap,
    HistoryRepair,
    Interrupted,
    Invalid,
    MarkRead,
    Ok,
    OpenRoom,
    OpenThread,
    PaginateBackwards,
    RecentHistoryState,
    RedactEvent,
    RetryRecent,
    RetrySend,
    RoomNotOpen,
    SendMessage,
    SendReaction,
    SetTyping,
    ShrinkTimeline,
    Shutdown,
)
from gapline.history._upgrade import finish_upgrades
from gapline.history._verifying import VerifyCommand, Verifying
from gapline.history._walks import Walks
from gapline.matrix import MatrixClient, SyncResponse
from gapline.storage import Backend, open_backend, open_cipher, tune_sqlite_writer

__all__ = ["Engine"]

STORE_FILE = "history.sqlite3"

# The event-id index is keyed by hashes, so a sync's inserts land on random
# index pages: a 1,000-event commit dirties ~600 index pages at 100,000
# retained events (~2.7 MB of WAL, against ~0.4 MB for the rows themselves).
# A 32 MiB writer cache keeps them in memory, and checkpointing every 8,192
# WAL pages copies each such page to the database file once rather than once
# per commit or two (the WAL may grow to ~32 MB between checkpoints).
WRITER_CACHE_KIB = 32 * 1024
WAL_CHECKPOINT_PAGES = 8192


class Engine:
    """The history engine of one account over one store. Build it with :meth:`open`."""

    def __init__(
        self,
        store: CacheStore,
        client: MatrixClient | None,
        *,
        config: EngineConfig,
        publish: Callable[[Event], Awaitable[None]],
        tg: asyncio.TaskGroup,
        sync_timeline_limit: int | None,
        sync_timeout_ms: int,
        e2ee: bool = False,
    ) -> None:
        self.store = store
        self.crypto = EngineCrypto(store, client) if e2ee and client is not None else None
        self.client = client
        self.config = config
        self._publish = publish
        self._tg = tg
        self._rooms: dict[str, Room] = {}
        self._commits = Commits(store, self._rooms)
        self._operations = Operations(tg)
        self.backup_fetch: BackupFetcher | None = None
        """Keys fetched from the key backup for what the open rooms show (with ``e2ee``)."""
        if self.crypto is not None:
            self.backup_fetch = BackupFetcher(self.crypto, store, self._rooms, self._heal_keys)
        self._walks = Walks(
            store=store,
            client=client,
            config=config,
            publish=publish,
            rooms=self._rooms,
            commits=self._commits,
            operations=self._operations,
            crypto=self.crypto,
            backup=self.backup_fetch,
        )
        self._send_queue = SendQueue(
            store,
            client,
            self._commits,
            self.flush_history,
            publish,
            backoff=config.send_backoff_s,
            crypto=self.crypto,
        )
        self._verifying = None if self.crypto is None else Verifying(self.crypto, publish, tg)
        self._quotes = Quotes(client, self._commits, tg, self.flush_history, crypto=self.crypto)
        self._open_rooms = OpenRooms(
            self._rooms,
            store=store,
            config=config,
            publish=publish,
            operations=self._operations,
            walks=self._walks,
            quotes=self._quotes,
            backup=self.backup_fetch,
            joined=lambda: self._sync.joined,
        )
        self._sync = Sync(
            store,
            client,
            self._commits,
            self.flush_history,
            timeline_limit=sync_timeline_limit,
            timeout_ms=sync_timeout_ms,
            typing=self._open_rooms.typing,
            crypto=self.crypto,
            after_ingest=self._synced,
            verifying=self._verifying,
        )
        self._sending = Sending(store, client, self._commits, self.flush_history, self._send_queue)
        self._threads = Threads(
            store=store,
            client=client,
            config=config,
            publish=publish,
            commits=self._commits,
            walks=self._walks,
            on_quotes=self._open_rooms.quotes_wanted,
            crypto=self.crypto,
        )
        self._joining = Joining(
            client, joined=self._note_joined, left=self._note_left, close=self._open_rooms.close
        )
        store.me = None if client is None else client.user_id
        self._sync_task: asyncio.Task[None] | None = None
        self._send_task: asyncio.Task[None] | None = None
        self._fetch_task: asyncio.Task[None] | None = None
        if self.backup_fetch is not None:
            self._fetch_task = tg.create_task(self.backup_fetch.run(), name="history-key-fetch")
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        store: str | os.PathLike[str] | Backend,
        client: MatrixClient | None,
        *,
        config: EngineConfig | None = None,
        passphrase: str,
        sink: Any = None,
        sync: bool = True,
        send: bool | None = None,
        sync_timeline_limit: int | None = None,
        sync_timeout_ms: int = 30_000,
        kdf_cost: Any = None,
        cipher: Cipher | None = None,
        e2ee: bool = False,
    ) -> AsyncGenerator[Engine]:
        """Open the store (checking the passphrase before anything else), start syncing.

        ``store`` is a directory (the SQLite file ``history.sqlite3`` in it),
        or an open :class:`~gapline.storage.Backend` (left open on exit).
        ``sink`` is an ``EventSink`` (``await sink.publish(event)``); ``None``
        publishes nowhere. ``sync=False`` runs no sync loop (drive it with
        :meth:`sync_once`). ``send`` starts the send queue's worker (default: with the
        sync loop; :meth:`start_sync` starts it too). A wrong passphrase raises
        :class:`~gapline.storage.WrongPassphrase` before any network request. A store
        directory is one engine's at a time: opening it while another engine has it open
        raises :class:`StoreInUse` (see ``_store_lock``); a backend passed in is the
        caller's to keep to one engine.
        ``e2ee=True`` takes part in encrypted rooms: the device's crypto machine lives
        in the same store, opened once the client is logged in (at the first sync).
        """
        own_backend = isinstance(store, (str, os.PathLike))
        with contextlib.ExitStack() as held:
            if isinstance(store, (str, os.PathLike)):
                held.enter_context(store_locked(Path(store)))
                backend: Backend = await open_backend(str(Path(store) / STORE_FILE))
            else:
                backend = store
            try:
                if cipher is None:
                    cipher = await open_cipher(backend, passphrase, kdf_cost=kdf_cost)
                cache = await CacheStore.open(backend, cipher)
                await finish_upgrades(cache)
                if own_backend:
                    # Only a file of the engine's own: a backend passed in keeps its settings.
                    await tune_sqlite_writer(
                        backend,
                        cache_kib=WRITER_CACHE_KIB,
                        wal_autocheckpoint_pages=WAL_CHECKPOINT_PAGES,
                    )

                async def publish(event: Event) -> None:
                    if sink is not None:
                        await sink.publish(event)

                async with asyncio.TaskGroup() as tg:
                    engine = cls(
                        cache,
                        client,
                        config=config or EngineConfig(),
                        publish=publish,
                        tg=tg,
                        sync_timeline_limit=sync_timeline_limit,
                        sync_timeout_ms=sync_timeout_ms,
                        e2ee=e2ee,
                    )
                    await engine._send_queue.announce()
                    if sync and client is not None:
                        engine.start_sync()
                    elif send and client is not None:
                        engine.start_sending()
                    try:
                        yield engine
                    finally:
                        await engine._shutdown()
            finally:
                if own_backend:
                    await backend.close()

    def start_sync(self) -> None:
        """Start the sync loop (once; later calls do nothing).

        For an engine opened with ``sync=False`` whose client logs in only after
        the store was opened (``gapline bridge``: a wrong passphrase must fail
        before any network request).
        """
        if self._sync_task is not None or self._closed:
            return
        if self.client is None:
            raise ValueError("an engine without a homeserver client cannot sync")
        self.store.me = self.client.user_id
        self._sync_task = self._tg.create_task(self._sync.run(), name="history-sync")
        self.start_sending()

    def start_sending(self) -> None:
        """Start the send queue's worker (once; :meth:`start_sync` does it too). Messages
        queued before, in this run or an earlier one, go out in order."""
        if self._send_task is not None or self._closed or self.client is None:
            return
        self.store.me = self.client.user_id
        self._send_task = self._tg.create_task(self._send_queue.run(), name="history-send")

    async def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for room_id in list(self._rooms):
            await self._open_rooms.close(room_id)
        for task in (self._sync_task, self._send_task, self._fetch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._verifying is not None:
            await self._verifying.close()
        await self._commits.drain()
        if self.crypto is not None:
            await self.crypto.close()

    # -- public surface --------------------------------------------------------------------

    def timeline(self, room_id: str) -> Timeline:
        """The open room's timeline; ``KeyError`` when the room is not open."""
        return self._rooms[room_id].timeline

    @property
    def me(self) -> str | None:
        """The account's user id (``None`` offline, or before the client logged in)."""
        return self.store.me or (None if self.client is None else self.client.user_id)

    def is_encrypted(self, room_id: str) -> bool:
        """The room's state says it is encrypted (as this device's crypto machine knows it;
        ``False`` for an engine opened without ``e2ee``)."""
        return self.crypto is not None and self.crypto.is_encrypted(room_id)

    def devices(self, user_ids: Iterable[str]) -> dict[str, tuple[Device, ...]]:
        """The devices known of each user (keys checked, each with its trust level), for a
        device list; empty before the machine has queried them."""
        driver = None if self.crypto is None else self.crypto.driver
        if driver is None:
            return {u: () for u in user_ids}
        return {
            u: tuple(d for d in driver.machine.devices_of(u) if not d.deleted) for u in user_ids
        }

    def is_open(self, room_id: str) -> bool:
        return self._open_rooms.get(room_id) is not None

    def recent_state(self, room_id: str) -> RecentHistoryState:
        room = self._rooms.get(room_id)
        return RecentHistoryState.IDLE if room is None else room.recent

    async def flush_history(self, room_id: str | None = None) -> None:
        """Fence: apply and publish whatever the cache queued (one room or all open rooms,
        with their open threads)."""
        rooms = [self._rooms[room_id]] if room_id in self._rooms else []
        if room_id is None:
            rooms = list(self._rooms.values())
        for room in rooms:
            await room.timeline.flush_history()
            for thread in list(room.threads.values()):
                await thread.timeline.flush_history()

    def thread(self, room_id: str, thread_root: str) -> Timeline:
        """An open thread's timeline; ``KeyError`` when it is not open."""
        return self._rooms[room_id].threads[thread_root].timeline

    async def sync_once(
        self, *, timeout_ms: int = 0, since: str | None = None, initial: bool = False
    ) -> SyncResponse:
        """One ``/sync`` from the stored token (or ``since``; ``initial``: from nothing),
        committed (events, then the token, in one transaction) and flushed to the open
        timelines."""
        return await self._sync.once(timeout_ms=timeout_ms, since=since, initial=initial)

    async def recover_keys(self, recovery_key: str, *, restore_all: bool = False) -> RestoreReport:
        """Recover the account's keys with its recovery key (secret storage, then the
        server-side key backup). Its keys are then fetched as the rooms show them (see
        ``_backup_fetch``); ``restore_all`` restores the whole backup now instead, and
        heals in place every retained undecryptable row its keys open. Needs a
        logged-in client and ``e2ee``; a wrong key (`WrongRecoveryKey`) changes nothing."""
        if self.crypto is None:
            raise RuntimeError("the engine was opened without end-to-end encryption")
        report = await self.crypto.recover(recovery_key, restore=restore_all)
        await self._heal_keys(KeyUpdates(room_keys=report.imported))
        if self.backup_fetch is not None:
            for room_id in self._rooms:
                self.backup_fetch.opened(room_id)
            self.backup_fetch.wake()
        return report

    async def _heal_keys(self, updates: KeyUpdates) -> None:
        assert self.crypto is not None
        await self._sync.after_keys(self.crypto, updates)

    async def _synced(self) -> None:
        await self._send_queue.synced()
        if self.backup_fetch is not None:
            self.backup_fetch.wake()

    async def ingest(self, response: SyncResponse) -> None:
        """Commit one sync answer: every joined room's events and gaps, then ``next_batch``.

        The token is written in the same transaction as the events it delivered,
        so a crash can never persist a token whose events were lost.
        """
        await self._sync.ingest(response)

    async def wait_synced(self, count: int = 1) -> None:
        """Wait until the sync loop committed ``count`` syncs in total (tests, tools)."""
        await self._sync.wait(count)

    async def wait_idle(self, room_id: str, thread_root: str | None = None) -> None:
        """Wait until the open room's (or thread's) running operation, if any, settled
        (tests, tools: a thread's recent load runs in the background like a room's)."""
        room = self._open_rooms.get(room_id, thread_root)
        while room is not None and room.op is not None:
            op = room.op
            await op.launched.wait()
            if op.task is not None:
                await asyncio.wait([op.task])
            if room.op is op:
                break

    async def wait_quotes(self) -> None:
        """Wait until no replied-to event is being fetched (tests, tools)."""
        await self._quotes.wait()

    @property
    def send_queue(self) -> SendQueue:
        """The durable send queue (its counts, ``wait_sent`` for tests and tools)."""
        return self._send_queue

    @property
    def sync_count(self) -> int:
        return self._sync.count

    @property
    def sync_error(self) -> str | None:
        """Why the last sync failed (``None`` once one succeeds again)."""
        return self._sync.error

    async def execute(self, command: Command) -> Answer:
        """Run one command; its answer comes after its outcome was published."""
        if self._closed:
            # Shutdown stopped it before it ran, and a command stopped by
            # Cancel/CloseRoom/Shutdown answers Interrupted (nothing failed).
            # A second Shutdown has nothing left to do.
            return Ok() if isinstance(command, Shutdown) else Interrupted()
        match command:
            case OpenRoom(room_id=room_id):
                return await self._open_rooms.open(room_id)
            case CloseRoom(room_id=room_id):
                if self._open_rooms.get(room_id) is None:
                    return RoomNotOpen()
                await self._open_rooms.close(room_id)
                return Ok()
            case HistoryRepair(command=FillGap(room_id=room_id, gap_id=gap_id)):
                room = self._open_rooms.get(room_id)
                if room is None:
                    return RoomNotOpen()
                return await self._walks.fill_gap(
                    await self._open_rooms.gap_holder(room, gap_id), gap_id
                )
            case HistoryRepair(command=RetryRecent(room_id=room_id)):
                room = self._open_rooms.get(room_id)
                return RoomNotOpen() if room is None else await self._walks.retry_recent(room)
            case HistoryRepair(command=Cancel(room_id=room_id)):
                return await self._open_rooms.cancel(room_id, self.flush_history)
            case PaginateBackwards(room_id=room_id, count=count, thread_root=root):
                room = self._open_rooms.get(room_id, root)
                return RoomNotOpen() if room is None else await self._walks.paginate(room, count)
            case (
                SendMessage()
                | SendReaction()
                | RedactEvent()
                | EditMessage()
                | MarkRead()
                | SetTyping()
            ):
                return await self._write(command)
            case RetrySend(room_id=room_id, id=row_id):
                return await self._send_queue.retry(room_id, row_id)
            case CancelSend(room_id=room_id, id=row_id):
                return await self._send_queue.cancel(room_id, row_id)
            case _ if isinstance(command, MembershipCommand):
                return await self._joining.execute(command)
            case OpenThread(room_id=room_id, thread_root=root):
                room = self._open_rooms.get(room_id)
                return RoomNotOpen() if room is None else await self._threads.open(room, root)
            case ShrinkTimeline(room_id=room_id, thread_root=root):
                room = self._open_rooms.get(room_id, root)
                return RoomNotOpen() if room is None else await self._open_rooms.reload(room)
            case Shutdown():
                await self._shutdown()
                return Ok()
            case DumpState():
                return Invalid("DumpState is answered by the bridge's mirror, not the engine")
            case _ if isinstance(command, VerifyCommand):
                if self._verifying is None:
                    return Failed(
                        "verification needs end-to-end encryption (the engine runs without)"
                    )
                return await self._verifying.execute(command)
        return Invalid(f"unknown command {command!r}")

    # -- rooms -----------------------------------------------------------------------------

    def _note_joined(self, room_id: str) -> None:
        """A join the server made: the room opens before the next sync reports it."""
        if self._sync.joined is not None:
            self._sync.joined.add(room_id)

    def _note_left(self, room_id: str) -> None:
        if self._sync.joined is not None:
            self._sync.joined.discard(room_id)

    # -- writing ---------------------------------------------------------------------------

    async def _write(
        self, command: SendMessage | SendReaction | RedactEvent | EditMessage | MarkRead | SetTyping
    ) -> Answer:
        if self._open_rooms.get(command.room_id) is None:
            return RoomNotOpen()
        match command:
            case SendMessage():
                return await self._sending.message(command)
            case SendReaction():
                return await self._sending.reaction(command)
            case RedactEvent():
                return await self._sending.redact(command)
            case EditMessage():
                return await self._sending.edit(command)
            case MarkRead():
                return await self._sending.mark_read(command)
            case SetTyping():
                return await self._sending.typing(command)
        return EventNotFound()
