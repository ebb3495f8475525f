"""Display names as of each event, from the room's member state.

:class:`MemberView` reads and changes the room's current member state inside
one write transaction. It names senders two ways, because history arrives two
ways:

- forwards (a sync): the state block, then each membership event of the
  timeline in order, moves the current state; an event's sender is named by
  the state just before it (a join names its sender by the join's own name);
- backwards (a page of ``/messages`` or ``/relations``, newest first): the
  current state is where the walk starts, and each membership event the walk
  passes gives, through its ``prev_content``, the name its sender had before
  it. A backwards walk never moves the current state.

A name is disambiguated (``Alice (@alice:example.org)``) when another member
who is joined or invited has the same display name then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gapline.history._relation_store import PRESENT
from gapline.history._updates import MemberRecord, Room
from gapline.matrix import ClientEvent
from gapline.storage import Tx

if TYPE_CHECKING:
    from gapline.history._cache_store import CacheStore

__all__ = ["MemberView", "member_record"]

MEMBER = "m.room.member"


def _name(content: Any) -> str | None:
    if not isinstance(content, dict):
        return None
    name = content.get("displayname")
    return name.strip() or None if isinstance(name, str) else None


def member_record(event: ClientEvent) -> MemberRecord | None:
    """The member state an ``m.room.member`` event sets, if it is one."""
    if event.type != MEMBER or not event.state_key:
        return None
    membership = event.content.get("membership")
    if not isinstance(membership, str):
        return None
    return MemberRecord(event.state_key, _name(event.content), membership)


class MemberView:
    """One room's member state within a transaction; ``changed`` is what to store."""

    def __init__(self, store: CacheStore, tx: Tx, room: Room) -> None:
        self._tables = store.relations
        self._tx = tx
        self._room = room
        self._stored: dict[str, MemberRecord | None] = {}
        self._current: dict[str, MemberRecord | None] = {}
        self._holders: dict[str, int] = {}
        self.changed: dict[str, MemberRecord] = {}

    def _load(self, users: Iterable[str]) -> None:
        missing = [u for u in dict.fromkeys(users) if u not in self._stored]
        if not missing:
            return
        found = self._tables.members(self._tx, self._room, missing)
        for user in missing:
            self._stored[user] = self._current[user] = found.get(user)

    def _count(self, name: str) -> int:
        """Present members using ``name`` now (the stored count, moved by this transaction)."""
        if name not in self._holders:
            self._holders[name] = self._tables.name_holders(self._tx, self._room, name)
        count = self._holders[name]
        for user, now in self.changed.items():
            before = self._stored.get(user)
            count -= int(
                before is not None and before.display_name == name and before.membership in PRESENT
            )
            count += int(now.display_name == name and now.membership in PRESENT)
        return count

    def _as_now(self, events: Sequence[ClientEvent]) -> dict[str, str | None]:
        """Names of a batch that changes no member: each sender's current name, worked out
        once per sender (most pages come from a handful of senders)."""
        shown: dict[str, str | None] = {}
        for sender in dict.fromkeys(e.sender for e in events):
            current = self._current.get(sender)
            shown[sender] = self.display(sender, None if current is None else current.display_name)
        return {e.event_id: shown[e.sender] for e in events}

    def display(self, user: str, name: str | None) -> str | None:
        if name is None:
            return None
        return f"{name} ({user})" if self._count(name) > 1 else name

    def set(self, record: MemberRecord) -> None:
        self._load([record.user_id])
        if self._current.get(record.user_id) != record:
            self._current[record.user_id] = record
            self.changed[record.user_id] = record

    def apply_state(self, events: Sequence[ClientEvent]) -> None:
        """A sync's state block: the state just before its timeline."""
        for event in events:
            record = member_record(event)
            if record is not None:
                self.set(record)

    def forward(self, events: Sequence[ClientEvent]) -> dict[str, str | None]:
        """Names of a sync's timeline events (oldest first), moving the current state."""
        self._load([e.sender for e in events] + [e.state_key for e in events if e.state_key])
        if not any(e.type == MEMBER for e in events):
            return self._as_now(events)
        names: dict[str, str | None] = {}
        for event in events:
            record = member_record(event)
            current = self._current.get(event.sender)
            name = current.display_name if current is not None else None
            if record is not None:
                if record.user_id == event.sender and name is None:
                    name = record.display_name
                names[event.event_id] = self.display(event.sender, name)
                self.set(record)
            else:
                names[event.event_id] = self.display(event.sender, name)
        return names

    def backward(self, events: Sequence[ClientEvent]) -> dict[str, str | None]:
        """Names of a backwards page's events (newest first); the current state stays."""
        self._load([e.sender for e in events])
        if not any(e.type == MEMBER for e in events):
            return self._as_now(events)
        before: dict[str, str | None] = {}
        names: dict[str, str | None] = {}
        for event in events:
            record = member_record(event)
            if event.sender in before:
                name = before[event.sender]
            else:
                current = self._current.get(event.sender)
                name = current.display_name if current is not None else None
            if record is not None:
                prev = _name(event.unsigned.get("prev_content"))
                if record.user_id == event.sender:
                    name = prev if prev is not None else record.display_name
                before[record.user_id] = prev
            names[event.event_id] = self.display(event.sender, name)
        return names
