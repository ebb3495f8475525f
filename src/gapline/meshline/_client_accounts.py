"""The client's calls beside the timeline: account sessions, sending, profiles, routes,
device states, grants and invitations.

``MeshlineClient`` inherits these. Everything a relay answers is verified before it
is returned or remembered: a route's account and relay signatures (the relay's key
from its own descriptor), a profile's certificate and signature, a device state's
signatures and revision against the highest this client verified (an older one is
``stale_state``, another at the same revision ``state_conflict`` or, for routes,
``invalid_state``).

The contact flow follows the route: ``home_relay(account)`` resolves the account's
route and maps its ``relay_id`` through the ``RelayDirectory``; the device-state
query then goes to that relay, under a device session opened there; the message
goes to our own home relay with the grant or invitation as ``authorization``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from gapline.meshline._authorization import (
    AccessVerdict,
    Authorization,
    evaluate_grant,
    evaluate_invite,
    sign_state_query,
)
from gapline.meshline._certificates import AccountDeviceState, CurrentDevices, DeviceCertificate
from gapline.meshline._contacts import ContactGrant, ContactInvite, issue_grant, issue_invite
from gapline.meshline._content import ContentReference
from gapline.meshline._descriptor import RelayDescriptor, verify_relay_descriptor
from gapline.meshline._errors import (
    DeviceUnknown,
    InvalidSignature,
    MeshlineError,
    RelayError,
    StaleState,
    StateConflict,
    TransportError,
)
from gapline.meshline._identity import AccountKey, relay_origin
from gapline.meshline._profile import (
    AccountProfile,
    ResolvedProfile,
    sign_profile,
    verify_resolved_profile,
)
from gapline.meshline._routes import (
    AccountRoute,
    check_cosigned,
    sign_route,
    verify_resolved_route,
)
from gapline.meshline._sealing import BoxTarget, SendParams, seal_message
from gapline.meshline._session import (
    DeviceIdentity,
    RelayDirectory,
    RelayEndpoint,
    SessionCredentials,
    account_session,
    device_session,
)
from gapline.meshline._transport_http import HttpTransport

__all__ = ["DEFAULT_ROUTE_LIFETIME", "AccountCalls"]

#: How long a route this client publishes stays valid unless told otherwise.
DEFAULT_ROUTE_LIFETIME = 90 * 86400


class AccountCalls:
    """Sending, profile, route, device-state and contact calls (mixed into ``MeshlineClient``)."""

    identity: DeviceIdentity
    relay: RelayEndpoint
    directory: RelayDirectory
    max_skew: int
    _clock_offset: int

    def _init_account_calls(self) -> None:
        self._routes: dict[str, AccountRoute] = {}
        self._states: dict[str, AccountDeviceState] = {}
        self._relay_keys: dict[str, tuple[bytes, int]] = {}
        self._http: dict[str, HttpTransport] = {}
        self._peer_sessions: dict[str, SessionCredentials] = {}

    # Provided by MeshlineClient.
    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def now(self) -> int:
        """Unix seconds on the home relay's clock, as far as this client has learnt it."""
        return int(time.time()) + self._clock_offset

    # --- account session and sending ----------------------------------------------------

    async def account_call(
        self, account_key: AccountKey, method: str, params: Mapping[str, Any]
    ) -> Any:
        """One call under a fresh account session on the home relay (over HTTPS)."""
        endpoint = self.relay.https
        transport = HttpTransport(endpoint)
        try:
            session = await account_session(
                transport,
                account_key,
                self.identity.context,
                account=self.identity.account,
                relay_id=self.relay.relay_id,
                origin=relay_origin(endpoint),
            )
            return await transport.call(method, params, session=session.token)
        finally:
            await transport.aclose()

    async def publish_device_state(self, account_key: AccountKey, state: AccountDeviceState) -> Any:
        """``device.state.publish`` under an account session (the bootstrap path: a relay
        cannot authenticate a device before it holds the account's device state)."""
        return await self.account_call(account_key, "device.state.publish", state.to_wire())

    async def send(
        self,
        to: str,
        content: Mapping[str, Any],
        *,
        recipients: Sequence[DeviceCertificate],
        own_devices: Sequence[DeviceCertificate] | None = None,
        authorization: ContactGrant | ContactInvite | None = None,
    ) -> dict[str, Any]:
        """Seal and ``message.send``; returns the ``DeliveryStatus`` object.

        ``own_devices`` (certificates of this account's devices) adds sender
        boxes so they see the sent record; never used for self-delivery.
        ``authorization`` is the recipient's grant to us or its invitation (omit it
        for self-delivery and for a recipient with public discovery).
        """
        ctx = self.identity.context
        params: SendParams = seal_message(
            content,
            device_keys=self.identity.keys,
            from_=self.identity.account,
            from_device_id=self.identity.device_id,
            to=to,
            recipients=[BoxTarget.of(c, ctx) for c in recipients],
            senders=None
            if own_devices is None or to == self.identity.account
            else [BoxTarget.of(c, ctx) for c in own_devices],
            context=ctx,
        )
        wire = params.to_wire()
        if authorization is not None:
            wire["authorization"] = authorization.to_wire()
        status = await self.call("message.send", wire)
        if not isinstance(status, dict):
            raise TransportError("message.send answered without a DeliveryStatus")
        return status

    # --- relays --------------------------------------------------------------------------

    def endpoint_of(self, relay_id: str) -> RelayEndpoint:
        """The pinned endpoint of ``relay_id`` (our home relay, or from the directory)."""
        if relay_id == self.relay.relay_id:
            return self.relay
        endpoint = self.directory.endpoint(relay_id)
        if endpoint is None:
            raise MeshlineError(
                f"no endpoint is configured for relay {relay_id}", code="relay_unknown"
            )
        return endpoint

    def _http_to(self, endpoint: RelayEndpoint) -> HttpTransport:
        transport = self._http.get(endpoint.relay_id)
        if transport is None:
            transport = self._http[endpoint.relay_id] = HttpTransport(endpoint.https)
        return transport

    async def _close_peers(self) -> None:
        transports, self._http, self._peer_sessions = list(self._http.values()), {}, {}
        for transport in transports:
            await transport.aclose()

    async def _relay_call(
        self, endpoint: RelayEndpoint, method: str, params: Mapping[str, Any]
    ) -> Any:
        """A device-session call on ``endpoint``: the main connection for our home relay,
        else an HTTPS session opened there (re-opened once if it lapsed)."""
        if endpoint.relay_id == self.relay.relay_id:
            return await self.call(method, params)
        transport = self._http_to(endpoint)
        for attempt in (0, 1):
            session = self._peer_sessions.get(endpoint.relay_id)
            if session is None:
                session, _ = await device_session(
                    transport,
                    self.identity,
                    relay_id=endpoint.relay_id,
                    origin=relay_origin(endpoint.https),
                    clock_offset=self._clock_offset,
                )
                self._peer_sessions[endpoint.relay_id] = session
            try:
                return await transport.call(method, params, session=session.token)
            except RelayError as exc:
                if exc.code != "unauthorized" or attempt:
                    raise
                self._peer_sessions.pop(endpoint.relay_id, None)
        raise AssertionError("unreachable")

    async def relay_key(self, relay_id: str) -> bytes:
        """The relay's public key from its verified, unexpired ``relay.descriptor``."""
        cached = self._relay_keys.get(relay_id)
        now = self.now()
        if cached is not None and now < cached[1]:
            return cached[0]
        transport = self._http_to(self.endpoint_of(relay_id))
        descriptor = RelayDescriptor.from_wire(await transport.call("relay.descriptor"))
        key = verify_relay_descriptor(descriptor, self.identity.context, relay_id=relay_id, now=now)
        self._relay_keys[relay_id] = (key, descriptor.expires_at)
        return key

    # --- routes --------------------------------------------------------------------------

    async def resolve_route(self, account: str) -> AccountRoute:
        """``account.route.resolve`` on our home relay (no session), fully verified."""
        wire = await self._http_to(self.relay).call("account.route.resolve", {"account": account})
        route = AccountRoute.from_wire(wire)
        self._verified_route(route, account, await self.relay_key(route.relay_id))
        return route

    def _verified_route(self, route: AccountRoute, account: str, relay_key: bytes) -> None:
        verify_resolved_route(
            route,
            account=account,
            known=self._routes.get(account),
            relay_public_key=relay_key,
            context=self.identity.context,
            now=self.now(),
            max_skew=self.max_skew,
        )
        self._routes[account] = route

    async def publish_route(
        self,
        account_key: AccountKey,
        *,
        lifetime: int = DEFAULT_ROUTE_LIFETIME,
        revision: int | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> AccountRoute:
        """Make our home relay the account's home: sign a route naming it, have it co-sign.

        ``revision`` defaults to ``max(highest verified + 1, now in ms)``; a caller that
        publishes from several devices should persist and pass the revisions it used.
        The relay must hold the account's device state first (``publish_device_state``).
        """
        context = self.identity.context
        if account_key.account_id(context) != self.identity.account:
            raise ValueError("the account key is not this device's account's")
        now = self.now()
        known = self._routes.get(self.identity.account)
        if revision is None:
            now_ms = int(time.time() * 1000) + self._clock_offset * 1000
            revision = max((-1 if known is None else known.revision) + 1, now_ms)
        draft = sign_route(
            account_key,
            context,
            relay_id=self.relay.relay_id,
            revision=revision,
            updated_at=now,
            expires_at=now + lifetime,
            extensions=extensions,
        )
        wire = await self.account_call(account_key, "account.route.publish", draft.to_wire())
        final = AccountRoute.from_wire(wire)
        check_cosigned(draft, final)
        self._verified_route(
            final, self.identity.account, await self.relay_key(self.relay.relay_id)
        )
        return final

    async def home_relay(self, account: str) -> RelayEndpoint:
        """Where ``account`` lives: its verified route's relay, by the directory."""
        return self.endpoint_of((await self.resolve_route(account)).relay_id)

    # --- profiles ------------------------------------------------------------------------

    async def publish_profile(
        self,
        *,
        public_discovery: bool,
        nickname: str | None = None,
        avatar: ContentReference | None = None,
        bio: str | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> AccountProfile:
        """Sign our profile with this device and ``profile.publish`` it to our home relay."""
        profile = sign_profile(
            self.identity.keys,
            self.identity.account,
            self.identity.context,
            public_discovery=public_discovery,
            updated_at=self.now(),
            nickname=nickname,
            avatar=avatar,
            bio=bio,
            extensions=extensions,
        )
        await self.call("profile.publish", profile.to_wire())
        return profile

    async def resolve_profile(
        self, account: str, *, relay: RelayEndpoint | None = None
    ) -> ResolvedProfile:
        """``profile.resolve`` (on ``relay``, default our home relay), verified."""
        wire = await self._relay_call(relay or self.relay, "profile.resolve", {"account": account})
        result = ResolvedProfile.from_wire(wire)
        verify_resolved_profile(result, account=account, context=self.identity.context)
        return result

    # --- device states -------------------------------------------------------------------

    def _remember_state(self, state: AccountDeviceState) -> None:
        known = self._states.get(state.account)
        if known is not None:
            if state.revision < known.revision:
                raise StaleState("the relay answered an older device state")
            if state.revision == known.revision and state.to_json() != known.to_json():
                raise StateConflict("two device states of one revision with different content")
        self._states[state.account] = state

    async def resolve_device_state(
        self,
        account: str,
        *,
        authorization: Authorization | None = None,
        relay: RelayEndpoint | None = None,
    ) -> AccountDeviceState:
        """``device.state.resolve`` on ``relay`` (default our home relay), verified.

        Without ``authorization`` a read by account (our own, or a public account);
        with a grant or invitation a signed query. An invitation is checked again
        against the state it returned.
        """
        context = self.identity.context
        params: dict[str, Any] = {"account": account}
        if authorization is not None:
            params = sign_state_query(
                self.identity.keys,
                self.identity.certificate,
                context,
                account=account,
                authorization=authorization,
                created_at=self.now(),
            ).to_wire()
        wire = await self._relay_call(relay or self.relay, "device.state.resolve", params)
        state = AccountDeviceState.from_wire(wire)
        if state.account != account:
            raise InvalidSignature("the relay answered another account's device state")
        devices = CurrentDevices.verified(state, context)
        if isinstance(authorization, ContactInvite):
            evaluate_invite(
                authorization, inviter_devices=devices, now=self.now(), context=context
            ).check()
        self._remember_state(state)
        return state

    async def contact_devices(
        self, account: str, *, authorization: Authorization | None = None
    ) -> list[DeviceCertificate]:
        """The currently valid devices of ``account``, read from its home relay."""
        endpoint = await self.home_relay(account)
        state = await self.resolve_device_state(
            account, authorization=authorization, relay=endpoint
        )
        devices = CurrentDevices.trusted(state, self.identity.context).valid_at(self.now())
        if not devices:
            raise DeviceUnknown("the account has no currently valid device")
        return devices

    async def send_to(
        self,
        account: str,
        content: Mapping[str, Any],
        *,
        authorization: Authorization | None = None,
        own_devices: Sequence[DeviceCertificate] | None = None,
    ) -> dict[str, Any]:
        """The whole contact flow: route → that relay's device state → seal → send home."""
        recipients = await self.contact_devices(account, authorization=authorization)
        return await self.send(
            account,
            content,
            recipients=recipients,
            own_devices=own_devices,
            authorization=None if account == self.identity.account else authorization,
        )

    # --- grants and invitations ------------------------------------------------------------

    def make_grant(
        self,
        grantee: str,
        *,
        expires_at: int | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> ContactGrant:
        """Our grant to ``grantee`` (to send it in a ``ContactConsent``), signed by this device."""
        return issue_grant(
            self.identity.keys,
            self.identity.device_id,
            self.identity.context,
            grantor=self.identity.account,
            grantee=grantee,
            expires_at=expires_at,
            extensions=extensions,
        )

    def make_invite(
        self, *, expires_at: int, extensions: Mapping[str, Any] | None = None
    ) -> ContactInvite:
        """An invitation to contact our account, signed by this device."""
        return issue_invite(
            self.identity.keys,
            self.identity.device_id,
            self.identity.context,
            inviter=self.identity.account,
            expires_at=expires_at,
            extensions=extensions,
        )

    def check_grant(self, grant: ContactGrant, grantor_state: AccountDeviceState) -> AccessVerdict:
        """Is ``grant`` (received from its grantor) one we may use now?"""
        devices = CurrentDevices.verified(grantor_state, self.identity.context)
        return evaluate_grant(
            grant,
            grantee=self.identity.account,
            grantor_devices=devices,
            now=self.now(),
            context=self.identity.context,
        )

    def check_invite(
        self, invite: ContactInvite, inviter_state: AccountDeviceState
    ) -> AccessVerdict:
        devices = CurrentDevices.verified(inviter_state, self.identity.context)
        return evaluate_invite(
            invite, inviter_devices=devices, now=self.now(), context=self.identity.context
        )
