"""The relay RPC account queries, as target and as forwarding source.

Target (``device.status``, ``device.state.resolve``, ``profile.resolve``): answered only
for an account this relay is home for (a current route naming another relay is
``route_stale``; no state here is ``target_not_local``), from its own current state. A
relay's call carries no client session: an account-only ``device.state.resolve`` is a
public query (the profile must allow public discovery, else ``forbidden``); a signed one
is verified here again (certificate, signature, freshness, authorization), with no
device-session check of the requester; ``profile.resolve`` checks no contact rules.

Source (``Forwarder``): a client's read of an account homed on another relay goes there
unchanged (signed queries are never rebuilt), after the client-side checks of its own
session; the answer is believed only once it verifies (the profile's and certificate's
signatures and account, the device state's signatures and account). Anything else is
``bad_gateway``: a peer's bad answer never reaches the client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from gapline.meshline import (
    SIGNED_QUERY_FIELDS,
    AccountDeviceState,
    MeshlineError,
    ResolvedProfile,
    SignedStateQuery,
    authorize_state_query,
    check_account_id,
    check_device_id,
    public_access,
    verify_device_state,
    verify_resolved_profile,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods import Relay
from gapline.relay._methods._access import Access
from gapline.relay._methods._base import stored
from gapline.relay._methods._device_state import check_signed_query
from gapline.relay._p2p._frames import FramingError
from gapline.relay._p2p._host import DIAL_FAILURES, VerifiedPeer
from gapline.relay._peer_rpc import PeerCallError, call_peer

__all__ = ["AccountQueries", "Forwarder"]

_ROUTE_ERRORS = {"route_stale", "target_not_local", "route_not_found", "invalid_state"}
CALL_TIMEOUT = 10.0


QUERIER_WINDOW = 600  # seconds a device.status query earns its asker change hints


class AccountQueries:
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        # (account, device_id) -> {relay_id: when it last asked}: who gets
        # device.status.changed when the account's state changes here.
        self._askers: dict[tuple[str, str], dict[str, int]] = {}
        self.hints: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=4096)

    def state_changed(self, account: str) -> None:
        """This relay accepted new state for ``account``: queue a hint for each recent asker."""
        now = self.relay.now()
        for (asked_account, device_id), askers in list(self._askers.items()):
            if asked_account != account:
                continue
            for relay_id, when in list(askers.items()):
                if now - when > QUERIER_WINDOW:
                    del askers[relay_id]
                    continue
                hint = {"account": account, "device_id": device_id}
                with contextlib.suppress(asyncio.QueueFull):  # a hint, not a promise
                    self.hints.put_nowait((relay_id, hint))

    async def _home(self, account: str) -> Access:
        route = await self.relay.routes.current_route(account, remote=False)
        if route is not None and route.relay_id != self.relay.relay_id:
            raise RelayFailure("route_stale", "the account's current route names another relay")
        access = await self.relay.access.of(account)
        if access is None:
            raise RelayFailure("target_not_local", "this relay holds no state for the account")
        return access

    async def device_status(self, peer: VerifiedPeer, params: dict[str, Any]) -> dict[str, Any]:
        """From this relay's own current device state only; never a cached answer."""
        account = check_account_id(params.get("account"), self.relay.context)
        device_id = check_device_id(params.get("device_id"))
        access = await self._home(account)
        if len(self._askers) > 100_000:
            self._askers.clear()
        self._askers.setdefault((account, device_id), {})[peer.relay_id] = self.relay.now()
        cert = access.devices.valid(device_id, self.relay.now())
        if cert is None:
            return {"status": "inactive"}
        return {"status": "active", "expires_at": cert.expires_at}

    async def device_state_resolve(
        self, peer: VerifiedPeer, params: dict[str, Any]
    ) -> dict[str, Any]:
        core = self.relay
        if SIGNED_QUERY_FIELDS & params.keys():
            query = SignedStateQuery.from_wire(params)
            now = core.now()
            check_signed_query(core, query, now, caller=None)  # no session to bind here
            access = await self._home(query.account)
            authorize_state_query(
                query, target_devices=access.devices, now=now, context=core.context
            ).check()
            return stored(access.state)
        account = check_account_id(params.get("account"), core.context)
        access = await self._home(account)
        public_access(access.profile).check()  # never the self-read of a client session
        return stored(access.state)

    async def profile_resolve(self, peer: VerifiedPeer, params: dict[str, Any]) -> dict[str, Any]:
        core = self.relay
        account = check_account_id(params.get("account"), core.context)
        await self._home(account)
        found = await core.store.profiles.current(account)
        if found is None:
            raise RelayFailure("not_found", "no profile for this account")
        return {
            "profile": stored(found.canonical),
            "signer_certificate": stored(found.signer_certificate),
        }


class Forwarder:
    """Client reads of accounts homed elsewhere, sent to their home relay and verified."""

    def __init__(
        self,
        relay: Relay,
        route_of: Any,
        connect: Callable[[str], Any],
        on_refused: Callable[[str], None],
    ) -> None:
        self.relay = relay
        self._route_of = route_of  # (account, refresh=) -> AccountRoute | None
        self._connect = connect  # relay_id -> Connection
        self._refused = on_refused

    async def _call(self, account: str, method: str, params: dict[str, Any]) -> Any:
        for attempt in range(2):
            route = await self._route_of(account, refresh=attempt > 0)
            if route is None:
                raise RelayFailure("target_not_local", "no home relay is known for the account")
            if route.relay_id == self.relay.relay_id:
                raise RelayFailure("not_found", "this relay holds nothing for the account")
            try:
                conn = await self._connect(route.relay_id)
                async with asyncio.timeout(CALL_TIMEOUT):
                    return await call_peer(conn, method, params)
            except PeerCallError as exc:
                if exc.code in _ROUTE_ERRORS and attempt == 0:
                    continue  # the route changed: look it up again, once
                if exc.code is None:
                    raise RelayFailure(
                        "bad_gateway", "the home relay answered an unknown error"
                    ) from None
                raise RelayFailure(
                    exc.code, exc.message, exc.data if isinstance(exc.data, dict) else None
                ) from None
            except (*DIAL_FAILURES, FramingError, LookupError) as exc:
                raise RelayFailure(
                    "temporarily_unavailable", f"the home relay is unreachable: {exc}"
                ) from None
            except MeshlineError as exc:  # an answer that is not JSON-RPC
                raise RelayFailure("bad_gateway", f"the home relay's answer: {exc}") from None
        raise RelayFailure("target_not_local", "the account's home relay could not be confirmed")

    def _refuse(self, method: str, exc: Exception) -> RelayFailure:
        self._refused(method)
        return RelayFailure("bad_gateway", f"the home relay's answer did not verify: {exc}")

    async def profile(self, account: str) -> dict[str, Any]:
        result = await self._call(account, "profile.resolve", {"account": account})
        try:
            verify_resolved_profile(
                ResolvedProfile.from_wire(result), account=account, context=self.relay.context
            )
        except MeshlineError as exc:
            raise self._refuse("profile.resolve", exc) from None
        return result

    async def device_state(self, account: str, params: dict[str, Any]) -> dict[str, Any]:
        result = await self._call(account, "device.state.resolve", params)
        try:
            state = AccountDeviceState.from_wire(result)
            verify_device_state(state, self.relay.context)
            if state.account != account:
                raise RelayFailure("bad_gateway", "another account's state")
        except (MeshlineError, RelayFailure) as exc:
            raise self._refuse("device.state.resolve", exc) from None
        return result
