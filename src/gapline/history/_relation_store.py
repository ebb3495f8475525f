"""The tables of the relation rules: aggregates, the relation index, members, detached events.

Schema in ``_cache_store`` (migration 2). Like the rest of the cache, every
value is sealed with the store's cipher and every looked-up id is a keyed
hash: an aggregate is bound (AAD) to its room and target, a member record to
its room and user, a detached event to its room and event id. The functions
here only read, or apply the updates ``Sections`` emitted
(:meth:`RelationTables.write`); the rules themselves are in ``_admission``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from gapline.history._aggregates import Aggregate, decode_aggregate, encode_aggregate
from gapline.history._cache_schema import IN_LIST
from gapline.history._key_sets import KeySets
from gapline.history._member_cache import MemberCache
from gapline.history._updates import (
    AggregateChanged,
    DetachedStored,
    MemberRecord,
    MembersUpdated,
    RelationIndexed,
    Room,
    Update,
)
from gapline.matrix import ClientEvent
from gapline.storage import Tx

if TYPE_CHECKING:
    from gapline.history._cache_store import CacheStore

__all__ = ["PRESENT", "RelationTables"]

PRESENT = ("join", "invite")
"""Memberships whose display name counts when deciding whether two names clash."""

_SEALED_KEPT = 4096  # sealed aggregates remembered (RelationTables._sealed)


class RelationTables:
    """Reads and writes of the relation tables, for one :class:`CacheStore`."""

    def __init__(self, store: CacheStore) -> None:
        self._store = store
        self.aggregate_keys = KeySets()
        """A superset of each room's ``history_aggregate.target`` keys (``_key_sets``):
        a lookup asks only for targets that may hold an aggregate, none in a room of
        plain messages. Every write of the table goes through :meth:`write`."""
        self.relation_keys = KeySets()
        """The same for ``history_relation.event``: "seen before?" asks only for relation
        events that may have been."""
        self._sealed: dict[tuple[int, bytes], tuple[Aggregate, bytes]] = {}
        """The last sealed value of an aggregate, by (room, target), with the aggregate it
        seals: a page seals each aggregate once for its row's copy and its table row, and
        an unchanged aggregate read from the table is copied onto a row as read. A sealed
        value stays valid (the store key never changes, the aad is the same for both);
        the aggregate is compared by identity, so any change seals anew."""
        self.member_cache = MemberCache()
        """Committed member records and name counts (``_member_cache``); every write of
        ``history_member`` goes through :meth:`write`, which keeps it in step."""

    def _hashes(
        self, ids: Iterable[str], known: dict[str, bytes] | None = None
    ) -> dict[bytes, str]:
        """Hashes of ``ids`` by hash; ``known`` is a cache of hashes (the transaction's),
        read and filled here: keyed hashing is most of what a relation lookup costs."""
        unique = list(dict.fromkeys(ids))
        if known is None:
            return dict(zip(self._store.event_keys(unique), unique, strict=True))
        missing = [i for i in unique if i not in known]
        if missing:
            known.update(zip(missing, self._store.event_keys(missing), strict=True))
        return {known[i]: i for i in unique}

    def _held(
        self, tx: Tx, sets: KeySets, table: str, column: str, rid: int, keys: Sequence[bytes]
    ) -> list[bytes]:
        """Those of ``keys`` the table may hold for the room (the room's keys are read once,
        the first time)."""
        held = sets.may_hold(rid, keys)
        if held is None:
            sets.load(
                rid,
                lambda limit: [
                    bytes(r[0])
                    for r in tx.all(
                        f"SELECT {column} FROM {table} WHERE room = ? LIMIT ?", (rid, limit)
                    )
                ],
            )
            held = sets.may_hold(rid, keys)
        return list(keys) if held is None else held

    def _in(self, tx: Tx, sql: str, room: Room, keys: Sequence[bytes]) -> Iterable[tuple[Any, ...]]:
        for start in range(0, len(keys), IN_LIST):
            chunk = keys[start : start + IN_LIST]
            yield from tx.all(sql.format(marks=",".join("?" * len(chunk))), (room.rid, *chunk))

    # -- aggregates -----------------------------------------------------------------------

    def aggregates(
        self,
        tx: Tx,
        room: Room,
        event_ids: Iterable[str],
        known: dict[str, bytes] | None = None,
    ) -> dict[str, Aggregate]:
        """The aggregates held for ``event_ids`` (those with none are left out); ``known``
        may hold hashes the caller computed already."""
        if self.aggregate_keys.holds_none(room.rid):
            return {}  # a room of plain messages: not even a hash to compute
        by_key = self._hashes(event_ids, known)
        keys = self._held(
            tx, self.aggregate_keys, "history_aggregate", "target", room.rid, list(by_key)
        )
        out: dict[str, Aggregate] = {}
        if not keys:
            return out
        for target, value in self._in(
            tx,
            "SELECT target, value FROM history_aggregate WHERE room = ? AND target IN ({marks})",
            room,
            keys,
        ):
            key, sealed = bytes(target), bytes(value)
            aggregate = out[by_key[key]] = self.open(room, key, sealed)
            self._remember(room.rid, key, aggregate, sealed)
        return out

    def open(self, room: Room, event_key: bytes, sealed: Any) -> Aggregate:
        """A sealed aggregate (of ``history_aggregate`` or a row's copy)."""
        plain = self._store.cipher.decrypt(bytes(sealed), room.key + b"agg" + event_key)
        return decode_aggregate(plain)

    def seal(self, room: Room, event_key: bytes, aggregate: Aggregate) -> bytes:
        [sealed] = self.seal_many(room, [(event_key, aggregate)])
        return sealed

    def seal_many(self, room: Room, entries: Sequence[tuple[bytes, Aggregate]]) -> list[bytes]:
        """Aggregates sealed in one cipher call (a page's are written together); one sealed
        already, or read sealed, and not changed since, is not sealed again."""
        rid, memo = room.rid, self._sealed
        out: list[bytes | None] = []
        todo: list[int] = []
        for i, (k, a) in enumerate(entries):
            hit = memo.get((rid, k))
            out.append(hit[1] if hit is not None and hit[0] is a else None)
            if out[-1] is None:
                todo.append(i)
        if todo:
            fresh = self._store.cipher.encrypt_many(
                [(encode_aggregate(entries[i][1]), room.key + b"agg" + entries[i][0]) for i in todo]
            )
            for i, sealed in zip(todo, fresh, strict=True):
                out[i] = sealed
                self._remember(rid, entries[i][0], entries[i][1], sealed)
        return [s for s in out if s is not None]

    def _remember(self, rid: int, key: bytes, aggregate: Aggregate, sealed: bytes) -> None:
        if len(self._sealed) >= _SEALED_KEPT:
            self._sealed.clear()  # bounded: a fill's pages need only their own
        self._sealed[(rid, key)] = (aggregate, sealed)

    def _put_aggregates(
        self,
        tx: Tx,
        room: Room,
        entries: Sequence[tuple[str, Aggregate, bool]],
        event_key: Callable[[str], bytes],
    ) -> None:
        """Aggregates, and their copies on the retained events' rows where asked."""
        keys = [event_key(t) for t, _, _ in entries]
        empty = Aggregate()
        gone = [(room.rid, k) for k, (_, a, _) in zip(keys, entries, strict=True) if a == empty]
        keep = [
            (k, a, on_row) for k, (_, a, on_row) in zip(keys, entries, strict=True) if a != empty
        ]
        sealed = self.seal_many(room, [(k, a) for k, a, _ in keep])
        kept = [(k, s, on_row) for (k, _, on_row), s in zip(keep, sealed, strict=True)]
        if gone:
            tx.executemany("DELETE FROM history_aggregate WHERE room = ? AND target = ?", gone)
            tx.executemany("UPDATE history_event SET agg = NULL WHERE room = ? AND event = ?", gone)
        if kept:
            self.aggregate_keys.add(room.rid, [k for k, _, _ in kept])  # before COMMIT
            tx.executemany(
                "INSERT INTO history_aggregate (room, target, value) VALUES (?, ?, ?)"
                " ON CONFLICT (room, target) DO UPDATE SET value = excluded.value",
                [(room.rid, k, sealed) for k, sealed, _ in kept],
            )
            copies = [(sealed, room.rid, k) for k, sealed, on_row in kept if on_row]
            if copies:
                tx.executemany(
                    "UPDATE history_event SET agg = ? WHERE room = ? AND event = ?", copies
                )

    # -- the relation index ---------------------------------------------------------------

    def forget(self, tx: Tx, room: Room, event_ids: Iterable[str], known: dict[str, bytes]) -> None:
        """Let these relation events take effect again: they were seen while their content
        could not be read (undecryptable), and are decrypted now."""
        keys = list(self._hashes(event_ids, known))
        for start in range(0, len(keys), IN_LIST):
            chunk = keys[start : start + IN_LIST]
            tx.execute(
                "DELETE FROM history_relation WHERE room = ?"
                f" AND event IN ({','.join('?' * len(chunk))})",
                (room.rid, *chunk),
            )

    def indexed(
        self,
        tx: Tx,
        room: Room,
        event_ids: Iterable[str],
        known: dict[str, bytes] | None = None,
    ) -> dict[str, tuple[str, str]]:
        """Relation events among ``event_ids`` already seen: the event each relates to,
        and how."""
        if self.relation_keys.holds_none(room.rid):
            return {}
        by_key = self._hashes(event_ids, known)
        keys = self._held(
            tx, self.relation_keys, "history_relation", "event", room.rid, list(by_key)
        )
        if not keys:
            return {}
        decrypt = self._store.cipher.decrypt
        return {
            by_key[bytes(event)]: (
                decrypt(bytes(target), room.key + b"rel" + bytes(event)).decode(),
                str(kind),
            )
            for event, target, kind in self._in(
                tx,
                "SELECT event, target_id, kind FROM history_relation WHERE room = ?"
                " AND event IN ({marks})",
                room,
                keys,
            )
        }

    # -- members --------------------------------------------------------------------------

    def members(self, tx: Tx, room: Room, user_ids: Iterable[str]) -> dict[str, MemberRecord]:
        """The stored records of ``user_ids`` (inside a write: the cache answers for the
        users it holds, and learns the others once this transaction commits)."""
        cache = self.member_cache
        known, missing = cache.records(room.rid, list(dict.fromkeys(user_ids)))
        if missing:
            generation = cache.generation(room.rid)
            by_key = {self._store.cipher.lookup_key("member:" + u): u for u in missing}
            read: dict[str, MemberRecord | None] = dict.fromkeys(missing)
            for member, value in self._in(
                tx,
                "SELECT member, value FROM history_member WHERE room = ? AND member IN ({marks})",
                room,
                list(by_key),
            ):
                read[by_key[bytes(member)]] = self._open_member(room, bytes(member), value)
            tx.after_commit(partial(cache.install, room.rid, generation, read))
            known.update(read)
        return {u: r for u, r in known.items() if r is not None}

    def all_members(self, tx: Tx, room: Room, limit: int = 100_000) -> list[MemberRecord]:
        rows = tx.all(
            "SELECT member, value FROM history_member WHERE room = ? AND present = 1 LIMIT ?",
            (room.rid, limit),
        )
        return sorted(
            (self._open_member(room, bytes(m), v) for m, v in rows), key=lambda r: r.user_id
        )

    def name_holders(self, tx: Tx, room: Room, display_name: str) -> int:
        """How many present members use ``display_name`` (inside a write; cached like
        :meth:`members`)."""
        cache = self.member_cache
        held = cache.holders(room.rid, display_name)
        if held is not None:
            return held
        generation = cache.generation(room.rid)
        row = tx.one(
            "SELECT COUNT(*) FROM history_member WHERE room = ? AND name = ? AND present = 1",
            (room.rid, self._name_key(display_name)),
        )
        count = 0 if row is None else int(row[0])
        tx.after_commit(partial(cache.install, room.rid, generation, None, {display_name: count}))
        return count

    def _name_key(self, display_name: str) -> bytes:
        return self._store.cipher.lookup_key("member-name:" + display_name)

    def _open_member(self, room: Room, member: bytes, value: Any) -> MemberRecord:
        data = json.loads(self._store.cipher.decrypt(bytes(value), room.key + b"mem" + member))
        return MemberRecord(data["user_id"], data.get("display_name"), data["membership"])

    def _put_member(self, tx: Tx, room: Room, record: MemberRecord) -> None:
        member = self._store.cipher.lookup_key("member:" + record.user_id)
        value = json.dumps(record._asdict()).encode()
        tx.execute(
            "INSERT INTO history_member (room, member, name, present, value) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (room, member) DO UPDATE SET name = excluded.name,"
            " present = excluded.present, value = excluded.value",
            (
                room.rid,
                member,
                None if record.display_name is None else self._name_key(record.display_name),
                int(record.membership in PRESENT),
                self._store.cipher.encrypt(value, room.key + b"mem" + member),
            ),
        )

    # -- detached events ------------------------------------------------------------------

    def detached(
        self,
        tx: Tx,
        room: Room,
        event_ids: Iterable[str],
        known: dict[str, bytes] | None = None,
    ) -> dict[str, ClientEvent | None]:
        """Events fetched on their own, by id; ``None``: the server would not return it."""
        by_key = self._hashes(event_ids, known)
        out: dict[str, ClientEvent | None] = {}
        for event, body in self._in(
            tx,
            "SELECT event, body FROM history_detached WHERE room = ? AND event IN ({marks})",
            room,
            list(by_key),
        ):
            key = bytes(event)
            out[by_key[key]] = (
                None if body is None else self._store.open_body(room.key + b"det" + key, body)[0]
            )
        return out

    # -- the writer -----------------------------------------------------------------------

    def write(
        self,
        tx: Tx,
        room: Room,
        update: Update,
        event_key: Callable[[str], bytes] | None = None,
    ) -> None:
        """Apply one update; ``event_key`` may supply hashes the caller computed."""
        event_key = event_key or self._store.event_key
        match update:
            case AggregateChanged(entries=entries):
                self._put_aggregates(tx, room, entries, event_key)
            case RelationIndexed(entries=entries):
                events = [event_key(e) for e, _, _ in entries]
                self.relation_keys.add(room.rid, events)  # before COMMIT
                targets = [event_key(t) for _, t, _ in entries]
                sealed = self._store.cipher.encrypt_many(
                    [
                        (target.encode(), room.key + b"rel" + e)
                        for e, (_, target, _) in zip(events, entries, strict=True)
                    ]
                )
                tx.executemany(
                    "INSERT INTO history_relation (room, event, target, target_id, kind)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room, event) DO NOTHING",
                    [
                        (room.rid, e, t, s, kind)
                        for e, t, s, (_, _, kind) in zip(
                            events, targets, sealed, entries, strict=True
                        )
                    ],
                )
            case MembersUpdated(members=members):
                for record in members:
                    self._put_member(tx, room, record)
                tx.after_commit(partial(self.member_cache.invalidate, room.rid))
            case DetachedStored(event_id=event_id, event=event):
                key = event_key(event_id)
                body = (
                    None
                    if event is None
                    else self._store.seal_body(room.key + b"det" + key, event, None)
                )
                tx.execute(
                    "INSERT INTO history_detached (room, event, body) VALUES (?, ?, ?)"
                    " ON CONFLICT (room, event) DO UPDATE SET body = excluded.body",
                    (room.rid, key, body),
                )
