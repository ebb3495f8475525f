"""The local echoes a timeline shows, and the events that took over their rows.

Local echoes (messages in the send queue) sit after every event at
``(ECHO_ORD, seq, 1)``. When the sync brings the server's event for one (by
our transaction id, or by the event id the server answered), the event takes
the echo's place under the echo's row id: a ``Set`` diff when it lands where
the echo was, else the echo's ``Remove`` and the event's ``Insert`` (the
server ordered another event between). The row keeps the echo's id for as
long as this timeline lives, reloads included: the aliases outlive a reload,
and so do the settled transactions (an echo read back after its event
arrived is not shown again).
"""

from __future__ import annotations

from msgspec.structs import replace

from gapline.history._echoes import ECHO_PREFIX
from gapline.history._items import EventItem
from gapline.history._timeline_parts import RowKey
from gapline.history._types import TimelineItem
from gapline.history._updates import EchoPlaced
from gapline.matrix import ClientEvent

__all__ = ["EchoRows"]


class EchoRows:
    """Which echo rows a timeline holds, and what became of the ones that left."""

    __slots__ = ("_aliases", "_events", "keys", "settled")

    def __init__(self) -> None:
        self.keys: dict[str, RowKey] = {}  # txn id -> echo row key
        self._events: dict[str, str] = {}  # acknowledged event id -> txn id
        self.settled: set[str] = set()  # txn ids whose echo became (or left for) an event
        self._aliases: dict[str, str] = {}  # event id -> the echo row id it took over

    def clear(self) -> None:
        """Forget the rows held (a reload); the settled echoes and aliases stay."""
        self.keys.clear()
        self._events.clear()

    def track(self, key: RowKey, echo: EchoPlaced) -> None:
        self.keys[echo.txn_id] = key
        if echo.item.event_id != echo.item.id:
            self._events[echo.item.event_id] = echo.txn_id

    def untrack(self, key: RowKey, item: EventItem) -> None:
        txn = item.id.removeprefix(ECHO_PREFIX)
        if self.keys.get(txn) == key:
            del self.keys[txn]
        self._events.pop(item.event_id, None)

    def forget_event(self, event_id: str) -> None:
        """An echo row is about to show another item: its old event id no longer leads to it."""
        self._events.pop(event_id, None)

    def answered(self, event: ClientEvent) -> str | None:
        """The queued message (txn id) this event of the server answers, if one is shown."""
        if not self.keys:
            return None
        txn = event.transaction_id
        if txn is not None and txn in self.keys:
            return txn
        return self._events.get(event.event_id)

    def alias(self, event_id: str, row_id: str) -> None:
        """The event ``event_id`` took over the echo row ``row_id``."""
        self._aliases[event_id] = row_id

    @property
    def aliasing(self) -> bool:
        """Some event took over an echo's row (else :meth:`aliased` returns every row)."""
        return bool(self._aliases)

    def aliased(self, item: TimelineItem) -> TimelineItem:
        """An event that took over an echo's row keeps showing under the echo's id."""
        if self._aliases and isinstance(item, EventItem) and item.send_state is None:
            alias = self._aliases.get(item.event_id)
            if alias is not None and alias != item.id:
                return replace(item, id=alias)
        return item
