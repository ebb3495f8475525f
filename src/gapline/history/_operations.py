"""One history operation per room, and how cancelling one becomes its outcome.

An open room runs at most one *operation* at a time: a recent load, a fill or
a back-pagination. A command that finds the slot taken answers ``RoomBusy``
(``RetryRecent`` instead joins a running recent load). Every operation runs
as one task in the engine's ``TaskGroup``; its task returns the command's
answer.

How an operation starts:

- :meth:`Operations.reserve` claims the slot before the first ``await``, so
  two commands arriving in the same breath never both run;
- the operation then publishes its first event (``Loading``, ``Bridging``) and
  :meth:`Operations.launch` starts its task, or :meth:`Operations.abandon`
  frees the slot when it turned out to have nothing to run.

How it is stopped (``Cancel``, ``CloseRoom``, ``Shutdown`` all go through
:meth:`Operations.stop`), and who publishes the outcome:

- a running operation is cancelled; it turns the cancellation into its own
  published outcome (``Cancelled``) and answer (``Interrupted``), so every
  outcome is published by the task that owns it (:func:`uncancel` marks the
  cancellation handled);
- an operation stopped between reservation and launch runs its *cancelled
  outcome* instead of its body as soon as it launches;
- an operation cancelled before its task ran a line cannot publish anything:
  ``stop`` publishes its cancelled outcome on its behalf;
- settling an outcome runs :func:`shielded`: a second cancellation arriving
  meanwhile does not leave a half-published outcome.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gapline.history._timeline import Timeline
from gapline.history._types import Answer, Interrupted, RecentHistoryState
from gapline.matrix import ClientEvent

__all__ = ["Operation", "OperationKind", "Operations", "Room", "shielded", "uncancel"]

T = TypeVar("T")

Body = Callable[[], Coroutine[Any, Any, Answer]]
"""An operation's work, or its cancelled outcome: returns the command's answer."""


class OperationKind(enum.Enum):
    RECENT = "recent"
    FILL = "fill"
    PAGINATE = "paginate"


def uncancel() -> None:
    """This task handled its cancellation itself (it becomes an outcome, not an error)."""
    current = asyncio.current_task()
    if current is not None:
        current.uncancel()


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """Finish ``coro`` even if the calling task is cancelled meanwhile (settling an outcome
    is short, and a half-published outcome would leave readers out of line)."""
    # Owned here: awaited until it is done on every path (a cancellation of the
    # caller is absorbed, not passed on to the task).
    task = asyncio.create_task(coro)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
            uncancel()


@dataclass(eq=False)
class Operation:
    """The one history operation a room runs; its task returns the command's answer."""

    kind: OperationKind
    cancelled_early: Body
    task: asyncio.Task[Answer] | None = None
    started: bool = False
    cancel_requested: bool = False
    launched: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Room:
    """An open room as the engine holds it: its timeline, its recent load state, its slot.

    An open thread of the room is a ``Room`` too (``thread_root`` set, kept in its
    room's ``threads``): a timeline of its own with its own operation slot, so a
    thread's walk never makes its room busy. ``root_event`` is the thread's root,
    shown at the top of the thread once its walk reaches the start.
    """

    room_id: str
    timeline: Timeline
    op: Operation | None = None
    recent: RecentHistoryState = field(default=RecentHistoryState.IDLE)
    opening: bool = False
    thread_root: str | None = None
    threads: dict[str, Room] = field(default_factory=dict)
    root_event: ClientEvent | None = None


class Operations:
    """Starts, answers and stops rooms' operations; their tasks run in ``tg``."""

    def __init__(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg

    @staticmethod
    def reserve(room: Room, kind: OperationKind, early: Body) -> Operation:
        """Claim the room's one operation slot before any await (so nothing overlaps)."""
        op = Operation(kind, cancelled_early=early)
        room.op = op
        return op

    def launch(self, room: Room, op: Operation, body: Body) -> None:
        """Start the reserved operation's task; it frees the slot when it ends."""

        async def run() -> Answer:
            op.started = True
            try:
                if op.cancel_requested:  # cancelled between reservation and launch
                    return await shielded(op.cancelled_early())
                return await body()
            except asyncio.CancelledError:
                # Cancelled outside the places that turn it into an outcome.
                uncancel()
                return await shielded(op.cancelled_early())
            finally:
                if room.op is op:
                    room.op = None

        where = room.room_id if room.thread_root is None else f"{room.room_id}-{room.thread_root}"
        op.task = self._tg.create_task(run(), name=f"history-{op.kind.value}-{where}")
        op.launched.set()

    @staticmethod
    def abandon(room: Room, op: Operation) -> None:
        """The reserved operation gives up before launching: free the slot, wake a stopper."""
        if room.op is op:
            room.op = None
        op.launched.set()

    def start(self, room: Room, kind: OperationKind, body: Body, early: Body) -> Operation:
        """Reserve and launch at once (an operation with nothing to publish first)."""
        op = self.reserve(room, kind, early)
        self.launch(room, op, body)
        return op

    @staticmethod
    async def answer(op: Operation) -> Answer:
        """The launched operation's answer, once its task ended."""
        assert op.task is not None
        await asyncio.wait([op.task])
        if op.task.cancelled():
            return Interrupted()
        return op.task.result()

    @staticmethod
    async def stop(room: Room) -> None:
        """Stop the room's operation, if any; returns once its outcome was published."""
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
