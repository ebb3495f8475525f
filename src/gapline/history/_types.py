"""The public vocabulary of the client engine: config, commands, answers, events, timeline items.

Names, variants and fields are the wire protocol's own (docs/history.md),
because they cross the wire unchanged: `_wire.py` turns each value here into
its pinned JSON, and back. The protocol is written in Rust's (serde's) terms.

How its Rust-style enums are spelled in Python:

- an enum of unit variants is an :class:`enum.Enum` whose members carry the
  variant name both as attribute and value (``RepairPhase.Ready.value ==
  "Ready"``), so code reads like the protocol;
- an enum with data variants is a union of frozen dataclasses, one per variant
  (``Command = OpenRoom | CloseRoom | ...``); a unit variant is a dataclass
  with no fields (``Ok()``, ``Shutdown()``), so ``match`` works uniformly;
- :class:`RecentHistoryState` is the exception: four unit states and
  ``Failed(message)``, held as a ``kind`` plus an optional ``message`` so that
  ``state.kind is RecentHistoryKind.Loading`` is all a reader needs.

Timeline item variants are called ``Event``, ``HistoryGap`` and
``ReadMarker`` on the wire; in Python they are :class:`EventItem`,
:class:`HistoryGapItem` and :class:`ReadMarkerItem` so ``Event`` stays free
for the engine's published events.

Everything is immutable: a value handed to a subscriber can be kept without
copying, and an engine cannot mutate what a mirror already applied.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

import msgspec

from gapline.history._commands import (
    AcceptInvite,
    AcceptVerification,
    Cancel,
    CancelSend,
    CancelVerification,
    CloseRoom,
    Command,
    ConfirmVerification,
    CreateRoom,
    DeclineInvite,
    DumpState,
    EditMessage,
    FillGap,
    HistoryRepair,
    HistoryRepairCommand,
    InviteUser,
    JoinRoom,
    LeaveRoom,
    MarkRead,
    OpenRoom,
    OpenThread,
    PaginateBackwards,
    RedactEvent,
    RetryRecent,
    RetrySend,
    SendMessage,
    SendReaction,
    SetTopic,
    SetTyping,
    ShrinkTimeline,
    Shutdown,
    StartVerification,
)
from gapline.history._items import (
    READ_MARKER_ID,
    EventItem,
    GapLifecycle,
    HistoryGapItem,
    InReplyTo,
    Member,
    Reaction,
    ReadMarkerItem,
    ReplyStatus,
    SendState,
    SendStateKind,
    ThreadLatest,
    ThreadSummary,
    TimelineItem,
    Undecrypted,
    UtdReason,
)
from gapline.history._verifying_types import VerificationChanged, VerificationPhase

__all__ = [
    "READ_MARKER_ID",
    "AcceptInvite",
    "AcceptVerification",
    "Answer",
    "Append",
    "Cancel",
    "CancelSend",
    "CancelVerification",
    "Clear",
    "CloseRoom",
    "Command",
    "ConfirmVerification",
    "Continuity",
    "CreateRoom",
    "DeclineInvite",
    "DiffError",
    "DumpState",
    "EditMessage",
    "EngineConfig",
    "Event",
    "EventItem",
    "EventNotFound",
    "Failed",
    "FillGap",
    "GapLifecycle",
    "HistoryGapItem",
    "HistoryRepair",
    "HistoryRepairChanged",
    "HistoryRepairCommand",
    "HistoryRepairReport",
    "InReplyTo",
    "Insert",
    "Interrupted",
    "Invalid",
    "InviteUser",
    "JoinRoom",
    "LeaveRoom",
    "MarkRead",
    "Member",
    "MembersChanged",
    "Ok",
    "OpenRoom",
    "OpenThread",
    "PaginateBackwards",
    "PushBack",
    "PushFront",
    "Reaction",
    "ReadMarkerItem",
    "RecentHistoryChanged",
    "RecentHistoryKind",
    "RecentHistoryState",
    "RedactEvent",
    "Remove",
    "RepairPhase",
    "RepairStop",
    "ReplyStatus",
    "Reset",
    "RetryRecent",
    "RetrySend",
    "RoomBusy",
    "RoomCreated",
    "RoomNotOpen",
    "SendMessage",
    "SendQueueChanged",
    "SendReaction",
    "SendState",
    "SendStateKind",
    "Set",
    "SetTopic",
    "SetTyping",
    "ShrinkTimeline",
    "Shutdown",
    "StartVerification",
    "ThreadLatest",
    "ThreadSummary",
    "TimelineChanged",
    "TimelineItem",
    "TimelineReset",
    "TimelineState",
    "TypingChanged",
    "Undecrypted",
    "UtdReason",
    "VectorDiff",
    "VerificationChanged",
    "VerificationPhase",
    "apply_diff",
    "apply_diffs",
]


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Tunables of the engine; the defaults are the protocol's reference numbers.

    ``page_size`` and ``page_budget`` bound a ``FillGap`` (four pages of 50);
    ``recent_pages`` bounds the recent load on open (also four pages of 50);
    ``initial_history_limit`` is the fallback pagination when a recent load
    fails on a room with no events yet; ``open_window`` is how many of the
    newest retained rows an ``OpenRoom`` puts into its ``TimelineReset`` (at
    least 100, so an opened room always shows a screenful and more; older rows
    load on ``PaginateBackwards``); ``timeline_window`` bounds the rows an open
    room (or thread) holds in memory: scrolling back further drops rows at
    the newest end, and ``ShrinkTimeline`` (or returning to the live end)
    reloads the newest ``open_window`` rows as one ``Reset`` diff;
    ``send_backoff_s`` is the send queue's first and longest wait, in seconds,
    while the homeserver is unreachable (it doubles in between).
    """

    initial_history_limit: int = 20
    page_size: int = 50
    page_budget: int = 4
    recent_pages: int = 4
    open_window: int = 100
    timeline_window: int = 3000
    send_backoff_s: tuple[float, float] = (0.5, 10.0)

    def __post_init__(self) -> None:
        for name in ("initial_history_limit", "page_size", "page_budget", "recent_pages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {value!r}")
        if (
            isinstance(self.open_window, bool)
            or not isinstance(self.open_window, int)
            or self.open_window < 100
        ):
            raise ValueError(
                f"EngineConfig.open_window must be an integer >= 100 "
                f"(an opened room shows at least 100 rows), "
                f"got {self.open_window!r}"
            )
        if (
            isinstance(self.timeline_window, bool)
            or not isinstance(self.timeline_window, int)
            or self.timeline_window < self.open_window
        ):
            raise ValueError(
                f"EngineConfig.timeline_window must be an integer >= open_window "
                f"({self.open_window}), got {self.timeline_window!r}"
            )


