"""Per room, a superset of the keys one table holds, so a lookup asks only for keys that may exist.

Why: a relation page looks up every event id (and every target) in
``history_aggregate``, and every relation event in ``history_relation``, and
almost none are there; an ``IN`` query of keys none of which exist is most of
what those lookups cost.

What a room's entry is: unknown (nothing known: query), a set of keys that is a
*superset* of the keys the room's committed rows hold (query only the keys in
it, none when none are), or "too many" (over the cap: query, as without it).

What keeps it a superset (as with ``_member_cache``, this holds because the
store is the only writer of its history tables: ``_store_lock``):

- every write adds its keys inside its transaction, before COMMIT, whatever the
  room's state: a room still unknown keeps them as *written* keys, which a load
  joins to what it read. So a row committed after a load's read began (a
  concurrent writer of PostgreSQL, or the writer while a reader loads) is in the
  set: its key was added before its COMMIT, so before or after the install, and
  either way it is kept;
- a load installs only if no write touched the room since the load began (the
  room's generation did not move): what it read is then all there is;
- a write that rolls back leaves its keys (a superset still), and a delete never
  removes one;
- a room over ``per_room`` keys, or the sets over ``total`` keys in all, turns
  "too many" for good (until the store is reopened): nothing is ever dropped
  from a set that is answering.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

__all__ = ["KeySets"]


class _RoomKeys:
    __slots__ = ("keys", "loaded")

    def __init__(self) -> None:
        self.keys: set[bytes] | None = set()  # None: too many
        self.loaded = False  # False: ``keys`` are only those written since the store opened


class KeySets:
    """Supersets of one table's keys, by room number."""

    def __init__(self, *, per_room: int = 20_000, total: int = 200_000) -> None:
        self.per_room = per_room
        self._total_cap = total
        self._total = 0  # keys held in all sets
        self._lock = threading.Lock()  # the writer threads of PostgreSQL, and readers
        self._rooms: dict[int, _RoomKeys] = {}
        self._generation: dict[int, int] = {}

    def may_hold(self, rid: int, keys: Sequence[bytes]) -> list[bytes] | None:
        """Those of ``keys`` the room may hold (in their order); ``None``: not known, load
        the room (:meth:`load`) or query them all."""
        with self._lock:
            room = self._rooms.get(rid)
            if room is None:
                return None
            held = room.keys
            if held is None:
                return list(keys)
            if not room.loaded:
                return None
            return [k for k in keys if k in held]

    def holds_none(self, rid: int) -> bool:
        """True only for a loaded room whose set is empty (nothing to hash keys for)."""
        with self._lock:
            room = self._rooms.get(rid)
            return room is not None and room.loaded and room.keys is not None and not room.keys

    def add(self, rid: int, keys: Iterable[bytes]) -> None:
        """Inside a write, before its COMMIT: the room's table now holds (or may) ``keys``."""
        with self._lock:
            self._generation[rid] = self._generation.get(rid, 0) + 1
            room = self._rooms.get(rid)
            if room is None:
                room = self._rooms[rid] = _RoomKeys()
            self._grow(room, keys)

    def load(self, rid: int, read: Callable[[int], Iterable[bytes]]) -> None:
        """Read the room's keys (``read(limit)`` returns at most ``limit`` of them) and install
        them, unless a write touched the room meanwhile (then it stays unknown)."""
        with self._lock:
            generation = self._generation.get(rid, 0)
            room = self._rooms.get(rid)
            if room is not None and (room.loaded or room.keys is None):
                return
        found = set(read(self.per_room + 1))
        with self._lock:
            if self._generation.get(rid, 0) != generation:
                return
            room = self._rooms.get(rid)
            if room is None:
                room = self._rooms[rid] = _RoomKeys()
            if room.loaded:
                return
            room.loaded = True
            if len(found) > self.per_room:
                self._too_many(room)
                return
            self._grow(room, found)

    def _grow(self, room: _RoomKeys, keys: Iterable[bytes]) -> None:
        """Add ``keys`` to a room's set (under the lock), turning it "too many" over a cap."""
        held = room.keys
        if held is None:
            return
        before = len(held)
        held.update(keys)
        self._total += len(held) - before
        if len(held) > self.per_room or self._total > self._total_cap:
            self._too_many(room)

    def _too_many(self, room: _RoomKeys) -> None:
        if room.keys is not None:
            self._total -= len(room.keys)
        room.keys = None
