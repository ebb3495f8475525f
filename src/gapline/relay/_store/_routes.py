"""Account routes: this relay's replica of the route DHT keyspace, and the route-version
information it keeps per key forever.

Keys are the DHT keys (hex): they derive from the network context and the account, so
version information of one network never mixes with another's. ``commit`` changes the
version information only if it is still what the caller's checks saw (compare-and-set),
and in the same transaction stores a value and drops the key's values below the new
highest revision (they can never be current again). What is checked, and how versions
advance, is the protocol library's (``RouteHistory``, ``select_route``); this module only
keeps the result, atomically, for every relay process on the database.

Every commit that changes a key also sends the key (hex) on ``ROUTE_CHANNEL`` in its own
transaction: delivered at COMMIT, dropped with a rollback, so a process that keeps route
answers in memory hears of every change another process made (``_route_feed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gapline.storage import Backend, Tx

__all__ = ["ROUTE_CHANNEL", "HistoryRow", "RecordRow", "Routes", "expire"]

ROUTE_CHANNEL = "meshline_routes"

# At most this many values are read per key: values below the highest revision are dropped
# on every commit, so a key holds only copies at one revision (two once contents conflict).
MAX_VALUES = 16


@dataclass(frozen=True, slots=True)
class HistoryRow:
    revision: int
    digest: str  # '' when no content is current at ``revision`` (conflict)
    conflict: bool


@dataclass(frozen=True, slots=True)
class RecordRow:
    revision: int
    digest: str
    value: str  # the final route's UTF-8 JSON, as it was put
    expires_at: int


def expire(tx: Tx, now: int, limit: int) -> int:
    """Delete up to ``limit`` route values past their ``expires_at``; how many went."""
    deleted = tx.execute(
        "DELETE FROM route_records WHERE (dht_key, revision, digest) IN ("
        "SELECT dht_key, revision, digest FROM route_records WHERE expires_at <= ? LIMIT ?)",
        (now, limit),
    )
    return max(deleted, 0)


class Routes:
    """Route values and version information. Each method is one backend operation."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def history(self, key: str) -> HistoryRow | None:
        def op(tx: Tx) -> HistoryRow | None:
            row = tx.one(
                "SELECT revision, digest, conflict FROM route_history WHERE dht_key = ?", (key,)
            )
            return None if row is None else HistoryRow(int(row[0]), str(row[1]), bool(row[2]))

        return await self.backend.read(op)

    async def held(self, now: int, after: str, limit: int) -> list[tuple[str, str]]:
        """(key, value) of unexpired records with keys after ``after``, in key order: the
        republication scan pages through the replica with it."""

        def op(tx: Tx) -> list[tuple[str, str]]:
            rows = tx.all(
                "SELECT dht_key, value FROM route_records WHERE dht_key > ? AND expires_at > ?"
                " ORDER BY dht_key LIMIT ?",
                (after, now, limit),
            )
            return [(str(k), str(v)) for k, v in rows]

        return await self.backend.read(op)

    async def values(self, key: str, now: int) -> list[str]:
        """The unexpired values stored under ``key`` (covered by the primary key)."""

        def op(tx: Tx) -> list[str]:
            rows = tx.all(
                "SELECT value FROM route_records WHERE dht_key = ? AND expires_at > ? LIMIT ?",
                (key, now, MAX_VALUES),
            )
            return [str(r[0]) for r in rows]

        return await self.backend.read(op)

    async def commit(
        self,
        key: str,
        *,
        expected: HistoryRow | None,
        new: HistoryRow,
        record: RecordRow | None = None,
    ) -> bool:
        """Set the version information to ``new`` if it is still ``expected`` (None: there was
        none), storing ``record`` with it. False when it changed meanwhile: decide again."""

        def op(tx: Tx) -> bool:
            if expected is None:
                row = tx.one(
                    "INSERT INTO route_history (dht_key, revision, digest, conflict)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (dht_key) DO NOTHING RETURNING dht_key",
                    (key, new.revision, new.digest, int(new.conflict)),
                )
            else:
                # Also when nothing changes: the update takes the row lock, so a concurrent
                # commit (any process) waits, then finds the row changed and fails.
                row = tx.one(
                    "UPDATE route_history SET revision = ?, digest = ?, conflict = ?"
                    " WHERE dht_key = ? AND revision = ? AND digest = ? AND conflict = ?"
                    " RETURNING dht_key",
                    (
                        new.revision,
                        new.digest,
                        int(new.conflict),
                        key,
                        expected.revision,
                        expected.digest,
                        int(expected.conflict),
                    ),
                )
            if row is None:
                return False
            if record is not None:
                tx.execute(
                    "INSERT INTO route_records (dht_key, revision, digest, value, expires_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (dht_key, revision, digest) DO NOTHING",
                    (key, record.revision, record.digest, record.value, record.expires_at),
                )
            tx.execute(
                "DELETE FROM route_records WHERE dht_key = ? AND revision < ?", (key, new.revision)
            )
            tx.notify(ROUTE_CHANNEL, key)
            return True

        return await self.backend.write(op)
