"""The relay's store: one object over the stores of each kind of record, on one backend.

The server holds a ``TimelineStore`` and reaches each kind of state through it:
``accounts`` (device states, certificates, challenges, sessions), ``sends`` (accepting
``message.send`` and its results), ``timelines`` (heads, records, the sync page),
``profiles`` and ``routes`` (the route DHT replica and its version information).
Retention cleanup spans them all, so it lives here, as does the relay's own key.

The stores know nothing of cryptography: callers pass objects already verified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gapline.relay._store import _accounts, _routes, _sends, _timeline
from gapline.relay._store._accounts import Accounts
from gapline.relay._store._deliveries import Deliveries
from gapline.relay._store._profiles import Profiles
from gapline.relay._store._routes import Routes
from gapline.relay._store._schema import MIGRATIONS, SCHEMA
from gapline.relay._store._sends import Sends
from gapline.relay._store._timeline import Timelines
from gapline.storage import Backend, Dialect, Tx

__all__ = ["CleanupReport", "TimelineStore"]

_CLEANUP_BATCH = 2000  # rows of each kind one cleanup transaction removes at most


@dataclass(frozen=True, slots=True)
class CleanupReport:
    records: int
    visibility_rows: int
    sends: int
    routes: int = 0  # expired route values (their version information is kept)

    @property
    def total(self) -> int:
        return self.records + self.visibility_rows + self.sends + self.routes


def _cleanup_batch(tx: Tx, now: int) -> CleanupReport:
    records, visibility_rows = _timeline.expire(tx, now, _CLEANUP_BATCH)
    sends = _sends.expire(tx, now, _CLEANUP_BATCH)
    routes = _routes.expire(tx, now, _CLEANUP_BATCH)
    _accounts.expire(tx, now)
    return CleanupReport(records, visibility_rows, sends, routes)


class TimelineStore:
    """The relay's durable state. Methods are awaitable; each is one backend operation."""

    def __init__(self, backend: Backend, clock: Callable[[], int]) -> None:
        self.backend = backend
        self.clock = clock
        self.accounts = Accounts(backend)
        self.sends = Sends(backend)
        self.timelines = Timelines(backend)
        self.profiles = Profiles(backend)
        self.routes = Routes(backend)
        self.deliveries = Deliveries(backend)

    @property
    def single_writer(self) -> bool:
        """Whether this process is the only one writing the database (SQLite: one relay
        process per file), so what it caches is changed by its own writes only."""
        return self.backend.dialect is Dialect.SQLITE

    async def migrate(self) -> None:
        await self.backend.migrate(SCHEMA, MIGRATIONS)

    async def meta_get_or_set(self, name: str, value: str) -> str:
        """The stored value of ``name``, storing ``value`` first if there is none (race-safe).

        Relay-wide settings that must survive restarts, such as the relay's own key.
        """

        def op(tx: Tx) -> str:
            tx.execute(
                "INSERT INTO relay_meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                (name, value),
            )
            row = tx.one("SELECT value FROM relay_meta WHERE name = ?", (name,))
            assert row is not None
            return str(row[0])

        return await self.backend.write(op)

    async def cleanup(self, now: int) -> CleanupReport:
        """Remove expired content in bounded batches; never touches ``account_heads``."""
        total = CleanupReport(0, 0, 0)
        while True:
            report = await self.backend.write(lambda tx: _cleanup_batch(tx, now))
            total = CleanupReport(
                total.records + report.records,
                total.visibility_rows + report.visibility_rows,
                total.sends + report.sends,
                total.routes + report.routes,
            )
            if report.total == 0:
                return total
