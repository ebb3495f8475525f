"""The account-route DHT as this relay sees it today: its own replica, in its own database.

``LocalRouteDht`` implements the protocol library's ``RouteDht`` (PUT a record, GET the
values under a key) over the relay's store, so ``account.route.publish`` and
``account.route.resolve`` already go through the one seam federation will fill: until
relays peer over the DHT, this relay (or every relay process on one PostgreSQL database)
is the whole keyspace. ``put`` is what a storage node does with ``PUT_VALUE``: the record's
key re-derived from its account, the route fully verified (its relay key from
``relay_key``, which knows only this relay until the Registry is reachable), refused below
the persisted highest revision, then stored with its version information in one commit.
``get`` returns the unexpired values held under a key; every one passed ``put``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gapline.meshline import (
    AccountRoute,
    InvalidSignature,
    NetworkContext,
    RouteHistory,
    StaleState,
    route_from_record,
    verify_route,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._base import CAS_ATTEMPTS
from gapline.relay._store import HistoryRow, RecordRow, Routes

__all__ = ["LocalRouteDht", "history_of"]


def history_of(row: HistoryRow | None) -> RouteHistory:
    if row is None:
        return RouteHistory()
    return RouteHistory(row.revision, row.digest or None, row.conflict)


def _row_of(history: RouteHistory) -> HistoryRow:
    return HistoryRow(history.revision, history.digest or "", history.conflict)


class LocalRouteDht:
    """``RouteDht`` over this relay's route store (see the module docstring)."""

    def __init__(
        self,
        routes: Routes,
        context: NetworkContext,
        *,
        clock: Callable[[], int],
        max_skew: int,
        relay_key: Callable[[str], bytes | None],
    ) -> None:
        self.routes = routes
        self.context = context
        self.clock = clock
        self.max_skew = max_skew
        self.relay_key = relay_key
        # Called with the key after every commit that changed what is stored under it.
        self.on_commit: Callable[[bytes], None] | None = None

    async def history(self, key: bytes) -> tuple[RouteHistory, HistoryRow | None]:
        """The persisted version information of ``key``, and the row it came from."""
        row = await self.routes.history(key.hex())
        return history_of(row), row

    async def commit(
        self,
        key: bytes,
        *,
        expected: HistoryRow | None,
        history: RouteHistory,
        route: AccountRoute | None = None,
    ) -> bool:
        """Persist ``history`` (and ``route``) if the version information is still
        ``expected``; False when another commit came first."""
        record = None
        if route is not None:
            record = RecordRow(
                route.revision,
                route.content_digest(self.context),
                route.to_json().decode(),
                route.expires_at,
            )
        done = await self.routes.commit(
            key.hex(), expected=expected, new=_row_of(history), record=record
        )
        if done and self.on_commit is not None:
            self.on_commit(key)
        return done

    async def put(self, key: bytes, value: bytes) -> None:
        """Accept a final route record into this replica, or raise the reason it is refused."""
        route = route_from_record(key, value, self.context)
        public_key = self.relay_key(route.relay_id)
        if public_key is None:
            raise InvalidSignature("the route's relay is not one whose key this relay knows")
        verify_route(
            route,
            self.context,
            relay_public_key=public_key,
            now=self.clock(),
            max_skew=self.max_skew,
        )
        for _ in range(CAS_ATTEMPTS):
            history, row = await self.history(key)
            if route.revision < history.revision:
                raise StaleState("a higher route revision is known for this account")
            new = history.observe(route, self.context)
            if new == history and value.decode() in await self.routes.values(
                key.hex(), self.clock()
            ):
                return  # already held: a republication or a lookup that found it again
            if await self.commit(key, expected=row, history=new, route=route):
                return
        raise RelayFailure("state_conflict", "concurrent route writes; try again")

    async def get(self, key: bytes) -> Sequence[bytes]:
        return [v.encode() for v in await self.routes.values(key.hex(), self.clock())]
