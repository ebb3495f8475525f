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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gapline.meshline import (
    MAX_SAFE_INTEGER,
    AccountDeviceState,
    AccountRoute,
    MeshlineError,
    RouteDht,
    RouteResolution,
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


@dataclass(frozen=True, slots=True)
class _Answer:
    """What ``account.route.resolve`` answers for a key, and until when."""

    wire: dict[str, Any] | None
    error: tuple[str, str] | None  # (code, message)
    valid_until: int

    @classmethod
    def of(cls, resolution: RouteResolution) -> _Answer:
        try:
            route = resolution.result()
        except MeshlineError as exc:  # not_found, invalid_state: until the key changes
            return cls(None, (exc.code, exc.message), MAX_SAFE_INTEGER)
        return cls(route.to_wire(), None, route.expires_at)

    def result(self) -> dict[str, Any]:
        if self.error is not None:
            raise RelayFailure(*self.error)
        assert self.wire is not None
        return self.wire


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
        # Resolution answers, kept while every change to a key reaches ``invalidate``: this
        # process's own commits through LocalRouteDht.on_commit, and where other processes
        # share the database (PostgreSQL) theirs through the route feed, which keeps the
        # cache suspended whenever it may have missed one (``_route_feed``). An answer holds
        # until then or until its route expires. ``_changes`` counts the invalidations, so
        # a lookup that raced one (or a suspension) is not kept.
        self._cache = core.store.single_writer
        self._answers: dict[bytes, _Answer] = {}
        self._local: dict[bytes, tuple[AccountRoute | None, int]] = {}
        self._changes = 0
        self._keys: dict[str, bytes] = {}  # DHT key by (valid) account ID
        self.replica.on_commit = self.invalidate
        # Federation: the key of another active relay (from the Registry), and callbacks
        # told of every key whose stored values changed.
        self.peer_key: Callable[[str], bytes | None] | None = None
        self.on_changed: list[Callable[[bytes], None]] = []
        self.on_suspended: list[Callable[[], None]] = []
        # With federation, "no route here" may be found on other nodes: not cached.
        self.cache_missing = True
        self._keys: dict[str, bytes] = {}  # account -> its route's DHT key

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
        """A relay's verified key: this relay's own, or an active Registry relay's."""
        if relay_id == self.core.relay_id:
            return self.core.key.public_key
        return None if self.peer_key is None else self.peer_key(relay_id)

    async def current_route(self, account: str, *, remote: bool) -> AccountRoute | None:
        """The account's current route (None: none known), from this replica alone or after a
        network lookup (``remote``: the values other nodes hold are verified into the replica
        first). ``invalid_state`` on an unresolved conflict. No answer cache is consulted.
        """
        core = self.core
        key = self._keys.get(account)
        if key is None:  # canonical JSON and a hash: computed once per account
            key = route_dht_key(account, core.context)
            if len(self._keys) > _CACHE_LIMIT:
                self._keys.clear()
            self._keys[account] = key
        if remote:
            await self.dht.get(key)
        else:
            known = self._local.get(key)
            if known is not None and core.now() < known[1]:
                return known[0]
        for _ in range(CAS_ATTEMPTS):
            changes = self._changes
            history, row = await self.replica.history(key)
            values = await self.replica.get(key)
            resolution = select_route(
                [self._parse(key, v) for v in values], history, context=core.context, now=core.now()
            )
            if resolution.history == history or await self.replica.commit(
                key, expected=row, history=resolution.history
            ):
                try:
                    route: AccountRoute | None = resolution.result()
                except MeshlineError as exc:
                    if exc.code != "not_found":
                        raise RelayFailure(exc.code, exc.message) from None
                    route = None
                if self._cache and self._changes == changes:
                    # Every change to the replica reaches ``invalidate`` while the cache is
                    # trusted: the answer holds until one changes the key or it expires.
                    if len(self._local) > _CACHE_LIMIT:
                        self._local.clear()
                    until = MAX_SAFE_INTEGER if route is None else route.expires_at
                    self._local[key] = (route, until)
                return route
        raise RelayFailure("state_conflict", "concurrent route writes; try again")

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
        name = params.get("account")
        key = self._keys.get(name) if isinstance(name, str) else None
        if key is None:
            account = core.account(name)
            key = route_dht_key(account, core.context)
            if len(self._keys) > _CACHE_LIMIT:
                self._keys.clear()
            self._keys[account] = key
        now = core.now()
        answer = self._answers.get(key)
        if answer is not None and now < answer.valid_until:
            return answer.result()
        for _ in range(CAS_ATTEMPTS):
            changes = self._changes
            # The version information first: values committed after it was read show up
            # as an advance, which the compare-and-set below refuses, and the lookup runs
            # again; the other order could pair old values with newer information.
            history, row = await self.replica.history(key)
            values = await self.dht.get(key)
            resolution = select_route(
                [self._parse(key, v) for v in values], history, context=core.context, now=now
            )
            if resolution.history == history:
                answer = _Answer.of(resolution)
                keep = answer.error is None or self.cache_missing
                if self._cache and keep and self._changes == changes:
                    self._remember(key, answer)
                return answer.result()
            if await self.replica.commit(key, expected=row, history=resolution.history):
                return resolution.result().to_wire()
        raise RelayFailure("state_conflict", "concurrent route writes; try again")

    def _remember(self, key: bytes, answer: _Answer) -> None:
        if len(self._answers) > _CACHE_LIMIT:
            self._answers.clear()
        self._answers[key] = answer

    @property
    def cache_trusted(self) -> bool:
        """Whether answers derived from the replica may be kept in memory now."""
        return self._cache

    @property
    def generation(self) -> int:
        """Bumped by every invalidation: a lookup begun before a change is not kept."""
        return self._changes

    def invalidate(self, key: bytes) -> None:
        """A commit changed what is stored under ``key``: its answer is decided again."""
        self._answers.pop(key, None)
        self._local.pop(key, None)
        self._changes += 1
        for callback in self.on_changed:
            callback(key)

    def suspend_cache(self) -> None:
        """Changes may go unheard from now on: drop every answer and keep none."""
        self._cache = False
        self._drop_all()

    def resume_cache(self) -> None:
        """Every change is heard again from now on (the feed's LISTEN was acknowledged)."""
        self._drop_all()  # also stops lookups begun before this point from being kept
        self._cache = True

    def _drop_all(self) -> None:
        self._answers.clear()
        self._local.clear()
        self._changes += 1
        for callback in self.on_suspended:
            callback()

    def _parse(self, key: bytes, value: bytes) -> AccountRoute:
        route = self._parsed.get((key, value))
        if route is None:
            route = route_from_record(key, value, self.core.context)
            if len(self._parsed) > _CACHE_LIMIT:
                self._parsed.clear()
            self._parsed[(key, value)] = route
        return route
