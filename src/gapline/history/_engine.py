"""The client engine: the event cache, the sync loop, and one history operation per room.

::

    async with Engine.open(store_dir, client, passphrase="pw", sink=publisher) as engine:
        answer = await engine.execute(OpenRoom("!r:example.org"))
        items = engine.timeline("!r:example.org").state.items

Task ownership: the engine owns one ``TaskGroup``. In it run the sync loop
and, per open room, at most one *operation* (a recent load, a fill, a
back-pagination). ``Cancel``, ``CloseRoom`` and ``Shutdown`` cancel an
operation; the operation itself turns the cancellation into its published
outcome (``Cancelled``) and its answer (``Interrupted``), so every outcome is
published by the task that owns it.

Ordering: every write of history goes through :meth:`Engine._commit`, which
runs the store operation and queues its updates on the room's timeline while
holding one lock, so timelines see updates in commit order; a commit is
shielded, so a cancelled caller never loses the updates of a write that
landed. A command's answer is returned only after its outcome was published
(``await sink.publish``) and its timeline fenced with ``flush_history``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from gapline.history._cache_store import CacheStore, Cipher
from gapline.history._fill import (
    Commit,
    Fetch,
    WalkCancelled,
    WalkEnd,
    WalkFailed,
    WalkFlow,
    WalkOutcome,
    backwards_walk,
)
from gapline.history._sections import PageResult, Sections, WalkState
from gapline.history._timeline import Timeline
from gapline.history._types import (
    Answer,
    Cancel,
    CloseRoom,
    Command,
    Continuity,
    DumpState,
    EngineConfig,
    Event,
    EventNotFound,
    Failed,
    FillGap,
    GapLifecycle,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    Interrupted,
    Invalid,
    Ok,
    OpenRoom,
    PaginateBackwards,
    RecentHistoryChanged,
    RecentHistoryState,
    RepairPhase,
    RepairStop,
    RetryRecent,
    RoomBusy,
    RoomNotOpen,
    SendMessage,
    Shutdown,
)
from gapline.history._updates import Update
from gapline.matrix import (
    MatrixClient,
    MatrixError,
    MatrixHTTPError,
    MatrixProtocolError,
    MatrixUnavailable,
    MessagesResponse,
    Request,
    SyncResponse,
    UnknownToken,
)
from gapline.storage import Backend, Dialect, StorageError, Tx, open_backend, open_cipher

__all__ = ["Engine"]

log = logging.getLogger("gapline.history")

T = TypeVar("T")

STORE_FILE = "history.sqlite3"
WRITER_CACHE_KIB = 32 * 1024
WAL_CHECKPOINT_PAGES = 8192


def _tune_writer(tx: Tx) -> None:
    """Connection settings for the writer of the engine's own SQLite file.

    The event-id index is keyed by hashes, so a sync's inserts land on random
    index pages: a 1,000-event commit dirties ~600 index pages at 100,000
    retained events (~2.7 MB of WAL, against ~0.4 MB for the rows themselves).
    A larger cache keeps those pages in memory instead of re-reading them from
    the OS, and checkpointing every 8,192 WAL pages instead of SQLite's 1,000
    copies a page rewritten by many commits to the database file once rather
    than once per commit or two. Durability is unchanged: every COMMIT still
    fsyncs the WAL (``synchronous=FULL``); only when pages reach the main file
    changes (the WAL may grow to ~32 MB between checkpoints).
    """
    tx.execute(f"PRAGMA cache_size={-WRITER_CACHE_KIB}")
    tx.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")


def _uncancel() -> None:
    """This task handled its cancellation itself (it becomes an outcome, not an error)."""
    current = asyncio.current_task()
    if current is not None:
        current.uncancel()


async def _shielded(aw: Awaitable[T]) -> T:
    """Finish ``aw`` even if the calling task is cancelled meanwhile (settling an outcome
    is short, and a half-published outcome would leave readers out of line)."""
    task = asyncio.ensure_future(aw)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
            _uncancel()


def describe(exc: BaseException) -> str:
    """A readable one-line message for a failure a user may see."""
    if isinstance(exc, UnknownToken):
        return f"the homeserver no longer accepts this session ({exc}); log in again"
    if isinstance(exc, MatrixUnavailable):
        return f"the homeserver is unavailable: {exc}"
    if isinstance(exc, MatrixProtocolError):
        return f"the homeserver sent an answer gapline cannot read: {exc}"
    if isinstance(exc, MatrixHTTPError):
        return f"the homeserver refused the request: {exc}"
    if isinstance(exc, StorageError):
        return f"the history store failed: {exc}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(eq=False)
class _Operation:
    """The one history operation a room runs; its task returns the command's answer."""

    kind: str  # "recent" | "fill" | "paginate"
    cancelled_early: Callable[[], Awaitable[Answer]]
    task: asyncio.Task[Answer] | None = None
    started: bool = False
    cancel_requested: bool = False
    launched: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Room:
    room_id: str
    timeline: Timeline
    op: _Operation | None = None
    recent: RecentHistoryState = field(default=RecentHistoryState.IDLE)
    opening: bool = False


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
    ) -> None:
        self.store = store
        self.client = client
        self.config = config
        self._publish = publish
        self._tg = tg
        self._rooms: dict[str, _Room] = {}
        self._commit_lock = asyncio.Lock()
        self._commits: set[asyncio.Task[Any]] = set()
        self._sync_task: asyncio.Task[None] | None = None
        self._sync_filter: dict[str, Any] | None = (
            None
            if sync_timeline_limit is None
            else {"room": {"timeline": {"limit": sync_timeline_limit}}}
        )
        self._sync_timeout_ms = sync_timeout_ms
        self._joined: set[str] | None = None  # None until a sync told us
        self._synced = asyncio.Condition()
        self._sync_count = 0
        self.sync_error: str | None = None
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
        sync_timeline_limit: int | None = None,
        sync_timeout_ms: int = 30_000,
        kdf_cost: Any = None,
        cipher: Cipher | None = None,
    ) -> AsyncGenerator[Engine]:
        """Open the store (checking the passphrase before anything else), start syncing.

        ``store`` is a directory (the SQLite file ``history.sqlite3`` in it),
        or an open :class:`~gapline.storage.Backend` (left open on exit).
        ``sink`` is an ``EventSink`` (``await sink.publish(event)``); ``None``
        publishes nowhere. ``sync=False`` runs no sync loop (drive it with
        :meth:`sync_once`). A wrong passphrase raises
        :class:`~gapline.storage.WrongPassphrase` before any network request.
        """
        own_backend = isinstance(store, (str, os.PathLike))
        if isinstance(store, (str, os.PathLike)):
            backend: Backend = await open_backend(str(Path(store) / STORE_FILE))
        else:
            backend = store
        try:
            if cipher is None:
                cipher = await open_cipher(backend, passphrase, kdf_cost=kdf_cost)
            cache = await CacheStore.open(backend, cipher)
            if own_backend and backend.dialect is Dialect.SQLITE:
                await backend.write(_tune_writer)

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
                )
                if sync and client is not None:
                    engine.start_sync()
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
        self._sync_task = self._tg.create_task(self._sync_loop(), name="history-sync")

    async def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for room_id in list(self._rooms):
            await self._close_room(room_id)
        if self._sync_task is not None:
            self._sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync_task
        while self._commits:
            await asyncio.gather(*self._commits, return_exceptions=True)

    # -- public surface --------------------------------------------------------------------

    def timeline(self, room_id: str) -> Timeline:
        """The open room's timeline; ``KeyError`` when the room is not open."""
        return self._rooms[room_id].timeline

    def is_open(self, room_id: str) -> bool:
        return self._open(room_id) is not None

    def recent_state(self, room_id: str) -> RecentHistoryState:
        room = self._rooms.get(room_id)
        return RecentHistoryState.IDLE if room is None else room.recent

    async def flush_history(self, room_id: str | None = None) -> None:
        """Fence: apply and publish whatever the cache queued (one room or all open rooms)."""
        rooms = [self._rooms[room_id]] if room_id in self._rooms else []
        if room_id is None:
            rooms = list(self._rooms.values())
        for room in rooms:
            await room.timeline.flush_history()

    async def wait_synced(self, count: int = 1) -> None:
        """Wait until the sync loop committed ``count`` syncs in total (tests, tools)."""
        async with self._synced:
            await self._synced.wait_for(lambda: self._sync_count >= count)

    @property
    def sync_count(self) -> int:
        return self._sync_count

    async def execute(self, command: Command) -> Answer:
        """Run one command; its answer comes after its outcome was published."""
        if self._closed:
            # Shutdown stopped it before it ran: DESIGN's answer for a command
            # stopped by Cancel/CloseRoom/Shutdown is Interrupted (nothing failed).
            # A second Shutdown has nothing left to do.
            return Ok() if isinstance(command, Shutdown) else Interrupted()
        match command:
            case OpenRoom(room_id=room_id):
                return await self._open_room(room_id)
            case CloseRoom(room_id=room_id):
                if self._open(room_id) is None:
                    return RoomNotOpen()
                await self._close_room(room_id)
                return Ok()
            case HistoryRepair(command=FillGap(room_id=room_id, gap_id=gap_id)):
                return await self._fill_gap(room_id, gap_id)
            case HistoryRepair(command=RetryRecent(room_id=room_id)):
                return await self._retry_recent(room_id)
            case HistoryRepair(command=Cancel(room_id=room_id)):
                return await self._cancel(room_id)
            case PaginateBackwards(room_id=room_id, count=count):
                return await self._paginate(room_id, count)
            case SendMessage(room_id=room_id, body=body):
                return await self._send(room_id, body)
            case Shutdown():
                await self._shutdown()
                return Ok()
            case DumpState():
                return Invalid("DumpState is answered by the bridge's mirror, not the engine")
        return Invalid(f"unknown command {command!r}")

    # -- commits ---------------------------------------------------------------------------

    async def _commit(self, op: Callable[[Tx], tuple[T, dict[str, list[Update]]]]) -> T:
        """Run a history write and queue its updates on the open rooms' timelines.

        The write and the queueing run in their own task under one lock, so the
        timelines receive updates in commit order even when the caller is
        cancelled mid-write (the write still lands; its updates still queue).
        """

        async def run() -> T:
            async with self._commit_lock:
                result, updates = await self.store.backend.write(op)
                for room_id, room_updates in updates.items():
                    room = self._rooms.get(room_id)
                    if room is not None and room_updates:
                        room.timeline.queue(room_updates)
                return result

        task = asyncio.ensure_future(run())
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        return await asyncio.shield(task)

    async def _room_write(self, room_id: str, fn: Callable[[Sections], T]) -> T:
        def op(tx: Tx) -> tuple[T, dict[str, list[Update]]]:
            sections = Sections(self.store, tx, room_id)
            result = fn(sections)
            return result, {room_id: sections.updates}

        return await self._commit(op)

    # -- sync ------------------------------------------------------------------------------

    async def sync_once(
        self, *, timeout_ms: int = 0, since: str | None = None, initial: bool = False
    ) -> SyncResponse:
        """One ``/sync`` from the stored token (or ``since``; ``initial``: from nothing),
        committed (events, then the token, in one transaction) and flushed to the open
        timelines."""
        assert self.client is not None
        token = since if since is not None else await self.store.sync_token()
        if initial:
            token = None
        response = await self.client.sync(
            since=token, timeout_ms=timeout_ms, filter=self._sync_filter
        )
        await self.ingest(response)
        return response

    async def ingest(self, response: SyncResponse) -> None:
        """Commit one sync answer: every joined room's events and gaps, then ``next_batch``.

        The token is written in the same transaction as the events it delivered,
        so a crash can never persist a token whose events were lost.
        """

        def op(tx: Tx) -> tuple[None, dict[str, list[Update]]]:
            out: dict[str, list[Update]] = {}
            for room_id, joined in response.rooms.join.items():
                sections = Sections(self.store, tx, room_id)
                timeline = joined.timeline
                sections.ingest_sync(
                    timeline.events, limited=timeline.limited, prev_batch=timeline.prev_batch
                )
                receipts = joined.receipts
                fully_read = joined.fully_read
                if receipts or fully_read is not None:
                    stored, stored_marker = self.store.receipts(tx, sections.room)
                    merged = dict(stored)
                    for event_id, by_type in receipts.items():
                        readers = by_type.get("m.read")
                        for user in readers if isinstance(readers, dict) else ():
                            merged[user] = event_id
                    if merged != stored or (fully_read is not None and fully_read != stored_marker):
                        sections.set_receipts(merged, fully_read)
                out[room_id] = sections.updates
            self.store.put_sync_token(tx, response.next_batch)
            return None, out

        await self._commit(op)
        joined = set(response.rooms.join)
        self._joined = (
            joined if self._joined is None else (self._joined | joined) - set(response.rooms.leave)
        )
        for room_id in response.rooms.join:
            room = self._rooms.get(room_id)
            if room is not None:
                await room.timeline.flush_history()
        async with self._synced:
            self._sync_count += 1
            self._synced.notify_all()

    async def _sync_loop(self) -> None:
        delay = 0.5
        while True:
            try:
                await self.sync_once(timeout_ms=self._sync_timeout_ms)
                delay = 0.5
                self.sync_error = None
            except UnknownToken as exc:
                self.sync_error = describe(exc)
                log.error("sync stopped: %s", self.sync_error)
                return
            except (MatrixError, StorageError) as exc:
                self.sync_error = describe(exc)
                log.warning("sync failed, retrying in %.1fs: %s", delay, self.sync_error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    # -- rooms -----------------------------------------------------------------------------

    @staticmethod
    def _room_id_problem(room_id: str) -> str | None:
        # Room version 12 ids carry no server name ("!hash"), so only the sigil is checked.
        if not isinstance(room_id, str) or not room_id.startswith("!") or len(room_id) < 2:
            return f"not a Matrix room id: {room_id!r} (expected !opaque or !opaque:server)"
        return None

    async def _open_room(self, room_id: str) -> Answer:
        problem = self._room_id_problem(room_id)
        if problem is not None:
            return Invalid(problem)
        if room_id in self._rooms:
            return Ok()
        # Register the timeline before reading the window: a commit landing between
        # the read and the reset then queues its updates here, and applying them
        # after the reset is idempotent for what the read already saw.
        timeline = Timeline(room_id, self._publish)
        room = _Room(room_id, timeline, opening=True)
        self._rooms[room_id] = room
        try:
            window = await self.store.load_window(room_id, self.config.open_window)
        except BaseException:
            self._rooms.pop(room_id, None)
            raise
        if not window.known and self._joined is not None and room_id not in self._joined:
            self._rooms.pop(room_id, None)
            return Failed(f"unknown room {room_id}: this account has not joined it")
        reset = timeline.reset(window, self.config.open_window)
        await self._publish(reset)
        room.opening = False
        await timeline.flush_history()
        # The recent load starts only after the reset is out: opening never waits on it.
        await self._start_recent(room)
        return Ok()

    def _open(self, room_id: str) -> _Room | None:
        """The room if it is open (and done opening)."""
        room = self._rooms.get(room_id)
        return None if room is None or room.opening else room

    async def _close_room(self, room_id: str) -> None:
        room = self._rooms.get(room_id)
        if room is None:
            return
        await self._stop_operation(room)
        self._rooms.pop(room_id, None)
        room.recent = RecentHistoryState.IDLE
        await room.timeline.close(
            lambda: self._publish(RecentHistoryChanged(room_id, RecentHistoryState.IDLE))
        )

    async def _stop_operation(self, room: _Room) -> None:
        op = room.op
        if op is None:
            return
        if op.task is None:
            # Reserved, still publishing its first event: it runs its cancelled
            # outcome instead of its body as soon as it launches.
            op.cancel_requested = True
            await op.launched.wait()
            if op.task is not None:  # None: it gave up before launching
                await asyncio.wait([op.task])
            return
        op.task.cancel()
        await asyncio.wait([op.task])
        if room.op is op:  # cancelled before it ran, so its own cleanup never did
            room.op = None
        if not op.started:
            # Cancelled before it ran a line: publish its outcome on its behalf.
            await op.cancelled_early()

    async def _cancel(self, room_id: str) -> Answer:
        room = self._open(room_id)
        if room is None:
            return RoomNotOpen()
        await self._stop_operation(room)
        await room.timeline.flush_history()
        return Ok()

    def _reserve(
        self, room: _Room, kind: str, early: Callable[[], Awaitable[Answer]]
    ) -> _Operation:
        """Claim the room's one operation slot before any await (so nothing overlaps)."""
        op = _Operation(kind, cancelled_early=early)
        room.op = op
        return op

    def _launch(self, room: _Room, op: _Operation, body: Callable[[], Awaitable[Answer]]) -> None:
        async def run() -> Answer:
            op.started = True
            try:
                if op.cancel_requested:  # cancelled between reservation and launch
                    return await _shielded(op.cancelled_early())
                return await body()
            except asyncio.CancelledError:
                # Cancelled outside the places that turn it into an outcome.
                _uncancel()
                return await _shielded(op.cancelled_early())
            finally:
                if room.op is op:
                    room.op = None

        op.task = self._tg.create_task(run(), name=f"history-{op.kind}-{room.room_id}")
        op.launched.set()

    def _start(
        self,
        room: _Room,
        kind: str,
        body: Callable[[], Awaitable[Answer]],
        early: Callable[[], Awaitable[Answer]],
    ) -> _Operation:
        op = self._reserve(room, kind, early)
        self._launch(room, op, body)
        return op

    async def _answer_of(self, op: _Operation) -> Answer:
        assert op.task is not None
        await asyncio.wait([op.task])
        if op.task.cancelled():
            return Interrupted()
        return op.task.result()

    async def _drive(
        self,
        room: _Room,
        flow: WalkFlow,
        state: WalkState,
        *,
        pause_at_budget: bool = False,
    ) -> WalkOutcome:
        """Run a walk: fetch each page, commit it, flush it; cancellation becomes an outcome.

        While a page commits, the next page (the flow's ``prefetch``) is already
        being fetched, so a walk costs about its round trips; a prefetch the
        flow does not ask for (the walk ended) is cancelled.
        """
        assert self.client is not None
        client = self.client
        ahead: tuple[Request, asyncio.Task[MessagesResponse]] | None = None
        try:
            effect = next(flow)
            while True:
                try:
                    if isinstance(effect, Fetch):
                        try:
                            if ahead is not None and ahead[0] == effect.request:
                                task, ahead = ahead[1], None
                                page = await task
                            else:
                                page = await client.request(effect.request, MessagesResponse)
                        except MatrixError as exc:
                            effect = flow.throw(WalkFailed(describe(exc)))
                            continue
                        effect = flow.send(page)
                    else:
                        assert isinstance(effect, Commit)
                        if effect.prefetch is not None:
                            ahead = (
                                effect.prefetch,
                                asyncio.ensure_future(
                                    client.request(effect.prefetch, MessagesResponse)
                                ),
                            )
                        then = GapLifecycle.Paused if pause_at_budget and effect.last else None
                        commit = self._walk_commit(room.room_id, state, effect, then)
                        try:
                            result = await asyncio.shield(commit)
                        except asyncio.CancelledError:
                            # The page is committed whatever happens: count it, then stop.
                            result = await commit
                            state = result.state
                            try:
                                flow.send(result)
                            except StopIteration as stop:
                                _uncancel()
                                return stop.value
                            raise
                        except StorageError as exc:
                            effect = flow.throw(WalkFailed(describe(exc)))
                            continue
                        state = result.state
                        # The flow counts the page before anything else can be cancelled.
                        effect = flow.send(result)
                        await room.timeline.flush_history()
                except asyncio.CancelledError:
                    _uncancel()
                    try:
                        flow.throw(WalkCancelled())
                    except StopIteration as stop:
                        return stop.value
                    raise AssertionError("a walk must end when it is cancelled") from None
        except StopIteration as stop:
            return stop.value
        finally:
            if ahead is not None:
                ahead[1].cancel()
                with contextlib.suppress(asyncio.CancelledError, MatrixError):
                    await ahead[1]

    def _walk_commit(
        self, room_id: str, state: WalkState, effect: Commit, then: GapLifecycle | None
    ) -> asyncio.Future[PageResult]:
        return asyncio.ensure_future(
            self._room_write(
                room_id, lambda s: s.walk_page(state, effect.chunk, effect.end, then=then)
            )
        )

    # -- recent load -----------------------------------------------------------------------

    async def _set_recent(self, room: _Room, state: RecentHistoryState) -> None:
        if room.room_id not in self._rooms:
            return
        room.recent = state
        await self._publish(RecentHistoryChanged(room.room_id, state))

    async def _start_recent(self, room: _Room) -> _Operation:
        async def early() -> Answer:
            await self._set_recent(room, RecentHistoryState.CANCELLED)
            return Interrupted()

        op = self._reserve(room, "recent", early)
        try:
            await self._set_recent(room, RecentHistoryState.LOADING)
        finally:
            self._launch(room, op, lambda: self._recent(room))
        return op

    async def _recent(self, room: _Room) -> Answer:
        if self.client is None:
            message = "no homeserver client: the engine runs offline"
            await self._set_recent(room, RecentHistoryState.failed(message))
            return Failed(message)
        flow = backwards_walk(
            room.room_id, None, page_size=self.config.page_size, budget=self.config.recent_pages
        )
        outcome = await self._drive(room, flow, WalkState())
        if outcome.end is WalkEnd.Failed and not room.timeline.has_events():
            await self._initial_fallback(room)
        return await _shielded(self._settle_recent(room, outcome))

    async def _settle_recent(self, room: _Room, outcome: WalkOutcome) -> Answer:
        await room.timeline.flush_history()
        if outcome.end is WalkEnd.Cancelled:
            await self._set_recent(room, RecentHistoryState.CANCELLED)
            return Interrupted()
        if outcome.end is WalkEnd.Failed:
            message = outcome.message or "the recent load failed"
            await self._set_recent(room, RecentHistoryState.failed(message))
            return Failed(message)
        await self._set_recent(room, RecentHistoryState.LOADED)
        return Ok()

    async def _initial_fallback(self, room: _Room) -> None:
        """A failed recent load on a room with no events: paginate a few from its top."""
        top = await self.store.top_gap(room.room_id)
        if top is not None and (top.cursor is None or top.lifecycle is GapLifecycle.Unavailable):
            return
        state = WalkState(None, None if top is None else top.gap_id)
        flow = backwards_walk(
            room.room_id,
            None if top is None else top.cursor,
            page_size=self.config.initial_history_limit,
            budget=1,
        )
        outcome = await self._drive(room, flow, state)
        log.info("initial history fallback for %s: %s", room.room_id, outcome)

    async def _retry_recent(self, room_id: str) -> Answer:
        room = self._open(room_id)
        if room is None:
            return RoomNotOpen()
        if room.op is not None:
            if room.op.kind == "recent":
                return await self._answer_of(room.op)  # join the running load
            return RoomBusy()
        op = await self._start_recent(room)
        return await self._answer_of(op)

    # -- fill ------------------------------------------------------------------------------

    async def _fill_gap(self, room_id: str, gap_id: str) -> Answer:
        room = self._open(room_id)
        if room is None:
            return RoomNotOpen()
        gap = await self.store.gap(room_id, gap_id)
        if gap is None or gap.is_top:
            return EventNotFound()
        if gap.lifecycle is GapLifecycle.Unavailable:
            # Accessible history already ended inside this gap: nothing to ask the server.
            report = HistoryRepairReport(room_id=room_id, gap_id=gap_id)
            await self._publish(HistoryRepairChanged(report))
            await self._publish(
                HistoryRepairChanged(
                    HistoryRepairReport(
                        room_id=room_id,
                        gap_id=gap_id,
                        phase=RepairPhase.Paused,
                        continuity=Continuity.AccessibleStart,
                        stop=RepairStop.HistoryUnavailable,
                    )
                )
            )
            return Ok()
        if room.op is not None:
            return RoomBusy()
        if self.client is None:
            return Failed("no homeserver client: the engine runs offline")

        async def early() -> Answer:
            return await self._settle_fill(room, gap_id, WalkOutcome(WalkEnd.Cancelled, 0, 0))

        op = self._reserve(room, "fill", early)
        launched = False
        try:
            # Read the cursor again now that nothing else can move it.
            current = await self.store.gap(room_id, gap_id)
            if current is None:
                return EventNotFound()
            await self._publish(
                HistoryRepairChanged(HistoryRepairReport(room_id=room_id, gap_id=gap_id))
            )
            self._launch(room, op, lambda: self._fill(room, gap_id, current.cursor))
            launched = True
        finally:
            if not launched:
                if room.op is op:
                    room.op = None
                op.launched.set()
        return await self._answer_of(op)

    async def _fill(self, room: _Room, gap_id: str, cursor: str | None) -> Answer:
        # The first page finds the gap's newer boundary in its own transaction.
        state = WalkState(None, gap_id)
        if cursor is None:
            outcome = WalkOutcome(
                WalkEnd.Failed, 0, 0, "this gap has no pagination cursor to fill it from"
            )
        else:
            flow = backwards_walk(
                room.room_id,
                cursor,
                page_size=self.config.page_size,
                budget=self.config.page_budget,
            )
            outcome = await self._drive(room, flow, state, pause_at_budget=True)
        return await _shielded(self._settle_fill(room, gap_id, outcome))

    async def _settle_fill(self, room: _Room, gap_id: str, outcome: WalkOutcome) -> Answer:
        base = HistoryRepairReport(
            room_id=room.room_id, gap_id=gap_id, pages=outcome.pages, events=outcome.events
        )
        lifecycle: GapLifecycle | None = GapLifecycle.Paused
        failure: str | None = None
        answer: Answer = Ok()
        match outcome.end:
            case WalkEnd.Joined:
                lifecycle = None
                report = replace(base, phase=RepairPhase.Ready, continuity=Continuity.Verified)
            case WalkEnd.Budget:
                lifecycle = None  # the page that spent the budget paused the gap
                report = replace(base, phase=RepairPhase.Paused, stop=RepairStop.Budget)
            case WalkEnd.CursorStalled:
                report = replace(base, phase=RepairPhase.Paused, stop=RepairStop.CursorStalled)
            case WalkEnd.StartReached:
                lifecycle = None  # the last page already made the gap Unavailable
                report = replace(
                    base,
                    phase=RepairPhase.Paused,
                    continuity=Continuity.AccessibleStart,
                    stop=RepairStop.HistoryUnavailable,
                )
            case WalkEnd.Cancelled:
                report = replace(base, phase=RepairPhase.Paused, stop=RepairStop.Cancelled)
                answer = Interrupted()
            case _:
                failure = outcome.message or "the fill failed"
                lifecycle = GapLifecycle.Failed
                report = replace(base, phase=RepairPhase.Paused, failure=failure)
                answer = Failed(failure)
        if lifecycle is not None:
            with contextlib.suppress(StorageError):
                await self._room_write(
                    room.room_id, lambda s: s.set_gap_state(gap_id, lifecycle, failure)
                )
        await room.timeline.flush_history()
        if room.room_id in self._rooms:
            await self._publish(HistoryRepairChanged(report))
        return answer

    # -- back-pagination -------------------------------------------------------------------

    async def _paginate(self, room_id: str, count: int) -> Answer:
        room = self._open(room_id)
        if room is None:
            return RoomNotOpen()
        if room.op is not None:
            return RoomBusy()

        async def early() -> Answer:
            return Interrupted()

        op = self._start(room, "paginate", lambda: self._paginate_body(room, count), early)
        return await self._answer_of(op)

    async def _paginate_body(self, room: _Room, count: int) -> Answer:
        timeline = room.timeline
        try:
            await timeline.flush_history()
            remaining = count
            if not timeline.complete_below and timeline.low is not None:
                window = await self.store.load_older(room.room_id, timeline.low, count)
                if len(window.events) < count:
                    timeline.complete_below = True
                await timeline.publish_diffs(timeline.prepend_window(window))
                remaining -= len(window.events)
                if remaining <= 0:
                    return Ok()
            if self.client is None:
                return Ok()
            top = await self.store.top_gap(room.room_id)
            if top is not None and (
                top.cursor is None or top.lifecycle is GapLifecycle.Unavailable
            ):
                return Ok()  # the top of accessible history is loaded
            # The first page finds the head of the oldest section in its own transaction.
            state = WalkState(None, None if top is None else top.gap_id)
            page_size = min(remaining, self.config.page_size)
            flow = backwards_walk(
                room.room_id,
                None if top is None else top.cursor,
                page_size=page_size,
                budget=-(-remaining // page_size),
            )
            outcome = await self._drive(room, flow, state)
        except asyncio.CancelledError:
            _uncancel()
            await timeline.flush_history()
            return Interrupted()
        except StorageError as exc:
            return Failed(describe(exc))
        await timeline.flush_history()
        if outcome.end is WalkEnd.Cancelled:
            return Interrupted()
        if outcome.end is WalkEnd.Failed:
            return Failed(outcome.message or "back-pagination failed")
        return Ok()

    # -- sending ---------------------------------------------------------------------------

    async def _send(self, room_id: str, body: str) -> Answer:
        if self._open(room_id) is None:
            return RoomNotOpen()
        if self.client is None:
            return Failed("no homeserver client: the engine runs offline")
        try:
            await self.client.send_text(room_id, body)
        except MatrixError as exc:
            return Failed(describe(exc))
        return Ok()
