"""``account.route.publish`` and ``account.route.resolve``: which relay is an account's home.

Publication (account session): the protocol library checks the draft against the
persisted version information and the account's device state and co-signs it
(``accept_route_publication``); the final route and the new version information are
committed together, only if the version information is still what the checks saw, then
the record is PUT to the route DHT (``RouteDht``; today this relay's own replica,
``LocalRouteDht``). Resolution (no session): the values the DHT holds under the account's
key, selected under the persisted version information (``select_route``); when selection
advances it, that is persisted before the route is answered.

The replica's values all passed ``LocalRouteDht.put`` (full verification), so selection
runs over them directly; values collected from other nodes, once federation brings them,
go through ``resolve_records`` instead, which verifies each first.
"""

from __future__ import annotations

from typing import Any

from gapline.meshline import (
    AccountDeviceState,
    AccountRoute,
    RouteDht,
    accept_route_publication,
    route_dht_key,
    route_from_record,
    route_record,
    select_route,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._base import CAS_ATTEMPTS, Call, Method, SessionMode, require
from gapline.relay._methods._core import RelayCore
from gapline.relay._methods._route_dht import LocalRouteDht

__all__ = ["RouteMethods"]

_CACHE_LIMIT = 100_000


class RouteMethods:
    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.replica = LocalRouteDht(
            core.store.routes,
            core.context,
            clock=core.config.clock,
            max_skew=core.config.clock_skew,
            relay_key=self._relay_key,
        )
        # Where records are PUT and read: the seam federation fills.
        self.dht: RouteDht = self.replica
        # Parsed replica values (parsing is pure; the value text decides the route).
        self._parsed: dict[tuple[bytes, bytes], AccountRoute] = {}

    def methods(self) -> list[Method]:
        return [
            Method("account.route.publish", "PUT", SessionMode.ACCOUNT, self.route_publish),
            Method(
                "account.route.resolve",
                "GET",
                SessionMode.NONE,
                self.route_resolve,
                query={"account": "str"},
            ),
        ]

    def _relay_key(self, relay_id: str) -> bytes | None:
        """A relay's verified key: this relay's own (there is no Registry to ask for others)."""
        return self.core.key.public_key if relay_id == self.core.relay_id else None

    async def route_publish(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        session = require(call, SessionMode.ACCOUNT)
        draft = AccountRoute.from_wire(params)  # the 4 KiB limit first
        key = route_dht_key(session.account, core.context)
        for _ in range(CAS_ATTEMPTS):
            history, row = await self.replica.history(key)
            state = await core.store.accounts.resolve_state(session.account)
            publication = accept_route_publication(
                draft,
                session_account=session.account,
                relay_key=core.key,
                history=history,
                device_state=None if state is None else AccountDeviceState.from_json(state),
                context=core.context,
                now=core.now(),
                max_skew=core.config.clock_skew,
            )
            final = publication.route
            if await self.replica.commit(
                key, expected=row, history=publication.history, route=final
            ):
                await self.dht.put(*route_record(final, core.context))
                return final.to_wire()
        raise RelayFailure("state_conflict", "concurrent route publications; try again")

    async def route_resolve(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        account = core.account(params.get("account"))
        key = route_dht_key(account, core.context)
        for _ in range(CAS_ATTEMPTS):
            values = await self.dht.get(key)
            history, row = await self.replica.history(key)
            resolution = select_route(
                [self._parse(key, v) for v in values], history, context=core.context, now=core.now()
            )
            if resolution.history == history or await self.replica.commit(
                key, expected=row, history=resolution.history
            ):
                return resolution.result().to_wire()
        raise RelayFailure("state_conflict", "concurrent route writes; try again")

    def _parse(self, key: bytes, value: bytes) -> AccountRoute:
        route = self._parsed.get((key, value))
        if route is None:
            route = route_from_record(key, value, self.core.context)
            if len(self._parsed) > _CACHE_LIMIT:
                self._parsed.clear()
            self._parsed[(key, value)] = route
        return route
