"""The three history operations, each a walk backwards: the recent load, a fill, a back-pagination.

Each runs in its room's one operation slot (``_operations``), drives
:func:`~gapline.history._fill.backwards_walk` with :func:`~gapline.history._drive.drive`
(pages fetched from the homeserver, committed through ``_commits``), and
settles its outcome before it answers:

- the recent load (on ``OpenRoom`` and ``RetryRecent``) publishes
  ``Loading`` then ``Loaded``, ``Cancelled`` or ``Failed(message)``; a failed
  load on a room with no events falls back to a few events from its top;
- a fill (``FillGap``) publishes a ``Bridging`` report, then one settled
  report; the gap's lifecycle follows the outcome (``Paused``, ``Failed``,
  ``Unavailable``, or the gap is gone once continuity is proven);
- a back-pagination (``PaginateBackwards``) first shows retained rows older
  than the window, then walks the top of the room for what is still missing.

The answer is returned only after the outcome was published and the room's
timeline flushed.

An open thread (``OpenThread``) runs the same operations on its own timeline
and slot: its recent load and fills walk ``/relations`` instead of
``/messages`` (the root joins the top once the walk reaches it), and it
publishes no ``RecentHistoryChanged`` (that event is the room's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

import msgspec

from gapline.e2ee import save_changes
from gapline.history._backup_fetch import BackupFetcher
from gapline.history._cache_store import CacheStore
from gapline.history._commits import Commits
from gapline.history._crypto import EngineCrypto
from gapline.history._drive import drive
from gapline.history._failures import describe
from gapline.history._fill import Commit, WalkEnd, WalkFlow, WalkOutcome, backwards_walk
from gapline.history._healing import index_undecrypted
from gapline.history._operations import (
    Operation,
    OperationKind,
    Operations,
    Room,
    shielded,
    uncancel,
)
from gapline.history._sections import Sections
from gapline.history._types import (
    Answer,
    Continuity,
    EngineConfig,
    Event,
    EventNotFound,
    Failed,
    GapLifecycle,
    HistoryRepairChanged,
    HistoryRepairReport,
    Interrupted,
    Ok,
    RecentHistoryChanged,
    RecentHistoryState,
    RepairPhase,
    RepairStop,
    RoomBusy,
)
from gapline.history._updates import GapRecord
from gapline.history._walk_state import PageResult, WalkState
from gapline.matrix import MatrixClient, MessagesResponse, RelationsResponse, Request
from gapline.storage import StorageError

__all__ = ["OFFLINE", "Walks"]

log = logging.getLogger("gapline.history")

OFFLINE = "no homeserver client: the engine runs offline"


class Walks:
    """The recent load, fills and back-paginations of the engine's open rooms."""

    def __init__(
        self,
        *,
        store: CacheStore,
        client: MatrixClient | None,
        config: EngineConfig,
        publish: Callable[[Event], Awaitable[None]],
        rooms: Mapping[str, Room],
        commits: Commits,
        operations: Operations,
        crypto: EngineCrypto | None = None,
        backup: BackupFetcher | None = None,
    ) -> None:
        self._crypto = crypto
        self._backup = backup
        self._store = store
        self._client = client
        self._config = config
        self._publish = publish
        self._rooms = rooms
        self._commits = commits
        self._ops = operations

    async def _drive(
        self, room: Room, flow: WalkFlow, state: WalkState, *, pause_at_budget: bool = False
    ) -> WalkOutcome:
        """Drive ``flow`` over the homeserver and the store; ``pause_at_budget``: the page
        that spends the budget also pauses the gap, in its own transaction."""
        client = self._client
        assert client is not None

        # Opened here if no sync has yet: a page stored before the machine is open would
        # keep its encrypted events undecrypted and out of the index that heals them.
        crypto = self._crypto
        if crypto is not None and await crypto.ensure() is None:
            crypto = None

        async def fetch(request: Request) -> MessagesResponse:
            if room.thread_root is None:
                page = await client.request(request, MessagesResponse)
            else:
                found = await client.request(request, RelationsResponse)
                chunk = list(found.chunk)
                if found.next_batch is None and room.root_event is not None:
                    chunk.append(room.root_event)  # the start of a thread is its root
                page = MessagesResponse(chunk=chunk, start="", end=found.next_batch)
            if crypto is None:
                return page
            # Decrypted here, on the loop, so the page's write holds only storage work;
            # the keys the backup holds for it are fetched before it commits.
            if self._backup is not None:
                await self._backup.before_page(room.room_id, page.chunk)
            chunk = await crypto.decrypt(room.room_id, page.chunk)
            if self._backup is not None:
                chunk = await self._backup.complete_page(room.room_id, chunk)
            return msgspec.structs.replace(page, chunk=chunk)

        def commit(
            at: WalkState, effect: Commit, stored: Callable[[], None]
        ) -> asyncio.Future[PageResult]:
            then = GapLifecycle.Paused if pause_at_budget and effect.last else None
            changes = None if crypto is None else crypto.take_changes()

            def page(s: Sections) -> PageResult:
                if changes is not None:
                    save_changes(s.tx, changes)  # the replay index, with the page
                result = s.walk_page(at, effect.chunk, effect.end, then=then)
                if crypto is not None:
                    index_undecrypted(self._store, s.tx, room.room_id, effect.chunk)
                stored()  # the loop may flush the page before this one during the COMMIT
                return result

            return self._commits.start_room_write(room.room_id, page, thread_root=room.thread_root)

        return await drive(flow, state, fetch=fetch, commit=commit, flush=lambda: self.flush(room))

    async def flush(self, room: Room) -> None:
        """Apply what the cache queued to the room's timeline and its threads'."""
        parent = self._rooms.get(room.room_id)
        if parent is None:
            await room.timeline.flush_history()
            return
        await parent.timeline.flush_history()
        for thread in list(parent.threads.values()):
            await thread.timeline.flush_history()

    def _walk(self, room: Room, cursor: str | None, *, page_size: int, budget: int) -> WalkFlow:
        return backwards_walk(
            room.room_id, cursor, page_size=page_size, budget=budget, thread_root=room.thread_root
        )

    # -- recent load -----------------------------------------------------------------------

    async def _set_recent(self, room: Room, state: RecentHistoryState) -> None:
        if room.room_id not in self._rooms:
            return
        room.recent = state
        if room.thread_root is None:
            await self._publish(RecentHistoryChanged(room.room_id, state))

    async def start_recent(self, room: Room) -> Operation:
        """Start the room's recent load (its slot must be free); returns without waiting."""

        async def early() -> Answer:
            await self._set_recent(room, RecentHistoryState.CANCELLED)
            return Interrupted()

        op = self._ops.reserve(room, OperationKind.RECENT, early)
        try:
            await self._set_recent(room, RecentHistoryState.LOADING)
        finally:
            self._ops.launch(room, op, lambda: self._recent(room))
        return op

    async def _recent(self, room: Room) -> Answer:
        if self._client is None:
            await self._set_recent(room, RecentHistoryState.failed(OFFLINE))
            return Failed(OFFLINE)
        flow = self._walk(
            room, None, page_size=self._config.page_size, budget=self._config.recent_pages
        )
        outcome = await self._drive(room, flow, WalkState())
        if (
            outcome.end is WalkEnd.Failed
            and not room.timeline.has_events()
            and room.thread_root is None
        ):
            await self._initial_fallback(room)
        return await shielded(self._settle_recent(room, outcome))

    async def _settle_recent(self, room: Room, outcome: WalkOutcome) -> Answer:
        await self.flush(room)
        if outcome.end is WalkEnd.Cancelled:
            await self._set_recent(room, RecentHistoryState.CANCELLED)
            return Interrupted()
        if outcome.end is WalkEnd.Failed:
            message = outcome.message or "the recent load failed"
            await self._set_recent(room, RecentHistoryState.failed(message))
            return Failed(message)
        await self._set_recent(room, RecentHistoryState.LOADED)
        return Ok()

    async def _initial_fallback(self, room: Room) -> None:
        """A failed recent load on a room with no events: paginate a few from its top."""
        top = await self._store.top_gap(room.room_id)
        if top is not None and (top.cursor is None or top.lifecycle is GapLifecycle.Unavailable):
            return
        state = WalkState(None, None if top is None else top.gap_id)
        flow = backwards_walk(
            room.room_id,
            None if top is None else top.cursor,
            page_size=self._config.initial_history_limit,
            budget=1,
        )
        outcome = await self._drive(room, flow, state)
        log.info("initial history fallback for %s: %s", room.room_id, outcome)

    async def retry_recent(self, room: Room) -> Answer:
        """``RetryRecent``: join a running recent load, or start one."""
        if room.op is not None:
            if room.op.kind is OperationKind.RECENT:
                return await self._ops.answer(room.op)  # join the running load
            return RoomBusy()
        op = await self.start_recent(room)
        return await self._ops.answer(op)

    # -- fill ------------------------------------------------------------------------------

    async def fill_gap(self, room: Room, gap_id: str) -> Answer:
        """``FillGap``: walk the gap from its cursor for up to the page budget.

        The gap is read once: with the room's slot reserved first when it is free (so
        nothing else moves the cursor before the walk starts from it), else to say
        whether the gap exists before saying why it cannot be filled now.
        """
        if room.op is not None or self._client is None:
            gap = await self._store.gap(room.room_id, gap_id, thread_root=room.thread_root)
            settled = await self._unfillable(room, gap_id, gap)
            if settled is not None:
                return settled
            return RoomBusy() if room.op is not None else Failed(OFFLINE)

        async def early() -> Answer:
            return await self._settle_fill(room, gap_id, WalkOutcome(WalkEnd.Cancelled, 0, 0))

        op = self._ops.reserve(room, OperationKind.FILL, early)
        launched = False
        try:
            current = await self._store.gap(room.room_id, gap_id, thread_root=room.thread_root)
            settled = await self._unfillable(room, gap_id, current)
            if settled is not None:
                return settled
            assert current is not None
            await self._publish(
                HistoryRepairChanged(HistoryRepairReport(room_id=room.room_id, gap_id=gap_id))
            )
            self._ops.launch(room, op, lambda: self._fill(room, gap_id, current.cursor))
            launched = True
        finally:
            if not launched:
                self._ops.abandon(room, op)
        return await self._ops.answer(op)

    async def _unfillable(self, room: Room, gap_id: str, gap: GapRecord | None) -> Answer | None:
        """The answer to a fill of ``gap`` that nothing can walk (``None``: it can be)."""
        if gap is None or gap.is_top:
            return EventNotFound()
        if gap.lifecycle is not GapLifecycle.Unavailable:
            return None
        # Accessible history already ended inside this gap: nothing to ask the server.
        room_id = room.room_id
        await self._publish(
            HistoryRepairChanged(HistoryRepairReport(room_id=room_id, gap_id=gap_id))
        )
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

    async def _fill(self, room: Room, gap_id: str, cursor: str | None) -> Answer:
        # The first page finds the gap's newer boundary in its own transaction.
        state = WalkState(None, gap_id)
        if cursor is None:
            outcome = WalkOutcome(
                WalkEnd.Failed, 0, 0, "this gap has no pagination cursor to fill it from"
            )
        else:
            flow = self._walk(
                room, cursor, page_size=self._config.page_size, budget=self._config.page_budget
            )
            outcome = await self._drive(room, flow, state, pause_at_budget=True)
        return await shielded(self._settle_fill(room, gap_id, outcome))

    async def _settle_fill(self, room: Room, gap_id: str, outcome: WalkOutcome) -> Answer:
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
                await self._commits.room_write(
                    room.room_id,
                    lambda s: s.set_gap_state(gap_id, lifecycle, failure),
                    thread_root=room.thread_root,
                )
        await self.flush(room)
        if room.room_id in self._rooms:
            await self._publish(HistoryRepairChanged(report))
        return answer

    # -- back-pagination -------------------------------------------------------------------

    async def paginate(self, room: Room, count: int) -> Answer:
        """``PaginateBackwards``: ``count`` more rows above the window, retained ones first."""
        if room.op is not None:
            return RoomBusy()

        async def early() -> Answer:
            return Interrupted()

        op = self._ops.start(
            room, OperationKind.PAGINATE, lambda: self._paginate(room, count), early
        )
        return await self._ops.answer(op)

    async def _paginate(self, room: Room, count: int) -> Answer:
        timeline = room.timeline
        try:
            await self.flush(room)
            remaining = count
            window = await timeline.prepend_read(
                lambda low: self._store.load_older(
                    room.room_id, low, count, thread_root=room.thread_root
                )
            )
            if window is not None:
                if len(window.events) < count:
                    timeline.complete_below = True
                remaining -= len(window.events)
                if remaining <= 0:
                    return Ok()
            if self._client is None:
                return Ok()
            top = await self._store.top_gap(room.room_id, thread_root=room.thread_root)
            if top is not None and (
                top.cursor is None or top.lifecycle is GapLifecycle.Unavailable
            ):
                return Ok()  # the top of accessible history is loaded
            # The first page finds the head of the oldest section in its own transaction.
            state = WalkState(None, None if top is None else top.gap_id)
            page_size = min(remaining, self._config.page_size)
            flow = self._walk(
                room,
                None if top is None else top.cursor,
                page_size=page_size,
                budget=-(-remaining // page_size),
            )
            outcome = await self._drive(room, flow, state)
        except asyncio.CancelledError:
            uncancel()
            await self.flush(room)
            return Interrupted()
        except StorageError as exc:
            return Failed(describe(exc))
        await self.flush(room)
        if outcome.end is WalkEnd.Cancelled:
            return Interrupted()
        if outcome.end is WalkEnd.Failed:
            return Failed(outcome.message or "back-pagination failed")
        return Ok()
