"""A scripted engine for the TUI's pilot and snapshot tests.

It has the real engine's surface (``async execute(command) -> Answer``,
publishing into the sink the app hands its ``connect``) and keeps the same
ordering rule: a command's answer comes after its events were published. A
fill walks the pages of its :class:`FillPlan`; with ``manual=True`` each page
(and the settlement) waits for :meth:`FakeEngine.step`, so a test can look at
the app between pages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace

import msgspec

from gapline.history import (
    AcceptInvite,
    Answer,
    Cancel,
    CancelSend,
    Command,
    Continuity,
    EditMessage,
    EventItem,
    EventNotFound,
    EventSink,
    Failed,
    FillGap,
    GapLifecycle,
    HistoryGapItem,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    Insert,
    Interrupted,
    InviteUser,
    JoinRoom,
    LeaveRoom,
    MarkRead,
    Ok,
    OpenRoom,
    OpenThread,
    PaginateBackwards,
    PushBack,
    PushFront,
    RecentHistoryChanged,
    RecentHistoryState,
    RedactEvent,
    Remove,
    RepairPhase,
    RepairStop,
    Reset,
    RetryRecent,
    RetrySend,
    RoomBusy,
    RoomNotOpen,
    SendMessage,
    SendReaction,
    Set,
    SetTopic,
    SetTyping,
    ShrinkTimeline,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    VectorDiff,
)
from gapline.history._markdown import formatted_body

ROOM = "!room:example.org"
BASE_TS = 1_764_500_000_000  # 2025-11-30 10:53:20 UTC


def message(n: int, *, sender: str = "@alice:example.org", **kw: object) -> EventItem:
    item = EventItem(
        id=f"e{n}",
        event_id=f"$e{n}",
        sender=sender,
        origin_server_ts=BASE_TS + n * 60_000,
        event_type="m.room.message",
        body=f"message {n}",
    )
    return msgspec.structs.replace(item, **kw)


def gap(
    gap_id: str = "g1", lifecycle: GapLifecycle = GapLifecycle.Idle, failure: str | None = None
) -> HistoryGapItem:
    return HistoryGapItem(
        id=gap_id,
        older_boundary="$older",
        newer_boundary="$newer",
        lifecycle=lifecycle,
        failure=failure,
    )


@dataclass
class FillPlan:
    """How a fill of one gap goes: the pages it lands (oldest event first in each), then
    ``end``: ``"ready"``, ``"budget"``, ``"stalled"``, ``"unavailable"`` or ``"failed"``."""

    pages: list[list[EventItem]] = field(default_factory=list)
    end: str = "ready"
    failure: str = "the homeserver is unavailable: 502 Bad Gateway"
    manual: bool = False


class FakeEngine:
    def __init__(
        self,
        rooms: dict[str, Sequence[TimelineItem]],
        *,
        plans: dict[str, FillPlan] | None = None,
        older: dict[str, list[EventItem]] | None = None,
        recent_settles: bool = True,
        threads: dict[str, Sequence[TimelineItem]] | None = None,
        me: str | None = "@alice:example.org",
    ) -> None:
        self.me = me
        self.threads = {root: list(items) for root, items in (threads or {}).items()}
        self.initial = {room: tuple(items) for room, items in rooms.items()}
        self.items: dict[str, list[TimelineItem]] = {}
        self.plans = plans or {}
        self.older = older or {}
        self.recent_settles = recent_settles
        self.sink: EventSink | None = None
        self.commands: list[Command] = []
        self.answers: list[Answer] = []
        self.closed = False
        self._gate: asyncio.Queue[None] = asyncio.Queue()
        self._ops: dict[str, asyncio.Task[Answer]] = {}

    # -- the app's connect -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connect(self, sink: EventSink) -> AsyncGenerator[FakeEngine]:
        self.sink = sink
        try:
            yield self
        finally:
            for room in list(self.items):
                await self._publish(RecentHistoryChanged(room, RecentHistoryState.IDLE))
            self.items.clear()
            self.closed = True

    def step(self, n: int = 1) -> None:
        """Let ``n`` more pages (or settlements) of manual fills go."""
        for _ in range(n):
            self._gate.put_nowait(None)

    # -- surface ---------------------------------------------------------------------------

    async def execute(self, command: Command) -> Answer:
        self.commands.append(command)
        answer = await self._execute(command)
        self.answers.append(answer)
        return answer

    async def _execute(self, command: Command) -> Answer:
        match command:
            case OpenRoom(room_id=room):
                if room not in self.initial:
                    return Failed(f"unknown room {room}")
                self.items[room] = list(self.initial[room])
                await self._publish(TimelineReset(room, tuple(self.items[room])))
                await self._publish(RecentHistoryChanged(room, RecentHistoryState.LOADING))
                if self.recent_settles:
                    await self._publish(RecentHistoryChanged(room, RecentHistoryState.LOADED))
                return Ok()
            case HistoryRepair(command=FillGap(room_id=room, gap_id=gap_id)):
                if room not in self.items:
                    return RoomNotOpen()
                if room in self._ops:
                    return RoomBusy()
                if self._index(room, gap_id) is None:
                    return EventNotFound()
                task = asyncio.create_task(self._fill(room, gap_id))
                self._ops[room] = task
                try:
                    return await asyncio.shield(task)
                finally:
                    self._ops.pop(room, None)
            case HistoryRepair(command=Cancel(room_id=room)):
                task = self._ops.get(room)
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                return Ok()
            case HistoryRepair(command=RetryRecent(room_id=room)):
                if room not in self.items:
                    return RoomNotOpen()
                await self._publish(RecentHistoryChanged(room, RecentHistoryState.LOADING))
                await self._publish(RecentHistoryChanged(room, RecentHistoryState.LOADED))
                return Ok()
            case PaginateBackwards(room_id=room, count=count):
                if room not in self.items:
                    return RoomNotOpen()
                older = self.older.get(room, [])
                batch = older[-count:]
                self.older[room] = older[: len(older) - len(batch)]
                for item in reversed(batch):
                    await self._change(room, [PushFront(item)])
                return Ok()
            case SendMessage(room_id=room, body=body, thread_root=root):
                if room not in self.items:
                    return RoomNotOpen()
                n = 10_000 + len(self.commands)
                row = msgspec.structs.replace(
                    message(n, sender=self.me or "@alice:example.org"),
                    body=body,
                    msgtype=command.msgtype,
                    formatted_body=formatted_body(body) if command.markdown else None,
                )
                if root is not None:
                    self.threads.setdefault(root, []).append(row)
                    await self._publish(TimelineChanged(room, (PushBack(row),), root))
                    return Ok()
                await self._change(room, [PushBack(row)])
                return Ok()
            case OpenThread(room_id=room, thread_root=root):
                if room not in self.items:
                    return RoomNotOpen()
                items = tuple(self.threads.setdefault(root, []))
                await self._publish(TimelineReset(room, items, root))
                return Ok()
            case ShrinkTimeline(room_id=room, thread_root=None):
                if room not in self.items:
                    return RoomNotOpen()
                self.items[room] = self.items[room][-100:]
                await self._change(room, [Reset(tuple(self.items[room]))])
                return Ok()
            case MarkRead() | SetTyping() | SendReaction() | RedactEvent() | EditMessage():
                return Ok()  # recorded in `commands`; the effect is not modelled
            case RetrySend() | CancelSend() | AcceptInvite():
                return Ok()  # recorded in `commands`; the effect is not modelled
            case InviteUser() | SetTopic() | JoinRoom() | LeaveRoom():
                return Ok()  # recorded in `commands`; the effect is not modelled
        return Failed(f"the fake engine does not do {command!r}")

    # -- internals -------------------------------------------------------------------------

    async def publish(self, event) -> None:
        """Publish an event as the engine would (typing, members, a diff from a sync)."""
        await self._publish(event)

    async def _publish(self, event) -> None:
        assert self.sink is not None
        await self.sink.publish(event)

    async def _change(self, room: str, diffs: list[VectorDiff]) -> None:
        for diff in diffs:
            match diff:
                case Insert(index=i, value=v):
                    self.items[room].insert(i, v)
                case PushFront(value=v):
                    self.items[room].insert(0, v)
                case PushBack(value=v):
                    self.items[room].append(v)
                case Set(index=i, value=v):
                    self.items[room][i] = v
                case Remove(index=i):
                    del self.items[room][i]
                case Reset(values=values):
                    self.items[room] = list(values)
        await self._publish(TimelineChanged(room, tuple(diffs)))

    def _index(self, room: str, gap_id: str) -> int | None:
        return next((i for i, it in enumerate(self.items[room]) if it.id == gap_id), None)

    async def _set_gap(self, room: str, gap_id: str, **changes: object) -> None:
        index = self._index(room, gap_id)
        assert index is not None
        item = self.items[room][index]
        assert isinstance(item, HistoryGapItem)
        await self._change(room, [Set(index, replace(item, **changes))])  # type: ignore[arg-type]

    async def _fill(self, room: str, gap_id: str) -> Answer:
        plan = self.plans.get(gap_id, FillPlan())
        report = HistoryRepairReport(room_id=room, gap_id=gap_id)
        await self._publish(HistoryRepairChanged(report))
        pages = events = 0
        try:
            for page in plan.pages:
                if plan.manual:
                    await self._gate.get()
                index = self._index(room, gap_id)
                assert index is not None
                await self._change(
                    room, [Insert(index + 1 + k, item) for k, item in enumerate(page)]
                )
                pages, events = pages + 1, events + len(page)
            if plan.manual:
                await self._gate.get()
        except asyncio.CancelledError:
            await self._set_gap(room, gap_id, lifecycle=GapLifecycle.Paused)
            settled = replace(
                report, pages=pages, events=events, phase=RepairPhase.Paused,
                stop=RepairStop.Cancelled,
            )  # fmt: skip
            await self._publish(HistoryRepairChanged(settled))
            return Interrupted()
        report = replace(report, pages=pages, events=events)
        answer: Answer = Ok()
        match plan.end:
            case "ready":
                index = self._index(room, gap_id)
                assert index is not None
                await self._change(room, [Remove(index)])
                report = replace(report, phase=RepairPhase.Ready, continuity=Continuity.Verified)
            case "budget" | "stalled":
                await self._set_gap(room, gap_id, lifecycle=GapLifecycle.Paused)
                stop = RepairStop.Budget if plan.end == "budget" else RepairStop.CursorStalled
                report = replace(report, phase=RepairPhase.Paused, stop=stop)
            case "unavailable":
                await self._set_gap(room, gap_id, lifecycle=GapLifecycle.Unavailable)
                report = replace(
                    report, phase=RepairPhase.Paused, stop=RepairStop.HistoryUnavailable,
                    continuity=Continuity.AccessibleStart,
                )  # fmt: skip
            case _:
                await self._set_gap(
                    room, gap_id, lifecycle=GapLifecycle.Failed, failure=plan.failure
                )
                report = replace(report, phase=RepairPhase.Paused, failure=plan.failure)
                answer = Failed(plan.failure)
        await self._publish(HistoryRepairChanged(report))
        return answer