# --------------------------------------------------------------------------- small enums


class RepairPhase(enum.Enum):
    """``Bridging`` as a fill starts; ``Ready`` or ``Paused`` as it settles."""

    Bridging = "Bridging"
    Ready = "Ready"
    Paused = "Paused"


class Continuity(enum.Enum):
    """What a settled fill proved about the interval it walked."""

    Verified = "Verified"  # the older section was reached; the gap is gone
    AccessibleStart = "AccessibleStart"  # accessible history ended before the older section


class RepairStop(enum.Enum):
    """Why a fill settled ``Paused`` without a failure."""

    Budget = "Budget"
    CursorStalled = "CursorStalled"
    HistoryUnavailable = "HistoryUnavailable"
    Cancelled = "Cancelled"


class RecentHistoryKind(enum.Enum):
    Loading = "Loading"
    Loaded = "Loaded"
    Cancelled = "Cancelled"
    Failed = "Failed"
    Idle = "Idle"


@dataclass(frozen=True, slots=True)
class RecentHistoryState:
    """State of a room's recent load: ``Loading | Loaded | Cancelled | Idle | Failed(message)``.

    Build the unit states from the class constants (``RecentHistoryState.LOADING``)
    and a failure with :meth:`failed`. ``message`` is set exactly when ``kind``
    is ``Failed``.
    """

    kind: RecentHistoryKind
    message: str | None = None

    LOADING: ClassVar[RecentHistoryState]
    LOADED: ClassVar[RecentHistoryState]
    CANCELLED: ClassVar[RecentHistoryState]
    IDLE: ClassVar[RecentHistoryState]

    def __post_init__(self) -> None:
        if (self.kind is RecentHistoryKind.Failed) != (self.message is not None):
            raise ValueError("RecentHistoryState carries a message exactly when it is Failed")

    @classmethod
    def failed(cls, message: str) -> RecentHistoryState:
        return cls(RecentHistoryKind.Failed, message)


