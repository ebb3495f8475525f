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
    RecentHistoryChanged,
    RecentHistoryKind,
    RecentHistoryState,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
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
    ``timelines``: the rows of each open room, oldest first.
    """

    recent_history: Mapping[str, RecentHistoryState] = field(default_factory=lambda: _frozen({}))
    repairs: Mapping[str, HistoryRepairReport] = field(default_factory=lambda: _frozen({}))
    timelines: Mapping[str, tuple[TimelineItem, ...]] = field(default_factory=lambda: _frozen({}))

    def recent(self, room_id: str) -> RecentHistoryState:
        """The room's recent load state; ``Idle`` when it has no entry."""
        return self.recent_history.get(room_id, RecentHistoryState.IDLE)


class Mirror:
    """Applies published events to a :class:`State`; an :class:`EventSink`."""

    def __init__(self) -> None:
        self._recent: dict[str, RecentHistoryState] = {}
        self._repairs: dict[str, HistoryRepairReport] = {}
        self._timelines: dict[str, tuple[TimelineItem, ...]] = {}

    @property
    def state(self) -> State:
        """An immutable snapshot; later events do not change it."""
        return State(_frozen(self._recent), _frozen(self._repairs), _frozen(self._timelines))

    def items(self, room_id: str) -> tuple[TimelineItem, ...] | None:
        """The room's rows, or ``None`` when the room is not open in the mirror."""
        return self._timelines.get(room_id)

    async def publish(self, event: Event) -> None:
        self.apply(event)

    def apply(self, event: Event) -> None:
        match event:
            case TimelineReset(room_id=room_id, items=items):
                self._timelines[room_id] = tuple(items)
            case TimelineChanged(room_id=room_id, diffs=diffs):
                current = self._timelines.get(room_id)
                if current is None:
                    raise MirrorError(f"TimelineChanged for {room_id}, which is not open")
                try:
                    self._timelines[room_id] = apply_diffs(current, diffs)
                except DiffError as exc:
                    raise MirrorError(f"TimelineChanged for {room_id}: {exc}") from exc
            case RecentHistoryChanged(room_id=room_id, state=state):
                if state.kind is RecentHistoryKind.Idle:
                    self._recent.pop(room_id, None)
                    self._repairs.pop(room_id, None)
                    self._timelines.pop(room_id, None)
                else:
                    self._recent[room_id] = state
            case HistoryRepairChanged(report=report):
                self._repairs[report.room_id] = report
            case _:
                raise MirrorError(f"not an engine event: {event!r}")
