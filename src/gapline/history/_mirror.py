"""The mirror: what a reader of the event stream knows, rebuilt from published events only.

It keeps the protocol's ``State.recent_history`` (room -> recent load state; a room
without an entry is idle) and ``State.repairs`` (room -> the last
``HistoryRepairReport`` published for it), plus each open room's timeline
rows. Rules, applied per event in publish order:

- ``TimelineReset``: the room is open; its rows become ``items``.
- ``TimelineChanged``: ``diffs`` are applied in order to the room's rows. A
  room without rows (never reset, or closed) is a :class:`MirrorError`, as is
  a diff that does not fit (an index out of range).
- ``RecentHistoryChanged``: ``Loading``/``Loaded``/``Cancelled``/``Failed``
  replace the room's entry. ``Idle`` is published exactly when a room closes,
  so it drops everything the mirror holds for the room: the
  ``recent_history`` entry, the ``repairs`` entry and the timeline rows.
  (Closing a room drops both.)
- ``HistoryRepairChanged``: the report replaces ``repairs[room]`` (the
  ``Bridging`` report, then the settled one).
- A ``TimelineReset``/``TimelineChanged`` with a ``thread_root`` applies to
  that thread's rows (``State.threads[room][root]``) the same way.
- ``TypingChanged`` replaces who types in the room (``State.typing``, no
  entry when nobody); ``MembersChanged`` upserts members into
  ``State.members`` (sorted by user id; one who left or was banned is
  dropped). ``Idle`` drops the room's threads, typing and members too.
- ``SendQueueChanged`` replaces :attr:`Mirror.send_queue` (the queue's counts).
- ``VerificationChanged`` replaces the flow's entry in :attr:`Mirror.verifications`.

Attach a mirror to an engine as an :class:`EventSink`: it applies
synchronously inside ``publish``, so by the time a command's answer is
released the mirror shows the command's outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gapline.history._types import (
    DiffError,
    Event,
    HistoryRepairChanged,
    HistoryRepairReport,
    Member,
    MembersChanged,
    RecentHistoryChanged,
    RecentHistoryKind,
    RecentHistoryState,
    SendQueueChanged,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    TypingChanged,
    VerificationChanged,
    apply_diffs,
)

__all__ = ["Mirror", "MirrorError", "State"]


class MirrorError(ValueError):
    """An event that does not fit what the mirror holds (a diff for an unopened room, ...)."""


def _frozen(d: dict) -> Mapping:
    return MappingProxyType(dict(d))


@dataclass(frozen=True, slots=True)
class State:
    """A snapshot of the mirror; rooms in each mapping are keyed by room id.

    ``recent_history``: rooms whose recent load is not idle. ``repairs``: the
    last fill report of each room that had a fill since it opened.
    ``timelines``: the rows of each open room, oldest first. ``threads``: per
    room, the rows of each open thread (by root event id). ``typing``: who
    types in each open room. ``members``: each open room's members.
    """

    recent_history: Mapping[str, RecentHistoryState] = field(default_factory=lambda: _frozen({}))
    repairs: Mapping[str, HistoryRepairReport] = field(default_factory=lambda: _frozen({}))
    timelines: Mapping[str, tuple[TimelineItem, ...]] = field(default_factory=lambda: _frozen({}))
    threads: Mapping[str, Mapping[str, tuple[TimelineItem, ...]]] = field(
        default_factory=lambda: _frozen({})
    )
    typing: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _frozen({}))
    members: Mapping[str, tuple[Member, ...]] = field(default_factory=lambda: _frozen({}))

    def recent(self, room_id: str) -> RecentHistoryState:
        """The room's recent load state; ``Idle`` when it has no entry."""
        return self.recent_history.get(room_id, RecentHistoryState.IDLE)


class Mirror:
    """Applies published events to a :class:`State`; an :class:`EventSink`."""

    def __init__(self) -> None:
        self._recent: dict[str, RecentHistoryState] = {}
        self._repairs: dict[str, HistoryRepairReport] = {}
        self._timelines: dict[str, tuple[TimelineItem, ...]] = {}
        self._threads: dict[str, dict[str, tuple[TimelineItem, ...]]] = {}
        self._typing: dict[str, tuple[str, ...]] = {}
        self._members: dict[str, dict[str, Member]] = {}
        self.send_queue = SendQueueChanged()
        self.verifications: dict[str, VerificationChanged] = {}
        """The last state of each verification flow, by flow ID (not part of `State`)."""
        """The send queue's counts as last published."""

    @property
    def state(self) -> State:
        """An immutable snapshot; later events do not change it."""
        return State(
            _frozen(self._recent),
            _frozen(self._repairs),
            _frozen(self._timelines),
            _frozen({r: _frozen(t) for r, t in self._threads.items()}),
            _frozen(self._typing),
            _frozen({r: tuple(m[u] for u in sorted(m)) for r, m in self._members.items()}),
        )

    def items(
        self, room_id: str, thread_root: str | None = None
    ) -> tuple[TimelineItem, ...] | None:
        """The room's (or thread's) rows, or ``None`` when it is not open in the mirror."""
        if thread_root is not None:
            return self._threads.get(room_id, {}).get(thread_root)
        return self._timelines.get(room_id)

    def members(self, room_id: str) -> tuple[Member, ...]:
        """The room's members, by user id."""
        found = self._members.get(room_id, {})
        return tuple(found[u] for u in sorted(found))

    def typing(self, room_id: str) -> tuple[str, ...]:
        return self._typing.get(room_id, ())

    async def publish(self, event: Event) -> None:
        self.apply(event)

    def apply(self, event: Event) -> None:
        match event:
            case TimelineReset(room_id=room_id, items=items, thread_root=None):
                self._timelines[room_id] = tuple(items)
            case TimelineReset(room_id=room_id, items=items, thread_root=str(root)):
                if room_id not in self._timelines:
                    raise MirrorError(f"a thread of {room_id}, which is not open")
                self._threads.setdefault(room_id, {})[root] = tuple(items)
            case TimelineChanged(room_id=room_id, diffs=diffs, thread_root=root):
                where = room_id if root is None else f"{room_id} thread {root}"
                rows = self._timelines if root is None else self._threads.get(room_id, {})
                current = rows.get(room_id if root is None else root)
                if current is None:
                    raise MirrorError(f"TimelineChanged for {where}, which is not open")
                try:
                    rows[room_id if root is None else root] = apply_diffs(current, diffs)
                except DiffError as exc:
                    raise MirrorError(f"TimelineChanged for {where}: {exc}") from exc
            case TypingChanged(room_id=room_id, user_ids=user_ids):
                if user_ids:
                    self._typing[room_id] = tuple(user_ids)
                else:
                    self._typing.pop(room_id, None)
            case MembersChanged(room_id=room_id, members=members):
                known = self._members.setdefault(room_id, {})
                for member in members:
                    if member.membership in ("leave", "ban"):
                        known.pop(member.user_id, None)
                    else:
                        known[member.user_id] = member
            case RecentHistoryChanged(room_id=room_id, state=state):
                if state.kind is RecentHistoryKind.Idle:
                    for held in (
                        self._recent,
                        self._repairs,
                        self._timelines,
                        self._threads,
                        self._typing,
                        self._members,
                    ):
                        held.pop(room_id, None)
                else:
                    self._recent[room_id] = state
            case HistoryRepairChanged(report=report):
                self._repairs[report.room_id] = report
            case SendQueueChanged():
                self.send_queue = event
            case VerificationChanged(flow_id=flow_id):
                self.verifications[flow_id] = event
            case _:
                raise MirrorError(f"not an engine event: {event!r}")