RecentHistoryState.LOADING = RecentHistoryState(RecentHistoryKind.Loading)
RecentHistoryState.LOADED = RecentHistoryState(RecentHistoryKind.Loaded)
RecentHistoryState.CANCELLED = RecentHistoryState(RecentHistoryKind.Cancelled)
RecentHistoryState.IDLE = RecentHistoryState(RecentHistoryKind.Idle)


# --------------------------------------------------------------------------- diffs (eyeball-im VectorDiff)


# msgspec Structs: a page of fifty rows makes fifty diffs, and a Struct is made in a sixth
# of a frozen dataclass's time.


class Append(msgspec.Struct, frozen=True):
    values: tuple[TimelineItem, ...]


class PushFront(msgspec.Struct, frozen=True):
    value: TimelineItem


class PushBack(msgspec.Struct, frozen=True):
    value: TimelineItem


class Insert(msgspec.Struct, frozen=True):
    index: int
    value: TimelineItem


class Set(msgspec.Struct, frozen=True):
    index: int
    value: TimelineItem


class Remove(msgspec.Struct, frozen=True):
    index: int


class Clear(msgspec.Struct, frozen=True):
    pass


class Reset(msgspec.Struct, frozen=True):
    values: tuple[TimelineItem, ...]


VectorDiff: TypeAlias = Append | PushFront | PushBack | Insert | Set | Remove | Clear | Reset


class DiffError(ValueError):
    """A diff that does not fit the items it is applied to (an index out of range)."""


def apply_diff(items: Sequence[TimelineItem], diff: VectorDiff) -> tuple[TimelineItem, ...]:
    """Return ``items`` with ``diff`` applied, the way eyeball-im's ``VectorDiff::apply`` does.

    Pure: ``items`` is not changed. An index out of range raises
    :class:`DiffError` rather than clamping, because a diff stream that does
    not line up with its reader is a bug to surface, not to paper over.
    """
    return apply_diffs(items, (diff,))


