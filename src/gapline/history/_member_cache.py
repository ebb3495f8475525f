"""Committed member state kept in memory between transactions: records and name counts.

Why: every page of a walk names its senders (``_members``), and reading their
records back costs an ``IN`` lookup, a decryption and a JSON parse per sender,
plus a count of the members sharing each name, in every transaction, for
records that almost never change between two pages.

What keeps it correct (the cache holds only what a committed transaction
says, for this store, which is the only writer of its history tables: a store
directory is locked to one engine, ``_store_lock``; a backend passed to
``Engine.open`` is the caller's to keep to one):

- a value read inside a write transaction is installed by a
  ``Tx.after_commit`` hook, so a transaction that rolls back installs
  nothing;
- writing any member record of a room registers a hook that drops the
  room's whole entry (records and name counts, since a name count depends
  on every member), and bumps the room's generation;
- a read installs only if the room's generation did not move between the
  read and its commit: a value read before a concurrent writer (PostgreSQL's
  ``writers=N``) changed the room, or before this transaction's own member
  writes, is never installed.

A room keeps at most ``per_room`` records and the cache at most ``rooms``
rooms (the oldest dropped first): enough for the recent senders of the
rooms being read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gapline.history._updates import MemberRecord

__all__ = ["MemberCache"]


class _RoomMembers:
    __slots__ = ("holders", "records")

    def __init__(self) -> None:
        self.records: dict[str, MemberRecord | None] = {}  # None: no record stored
        self.holders: dict[str, int] = {}  # display name -> present members using it


class MemberCache:
    """Member records (by room number and user) and name counts, as last committed."""

    def __init__(self, *, rooms: int = 64, per_room: int = 1024) -> None:
        self._max_rooms = rooms
        self._per_room = per_room
        self._lock = threading.Lock()  # hooks of several writer threads (PostgreSQL)
        self._rooms: dict[int, _RoomMembers] = {}
        self._generation: dict[int, int] = {}

    def generation(self, rid: int) -> int:
        return self._generation.get(rid, 0)

    def records(
        self, rid: int, users: Iterable[str]
    ) -> tuple[dict[str, MemberRecord | None], list[str]]:
        """The cached records of ``users`` (``None``: known to have none), and the users
        not cached."""
        with self._lock:
            room = self._rooms.get(rid)
            held = {} if room is None else room.records
            known = {u: held[u] for u in users if u in held}
        return known, [u for u in users if u not in known]

    def holders(self, rid: int, name: str) -> int | None:
        with self._lock:
            room = self._rooms.get(rid)
            return None if room is None else room.holders.get(name)

    def install(
        self,
        rid: int,
        generation: int,
        records: dict[str, MemberRecord | None] | None = None,
        holders: dict[str, int] | None = None,
    ) -> None:
        """After commit: values read at ``generation`` (dropped if the room moved since)."""
        with self._lock:
            if self._generation.get(rid, 0) != generation:
                return
            room = self._rooms.get(rid)
            if room is None:
                if len(self._rooms) >= self._max_rooms:
                    del self._rooms[next(iter(self._rooms))]
                room = self._rooms[rid] = _RoomMembers()
            if records:
                if len(room.records) + len(records) > self._per_room:
                    room.records.clear()
                room.records.update(records)
            if holders:
                room.holders.update(holders)

    def invalidate(self, rid: int) -> None:
        """After commit: the room's member state changed."""
        with self._lock:
            self._generation[rid] = self._generation.get(rid, 0) + 1
            self._rooms.pop(rid, None)
