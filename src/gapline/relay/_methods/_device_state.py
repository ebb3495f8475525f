"""``device.state.publish`` and ``device.state.resolve`` (own reads, public queries, signed
queries carrying a ``ContactGrant`` or ``ContactInvite``).

This relay is the home relay of every account that publishes its state to it, so
publication is authoritative, never staged. A query for an account it holds no state
for is forwarded to the account's home relay when federated (``RelayCore.forwarder``,
which believes only an answer that verifies), else ``not_found`` whatever its form.
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

__all__ = ["DeviceStateMethods", "check_signed_query"]


def check_signed_query(
    core: RelayCore, query: SignedStateQuery, now: int, *, caller: tuple[str, str] | None
) -> None:
    """A signed query's own checks; freshness: ``created_at`` within the relay's clock
    tolerance either way. ``caller`` is the session's (account, device) where one exists."""
    verify_state_query(
        query,
        context=core.context,
        now=now,
        max_skew=core.config.clock_skew,
        max_age=core.config.clock_skew,
        caller=caller,
    )


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
        access = await self.access.of(account)
        if access is None and self.core.forwarder is not None:
            return await self.core.forwarder.device_state(account, {"account": account})
        access = _found(access)
        public_access(access.profile).check()
        return stored(access.state)

    async def _signed_query(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        if session.mode != "device":
            raise RelayFailure("forbidden", "signed queries need a device session")
        query = SignedStateQuery.from_wire(params)
        now = core.now()
        check_signed_query(core, query, now, caller=(session.account, session.device_id or ""))
        access = await self.access.of(query.account)
        if access is None and core.forwarder is not None:
            # Checked here for the calling device; sent on unchanged, checked there again.
            return await core.forwarder.device_state(query.account, params)
        access = _found(access)
        authorize_state_query(
            query, target_devices=access.devices, now=now, context=core.context
        ).check()
        return stored(access.state)