def apply_diffs(
    items: Sequence[TimelineItem], diffs: Sequence[VectorDiff]
) -> tuple[TimelineItem, ...]:
    """Apply ``diffs`` in order (as one ``TimelineChanged`` carries them); pure, like
    :func:`apply_diff`.

    One list for the whole batch: a page of a fill is fifty inserts, and a tuple
    rebuilt per diff cost as much as the window, per row."""
    out = list(items)
    for diff in diffs:
        n = len(out)
        match diff:
            case Append(values=values):
                out.extend(values)
            case PushFront(value=value):
                out.insert(0, value)
            case PushBack(value=value):
                out.append(value)
            case Insert(index=index, value=value):
                if not 0 <= index <= n:
                    raise DiffError(f"Insert at {index} into {n} items")
                out.insert(index, value)
            case Set(index=index, value=value):
                if not 0 <= index < n:
                    raise DiffError(f"Set at {index} of {n} items")
                out[index] = value
            case Remove(index=index):
                if not 0 <= index < n:
                    raise DiffError(f"Remove at {index} of {n} items")
                del out[index]
            case Clear():
                out.clear()
            case Reset(values=values):
                out = list(values)
            case _:
                raise TypeError(f"not a VectorDiff: {diff!r}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TimelineState:
    """A room's timeline rows, oldest first (index 0 is the oldest row)."""

    items: tuple[TimelineItem, ...] = ()

    def apply(self, *diffs: VectorDiff) -> TimelineState:
        return TimelineState(apply_diffs(self.items, diffs))


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class Ok:
    pass


@dataclass(frozen=True, slots=True)
class RoomBusy:
    """Another history operation runs in the room."""


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The command was cancelled (``Cancel``, ``CloseRoom``, ``Shutdown``)."""


@dataclass(frozen=True, slots=True)
class EventNotFound:
    """The gap (or event) named by the command does not exist (a joined gap is gone)."""


@dataclass(frozen=True, slots=True)
class RoomNotOpen:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    message: str


@dataclass(frozen=True, slots=True)
class Invalid:
    message: str


@dataclass(frozen=True, slots=True)
class RoomCreated:
    """``CreateRoom`` made the room: its id (the room opens at once)."""

    room_id: str


Answer: TypeAlias = (
    Ok | RoomBusy | Interrupted | EventNotFound | RoomNotOpen | Failed | Invalid | RoomCreated
)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryRepairReport:
    """One report of a ``FillGap``: ``Bridging`` as it starts, then once as it settles.

    ``pages``/``events`` count what this fill committed. Settled shapes:
    ``Ready`` + ``Verified``; ``Paused`` + a ``stop`` (``HistoryUnavailable``
    comes with ``AccessibleStart``); ``Paused`` + a ``failure``.
    """

    room_id: str
    gap_id: str
    pages: int = 0
    events: int = 0
    phase: RepairPhase = RepairPhase.Bridging
    continuity: Continuity | None = None
    stop: RepairStop | None = None
    failure: str | None = None

    @property
    def settled(self) -> bool:
        return self.phase is not RepairPhase.Bridging


@dataclass(frozen=True, slots=True)
class RecentHistoryChanged:
    room_id: str
    state: RecentHistoryState


@dataclass(frozen=True, slots=True)
class HistoryRepairChanged:
    """Carries a report; on the wire the report's fields sit directly under the tag."""

    report: HistoryRepairReport

    @property
    def room_id(self) -> str:
        return self.report.room_id


@dataclass(frozen=True, slots=True)
class TimelineReset:
    """A room's retained rows as it opens; sent once per open, never for history.

    ``thread_root`` is set for a thread's timeline (``OpenThread``), ``None`` for
    the room's main timeline.
    """

    room_id: str
    items: tuple[TimelineItem, ...] = field(default=())
    thread_root: str | None = None


@dataclass(frozen=True, slots=True)
class TimelineChanged:
    room_id: str
    diffs: tuple[VectorDiff, ...] = field(default=())
    thread_root: str | None = None


@dataclass(frozen=True, slots=True)
class TypingChanged:
    """Who is typing in an open room now (other than this account)."""

    room_id: str
    user_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MembersChanged:
    """Members of an open room whose name or membership changed (all of them as the
    room opens). A member whose ``membership`` is ``leave`` or ``ban`` left the list."""

    room_id: str
    members: tuple[Member, ...] = ()


@dataclass(frozen=True, slots=True)
class SendQueueChanged:
    """How many messages the send queue holds (all rooms): ``pending`` not yet in the
    room (queued, or acknowledged and awaiting the sync), ``failed`` refused for good.
    Published when the engine starts and whenever either count changes."""

    pending: int = 0
    failed: int = 0


Event: TypeAlias = (
    RecentHistoryChanged
    | HistoryRepairChanged
    | TimelineReset
    | TimelineChanged
    | TypingChanged
    | MembersChanged
    | SendQueueChanged
    | VerificationChanged
)
