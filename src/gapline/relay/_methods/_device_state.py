"""``device.state.publish`` and ``device.state.resolve`` (own reads, public queries, signed
queries carrying a ``ContactGrant`` or ``ContactInvite``).

This relay is the home relay of every account that publishes its state to it (the
standalone deviation in docs/relay.md), so publication is authoritative, never staged,
and every query is answered here, never forwarded. An account it holds no state for is
``not_found`` whatever the query form: it is not this relay's to answer for.
"""

from __future__ import annotations

from typing import Any

from gapline.meshline import (
    SIGNED_QUERY_FIELDS,
    AccountDeviceState,
    SignedStateQuery,
    authorize_state_query,
    public_access,
    verify_device_state,
    verify_state_query,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._access import Access, AccessReader
from gapline.relay._methods._base import Call, Method, SessionMode, require, stored
from gapline.relay._methods._core import RelayCore
from gapline.relay._store import DeviceEntry, NewState, Session

__all__ = ["DeviceStateMethods"]


def _found(access: Access | None) -> Access:
    if access is None:
        raise RelayFailure("not_found", "no device state for this account")
    return access


class DeviceStateMethods:
    def __init__(self, core: RelayCore, access: AccessReader) -> None:
        self.core = core
        self.access = access

    def methods(self) -> list[Method]:
        return [
            Method("device.state.publish", "PUT", SessionMode.ANY, self.device_state_publish),
            Method(
                "device.state.resolve",
                "GET",  # and POST for signed queries (the HTTP transport allows both)
                SessionMode.ANY,
                self.device_state_resolve,
                query={"account": "str", **{f: "str" for f in SIGNED_QUERY_FIELDS}},
            ),
        ]

    async def device_state_publish(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        session = require(call, SessionMode.ANY)
        state = AccountDeviceState.from_wire(params)
        by_id = verify_device_state(state, core.context)
        if state.account != session.account:
            raise RelayFailure("forbidden", "device state must belong to the calling account")
        accepted = NewState(
            account=state.account,
            revision=state.revision,
            canonical=state.to_json().decode(),
            devices=tuple(
                DeviceEntry(did, c.not_before, c.expires_at, c.to_json().decode())
                for did, c in by_id.items()
            ),
        )
        # Authoritative, never "staged" (standalone deviation).
        changed = await core.store.accounts.publish_state(accepted)
        if changed:
            self.access.forget(state.account)
        if changed and core.on_state_accepted is not None:
            await core.on_state_accepted(state.account, state.revision)
        return {"status": "accepted"}

    async def device_state_resolve(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        session = require(call, SessionMode.ANY)
        signed = SIGNED_QUERY_FIELDS & params.keys()
        verb = call.extra.get("http_verb")
        if verb == "GET" and signed:
            raise RelayFailure("bad_request", "GET does not take signed-query fields; use POST")
        if verb == "POST" or signed:
            # Never a fallback to an own-state or public read, whatever is wrong with it.
            return await self._signed_query(session, params)
        account = self.core.account(params.get("account"))
        if account == session.account:
            own = await self.core.store.accounts.resolve_state(account)
            if own is None:
                raise RelayFailure("not_found", "no device state for this account")
            return stored(own)
        if session.mode != "device":
            raise RelayFailure("forbidden", "an account session reads only its own state")
        access = _found(await self.access.of(account))
        public_access(access.profile).check()
        return stored(access.state)

    async def _signed_query(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        if session.mode != "device":
            raise RelayFailure("forbidden", "signed queries need a device session")
        query = SignedStateQuery.from_wire(params)
        now = core.now()
        # Freshness: created_at within the relay's clock tolerance either way.
        verify_state_query(
            query,
            context=core.context,
            now=now,
            max_skew=core.config.clock_skew,
            max_age=core.config.clock_skew,
            caller=(session.account, session.device_id or ""),
        )
        access = _found(await self.access.of(query.account))
        authorize_state_query(
            query, target_devices=access.devices, now=now, context=core.context
        ).check()
        return stored(access.state)
