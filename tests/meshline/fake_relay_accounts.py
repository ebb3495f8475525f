"""The in-test relay, extended with profiles, account routes and contact authorization.

Built from the library's pure checks, as a relay would use them. Relays of one
test share a ``FakeNetwork``: the route DHT (records by key), the device states
and profiles (in the spec each lives on its home relay, reached by relay RPC; the
fakes read them directly), and which relay is whose home, so a message sent on
one relay lands in the timeline of the recipient's home relay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline import (
    SIGNED_QUERY_FIELDS,
    AccountDeviceState,
    AccountProfile,
    AccountRoute,
    CurrentDevices,
    DeviceCertificate,
    RelayError,
    RouteHistory,
    SendParams,
    SignedStateQuery,
    accept_route_publication,
    authorize_delivery,
    authorize_state_query,
    check_profile_publish,
    public_access,
    resolve_records,
    route_dht_key,
    route_record,
    sign_relay_descriptor,
    verify_envelope,
    verify_state_query,
)
from tests.meshline.fake_relay import FakeRelay

SKEW = 300


@dataclass
class FakeNetwork:
    records: dict[bytes, list[bytes]] = field(default_factory=dict)
    states: dict[str, AccountDeviceState] = field(default_factory=dict)
    profiles: dict[str, tuple[AccountProfile, DeviceCertificate]] = field(default_factory=dict)
    homes: dict[str, AccountsRelay] = field(default_factory=dict)
    relays: dict[str, AccountsRelay] = field(default_factory=dict)

    def put(self, key: bytes, value: bytes) -> None:
        values = self.records.setdefault(key, [])
        if value not in values:
            values.append(value)

    def relay_key(self, relay_id: str) -> bytes | None:
        relay = self.relays.get(relay_id)
        return None if relay is None else relay.key.public_key


@dataclass
class AccountsRelay(FakeRelay):
    network: FakeNetwork = field(default_factory=FakeNetwork)
    histories: dict[str, RouteHistory] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.states = self.network.states
        self.network.relays[self.relay_id] = self
        self._extra: dict[str, Callable[[dict[str, Any], str | None], Any]] = {
            "relay.descriptor": self._descriptor,
            "account.route.publish": self._route_publish,
            "account.route.resolve": self._route_resolve,
            "profile.publish": self._profile_publish,
            "profile.resolve": self._profile_resolve,
            "device.state.resolve": self._state_resolve,
        }

    def _method(self, method: str, params: dict[str, Any], token: str | None, origin: str) -> Any:
        if method == "message.send":
            return self._send(params, token, origin)
        handler = self._extra.get(method)
        if handler is None:
            return super()._method(method, params, token, origin)
        self.calls.append(method)
        return handler(params, token)

    def _now(self) -> int:
        return int(time.time()) + self.clock_offset

    def _device(self, token: str | None) -> tuple[str, str]:
        if token not in self.sessions:
            raise RelayError("unauthorized", "no device session")
        return self.sessions[token]

    def _descriptor(self, params: dict[str, Any], token: str | None) -> Any:
        descriptor = sign_relay_descriptor(
            self.key, self.context, endpoints=[self.base, self.ws_url], expires_at=self._now() + 600
        )
        return descriptor.to_wire()

    def _route_publish(self, params: dict[str, Any], token: str | None) -> Any:
        account = self.account_sessions.get(token or "")
        if account is None:
            raise RelayError("unauthorized", "account.route.publish needs an account session")
        done = accept_route_publication(
            AccountRoute.from_wire(params),
            session_account=account,
            relay_key=self.key,
            history=self.histories.get(account, RouteHistory()),
            device_state=self.states.get(account),
            context=self.context,
            now=self._now(),
            max_skew=SKEW,
        )
        self.histories[account] = done.history
        self.network.put(*route_record(done.route, self.context))
        self.network.homes[account] = self
        return done.route.to_wire()

    def _route_resolve(self, params: dict[str, Any], token: str | None) -> Any:
        account = params["account"]
        key = route_dht_key(account, self.context)
        resolution = resolve_records(
            self.network.records.get(key, []),
            key=key,
            history=self.histories.get(account, RouteHistory()),
            relay_key=self.network.relay_key,
            context=self.context,
            now=self._now(),
            max_skew=SKEW,
        )
        self.histories[account] = resolution.history
        return resolution.result().to_wire()

    def _profile_publish(self, params: dict[str, Any], token: str | None) -> Any:
        account, device_id = self._device(token)
        profile = AccountProfile.from_wire(params)
        current = self.network.profiles.get(account)
        signer = self.certificates[device_id]
        check_profile_publish(
            profile,
            account=account,
            signer=signer,
            context=self.context,
            now=self._now(),
            max_skew=SKEW,
            current_updated_at=None if current is None else current[0].updated_at,
        )
        self.network.profiles[account] = (profile, signer)
        return None

    def _profile_resolve(self, params: dict[str, Any], token: str | None) -> Any:
        self._device(token)
        found = self.network.profiles.get(params["account"])
        if found is None:
            raise RelayError("not_found", "no profile")
        return {"profile": found[0].to_wire(), "signer_certificate": found[1].to_wire()}

    def _state_resolve(self, params: dict[str, Any], token: str | None) -> Any:
        if token in self.account_sessions:
            account = self.account_sessions[token or ""]
            if params.get("account") != account or SIGNED_QUERY_FIELDS & params.keys():
                raise RelayError("forbidden", "an account session reads only its own state")
            return self._state_of(account).to_wire()
        caller = self._device(token)
        if SIGNED_QUERY_FIELDS & params.keys():
            query = SignedStateQuery.from_wire(params)
            verify_state_query(
                query,
                context=self.context,
                now=self._now(),
                max_skew=SKEW,
                max_age=SKEW,
                caller=caller,
            )
            state = self._state_of(query.account)
            authorize_state_query(
                query,
                target_devices=CurrentDevices.trusted(state, self.context),
                now=self._now(),
                context=self.context,
            ).check()
            return state.to_wire()
        account = params["account"]
        if account != caller[0]:
            found = self.network.profiles.get(account)
            public_access(None if found is None else found[0]).check()
        return self._state_of(account).to_wire()

    def _state_of(self, account: str) -> AccountDeviceState:
        state = self.states.get(account)
        if state is None:
            raise RelayError("not_found", "no device state")
        return state

    def _send(self, params: dict[str, Any], token: str | None, origin: str) -> Any:
        """Receiving rule 4 first (authorization), then the base fake's acceptance; a
        recipient homed on another relay gets the record there."""
        account, device_id = self._device(token)
        send = SendParams.from_wire(params)
        to = send.envelope.to
        if to != account:
            found = self.network.profiles.get(to)
            authorize_delivery(
                send.authorization,
                sender=account,
                recipient=to,
                recipient_devices=CurrentDevices.trusted(self._state_of(to), self.context),
                recipient_profile=None if found is None else found[0],
                now=self._now(),
                context=self.context,
            ).check()
        home = self.network.homes.get(to, self)
        if home is self:
            return super()._method("message.send", params, token, origin)
        self.calls.append("message.send")
        cert = self.certificates[device_id]
        if send.envelope.from_device_id != device_id:
            raise RelayError("forbidden", "envelope is not from the session's device")
        verify_envelope(send.envelope, cert.signing_key_bytes, self.context)
        home.append(SendParams(send.envelope, send.recipient_boxes), cert)
        return {"status": "target_accepted", "accepted_at": self._now()}
