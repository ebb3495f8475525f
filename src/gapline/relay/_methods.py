"""The base-module methods the account timeline needs, independent of transport.

Each method is ``async def m(call, params) -> result``; the HTTP and WebSocket
transports decode the request into ``params`` (a dict), pick the session, and
encode the result or :class:`RelayFailure`. Both transports therefore apply
identical checks, state changes and errors, as conventions.md requires.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gapline.meshline import (
    MAX_SAFE_INTEGER,
    AccountDeviceState,
    AccountKey,
    DeviceCertificate,
    MeshlineError,
    MessageEnvelope,
    b64u_encode,
    check_account_id,
    check_box_set,
    check_message_id,
    relay_origin,
    verify_account_auth,
    verify_certificate,
    verify_device_auth,
    verify_device_state,
    verify_envelope,
)
from gapline.relay._config import RelayConfig
from gapline.relay._errors import RelayFailure, failure_from_meshline
from gapline.relay._store import (
    AcceptedSend,
    DeviceEntry,
    KeyBox,
    NewSend,
    NewState,
    Session,
    TimelineStore,
)

__all__ = ["Call", "Connection", "Method", "MethodTable", "Relay", "SessionMode", "token_hash"]


class SessionMode(enum.Enum):
    NONE = "none"
    DEVICE = "device"
    ANY = "any"  # device or account


class Connection(Protocol):
    """What a method may do to the WebSocket connection it was called on."""

    session: Session | None
    token_hash: str | None

    def bind(self, token_hash: str, session: Session) -> None: ...


@dataclass(slots=True)
class Call:
    """One invocation: the session the transport authenticated, and the WS connection if any."""

    session: Session | None = None
    connection: Connection | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[Call, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    http_verb: str  # GET, POST or PUT
    session: SessionMode
    handler: Handler
    # GET query fields and their types ("int" or "str").
    query: Mapping[str, str] = field(default_factory=dict)
    # True when the method has no result object (HTTP 204).
    no_content: bool = False


MethodTable = Mapping[str, Method]


_SIGNED_QUERY_FIELDS = frozenset(
    {"$type", "authorization", "signer_certificate", "created_at", "device_signature"}
)


def _compact(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


_MEMBER_NAMES: dict[str, str] = {}


def _member_name(name: str) -> str:
    """``"name":`` as json.dumps writes it; the few top-level names are cached."""
    text = _MEMBER_NAMES.get(name)
    if text is None:
        text = _compact(name) + ":"
        if len(_MEMBER_NAMES) < 64:
            _MEMBER_NAMES[name] = text
    return text


def _stored(text: str) -> Any:
    """A JSON text this relay wrote itself (already strictly validated on the way in)."""
    return json.loads(text)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


def _str(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise RelayFailure("bad_request", f"{name}: expected a nonempty string")
    return value


def _int(params: Mapping[str, Any], name: str, *, minimum: int, default: int | None = None) -> int:
    if name not in params and default is not None:
        return default
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RelayFailure("bad_request", f"{name}: expected an integer")
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise RelayFailure("bad_request", f"{name}: out of range")
    return value


def _require(call: Call, mode: str) -> Session:
    session = call.session
    if session is None:
        raise RelayFailure("unauthorized", "this method needs a session")
    if mode == "device" and session.mode != "device":
        raise RelayFailure("forbidden", "this method needs a device session")
    return session


class Relay:
    """The relay's methods over one :class:`TimelineStore`."""

    def __init__(self, config: RelayConfig, store: TimelineStore, key: AccountKey) -> None:
        self.config = config
        self.store = store
        self.key = key
        self.context = config.network_context
        self.relay_id = key.relay_id()
        self.base_url = self.ws_url = self.origin = ""
        if config.public_url or config.port:
            self.set_url(config.url)  # else: set once the listening port is known
        self._descriptor: dict[str, Any] | None = None
        self._descriptor_until = 0
        # Called with (account) after a local device-state acceptance; the server drops
        # cached sessions and re-checks WebSocket bindings.
        self.on_state_accepted: Callable[[str, int], Awaitable[None]] | None = None
        self.on_appended: Callable[[AcceptedSend], None] | None = None
        # Verified certificates by canonical JSON: verification is pure, so cache it.
        self._verified: dict[bytes, str] = {}
        # Sender signing keys by device ID (see _sender_signing_key).
        self._signing_keys: dict[str, bytes] = {}
        self.methods: dict[str, Method] = {
            m.name: m
            for m in (
                Method("relay.descriptor", "GET", SessionMode.NONE, self.relay_descriptor),
                Method("relay.info", "GET", SessionMode.NONE, self.relay_info),
                Method("auth.challenge", "POST", SessionMode.NONE, self.auth_challenge),
                Method("auth.device.verify", "POST", SessionMode.NONE, self.auth_device_verify),
                Method("auth.account.verify", "POST", SessionMode.NONE, self.auth_account_verify),
                Method("device.state.publish", "PUT", SessionMode.ANY, self.device_state_publish),
                Method(
                    "device.state.resolve",
                    "GET",
                    SessionMode.ANY,
                    self.device_state_resolve,
                    query={"account": "str", **{f: "str" for f in _SIGNED_QUERY_FIELDS}},
                ),
                Method("message.send", "POST", SessionMode.DEVICE, self.message_send),
                Method(
                    "message.delivery.status",
                    "GET",
                    SessionMode.DEVICE,
                    self.message_delivery_status,
                    query={"message_id": "str"},
                ),
                Method(
                    "message.timeline.sync",
                    "GET",
                    SessionMode.DEVICE,
                    self.message_timeline_sync,
                    query={"after": "int", "limit": "int"},
                ),
            )
        }

    def set_url(self, url: str) -> None:
        """The HTTPS base URL clients use; sessions and auth signatures bind its origin."""
        self.base_url = url
        self.ws_url = ("wss" + url[5:]) if url.startswith("https") else ("ws" + url[4:])
        self.origin = relay_origin(url)
        self._descriptor = None

    # -- relay information --------------------------------------------------------------

    async def relay_info(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "relay_id": self.relay_id,
            "name": self.config.name,
            "server_time": self.config.clock(),
            "limits": {"message_retention": self.config.retention},
        }

    async def relay_descriptor(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        now = self.config.clock()
        if (
            self._descriptor is None
            or now >= self._descriptor_until - self.config.descriptor_ttl // 2
        ):
            expires_at = now + self.config.descriptor_ttl
            # A standalone relay has no libp2p listener; it lists its HTTPS and WSS endpoints
            # only (a documented deviation: public relays must list a libp2p address).
            body: dict[str, Any] = {
                "$type": "meshline.relay.descriptor",
                "relay_id": self.relay_id,
                "public_key": self.key.public_key_b64,
                "endpoints": [self.base_url, self.ws_url],
                "expires_at": expires_at,
            }
            body["relay_signature"] = self.key.sign_object(body, self.context, exclude=())
            self._descriptor, self._descriptor_until = body, expires_at
        return self._descriptor

    # -- authentication ----------------------------------------------------------------

    async def auth_challenge(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        account = self._account(params.get("account"))
        now = self.config.clock()
        nonce = b64u_encode(os.urandom(32))
        expires_at = now + self.config.challenge_ttl
        await self.store.accounts.add_challenge(nonce, account, expires_at)
        return {"nonce": nonce, "created_at": now, "expires_at": expires_at}

    async def _consume(self, params: Mapping[str, Any]) -> tuple[str, str]:
        nonce = params.get("nonce")
        if not isinstance(nonce, str) or not 0 < len(nonce) <= 256:
            raise RelayFailure("bad_request", "nonce: expected a challenge nonce")
        found = await self.store.accounts.consume_challenge(nonce)
        if found is None or found[1] <= self.config.clock():
            raise RelayFailure("unauthorized", "challenge missing, expired or already used")
        return nonce, found[0]

    def _check_rebind(self, call: Call, account: str, mode: str, device_id: str | None) -> None:
        conn = call.connection
        if conn is None or conn.session is None:
            return
        bound = conn.session
        if (bound.account, bound.mode, bound.device_id) != (account, mode, device_id):
            raise RelayFailure("forbidden", "this connection is bound to another identity")

    async def _issue(self, call: Call, session: Session) -> dict[str, Any]:
        token = secrets.token_urlsafe(32)
        digest = token_hash(token)
        await self.store.accounts.add_session(digest, session)
        if call.connection is not None:
            call.connection.bind(digest, session)
        return {"token": token, "mode": session.mode, "expires_at": session.expires_at}

    async def auth_device_verify(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        nonce, account = await self._consume(params)
        timestamp = _int(params, "timestamp", minimum=0)
        now = self.config.clock()
        if abs(timestamp - now) > self.config.clock_skew:
            raise RelayFailure("clock_skew", "timestamp is outside the relay's clock tolerance")
        cert = self._certificate(params.get("signer_certificate"))
        device_id = self._verify_certificate(cert)
        if cert.account != account:
            raise RelayFailure("bad_request", "signer_certificate account is not the challenge's")
        signature = params.get("device_signature")
        if not isinstance(signature, str):
            raise RelayFailure("bad_request", "device_signature: expected a string")
        try:
            verify_device_auth(
                signature,
                signing_public_key=cert.signing_key_bytes,
                context=self.context,
                relay_id=self.relay_id,
                origin=self.origin,
                account=account,
                device_id=device_id,
                nonce=nonce,
                timestamp=timestamp,
            )
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None
        window = await self.store.accounts.device_window(account, device_id)
        if window is None or not window[0] <= now < window[1]:
            raise RelayFailure(
                "device_unknown", "the device is not currently valid for the account"
            )
        self._check_rebind(call, account, "device", device_id)
        # Capped by this device's certificate in the account's authoritative state.
        expires_at = min(now + self.config.session_ttl, window[1])
        return await self._issue(
            call, Session(account, "device", device_id, self.origin, expires_at)
        )

    async def auth_account_verify(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        nonce, account = await self._consume(params)
        public_key = _str(params, "account_public_key")
        signature = _str(params, "account_signature")
        try:
            verify_account_auth(
                signature,
                account_public_key=public_key,
                context=self.context,
                relay_id=self.relay_id,
                origin=self.origin,
                account=account,
                nonce=nonce,
            )
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None
        self._check_rebind(call, account, "account", None)
        expires_at = self.config.clock() + self.config.session_ttl
        return await self._issue(call, Session(account, "account", None, self.origin, expires_at))

    # -- device state ------------------------------------------------------------------

    async def device_state_publish(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        session = _require(call, "any")
        try:
            state = AccountDeviceState.from_wire(params)
            by_id = verify_device_state(state, self.context)
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None
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
        # This relay is the home relay of every account that publishes its state to it
        # (standalone deviation), so publication is authoritative, never "staged".
        changed = await self.store.accounts.publish_state(accepted)
        if changed and self.on_state_accepted is not None:
            await self.on_state_accepted(state.account, state.revision)
        return {"status": "accepted"}

    async def device_state_resolve(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        session = _require(call, "any")
        signed = _SIGNED_QUERY_FIELDS & params.keys()
        verb = call.extra.get("http_verb")
        if verb == "GET" and signed:
            raise RelayFailure("bad_request", "GET does not take signed-query fields; use POST")
        if verb == "POST" or signed:
            # Signed queries carry a ContactGrant or ContactInvite, which this relay does not
            # evaluate; it never falls back to a public query for them.
            raise RelayFailure(
                "forbidden", "signed (contact-authorized) device-state queries are not offered"
            )
        account = self._account(params.get("account"))
        if account != session.account and session.mode != "device":
            raise RelayFailure("forbidden", "an account session reads only its own state")
        canonical = await self.store.accounts.resolve_state(account)
        if canonical is None:
            raise RelayFailure("not_found", "no device state for this account")
        return _stored(canonical)

    # -- messages ----------------------------------------------------------------------

    async def message_send(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        session = _require(call, "device")
        try:
            envelope = MessageEnvelope.from_wire(params.get("envelope"))
            recipient_boxes = check_box_set(params.get("recipient_boxes"), "recipient_boxes")
            sender_boxes = (
                check_box_set(params["sender_boxes"], "sender_boxes")
                if "sender_boxes" in params
                else None
            )
            check_account_id(envelope.from_, self.context, field="from")
            check_account_id(envelope.to, self.context, field="to")
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None
        if envelope.from_ != session.account or envelope.from_device_id != session.device_id:
            raise RelayFailure("forbidden", "envelope from/from_device_id must be the session's")
        self_delivery = envelope.from_ == envelope.to
        if self_delivery and sender_boxes is not None:
            raise RelayFailure("bad_request", "sender_boxes must be omitted for self-delivery")
        if not self_delivery and "authorization" in params:
            # Contact grants and invitations are not verified by this relay; refusing them
            # keeps "invalid credentials never fall back to public bootstrap" true.
            raise RelayFailure("forbidden", "contact authorization is not offered by this relay")
        # Idempotency compares the canonical JSON of the complete params. Sorted-key compact
        # json.dumps of the strictly parsed value is a one-to-one function of that canonical
        # form (same value <=> same text), so its digest decides equality exactly, at a
        # fraction of the cost of RFC 8785 serialisation. The stored envelope and key boxes
        # are those same sorted-key texts (member order carries no meaning in JSON; every
        # signature covers the canonical form), so each part is serialised once, and the
        # params text is assembled from the parts exactly as one sorted json.dumps would.
        parts = {
            name: _compact(value, sort_keys=True)
            for name, value in params.items()
            if name not in ("recipient_boxes", "sender_boxes")
        }
        recipient_texts = [_compact(b, sort_keys=True) for b in params["recipient_boxes"]]
        parts["recipient_boxes"] = "[" + ",".join(recipient_texts) + "]"
        sender_texts: list[str] = []
        if "sender_boxes" in params:
            sender_texts = [_compact(b, sort_keys=True) for b in params["sender_boxes"]]
            parts["sender_boxes"] = "[" + ",".join(sender_texts) + "]"
        canonical = "{" + ",".join(_member_name(k) + parts[k] for k in sorted(parts)) + "}"
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        now = self.config.clock()
        # Time checks refuse only new requests: a retry of an accepted message still gets its
        # result after the age limit has passed, so the store raises these after its
        # duplicate check.
        refusal: RelayFailure | None = None
        if envelope.created_at > now + self.config.clock_skew:
            refusal = RelayFailure("clock_skew", "envelope created_at is in the relay's future")
        elif envelope.created_at < now - self.config.delivery_age_limit:
            refusal = RelayFailure(
                "message_expired", "the envelope is older than the delivery age limit"
            )
        signing_key = await self._sender_signing_key(session)
        try:
            verify_envelope(envelope, signing_key, self.context)
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None
        # Records keep the objects as received (unknown fields included; members sorted).
        send = NewSend(
            from_account=envelope.from_,
            to_account=envelope.to,
            from_device_id=envelope.from_device_id,
            message_id=envelope.message_id,
            digest=digest,
            envelope=parts["envelope"],
            recipient_boxes=tuple(
                KeyBox(b.device_id, text)
                for b, text in zip(recipient_boxes, recipient_texts, strict=True)
            ),
            sender_boxes=None
            if sender_boxes is None
            else tuple(
                KeyBox(b.device_id, text)
                for b, text in zip(sender_boxes, sender_texts, strict=True)
            ),
            retention=self.config.retention,
            now=now,
            refusal=refusal,
        )
        accepted = await self.store.sends.accept(send)
        if self.on_appended is not None and accepted.appended:
            self.on_appended(accepted)
        return accepted.result.to_json()

    async def _sender_signing_key(self, session: Session) -> bytes:
        # The session proved this device at authentication; its certificate is in the
        # account's accepted state (kept in device_certificates). Any version of it carries
        # the same signing key, because the device ID is derived from the keys.
        device_id = session.device_id or ""
        key = self._signing_keys.get(device_id)
        if key is None:
            cert = await self.store.accounts.certificate(device_id)
            if cert is None:
                raise RelayFailure("device_unknown", "no certificate for the sending device")
            key = DeviceCertificate.from_json(cert).signing_key_bytes
            if len(self._signing_keys) > 100_000:
                self._signing_keys.clear()
            self._signing_keys[device_id] = key
        return key

    async def message_delivery_status(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        session = _require(call, "device")
        try:
            message_id = check_message_id(params.get("message_id"))
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None
        result = await self.store.sends.delivery_status(
            session.account, message_id, self.config.clock()
        )
        return result.to_json()

    async def message_timeline_sync(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        session = _require(call, "device")
        after = _int(params, "after", minimum=-1, default=-1)
        limit = _int(params, "limit", minimum=1, default=self.config.page_limit)
        limit = min(limit, self.config.page_limit)
        page = await self.store.timelines.sync(
            session.account, session.device_id or "", after, limit, self.config.clock()
        )
        out: dict[str, Any] = {
            "items": [
                {
                    "sequence": i.sequence,
                    "envelope": _stored(i.envelope),
                    "key_box": _stored(i.key_box),
                    "accepted_at": i.accepted_at,
                }
                for i in page.items
            ],
            "certificates": [_stored(c) for c in page.certificates],
            "has_more": page.has_more,
        }
        if page.has_retention_gap:
            out["has_retention_gap"] = True
        return out

    # -- helpers -----------------------------------------------------------------------

    def _account(self, value: object) -> str:
        try:
            return check_account_id(value, self.context)
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None

    def _certificate(self, value: object) -> DeviceCertificate:
        try:
            return DeviceCertificate.from_wire(value)
        except MeshlineError as exc:
            raise failure_from_meshline(exc) from None

    def _verify_certificate(self, cert: DeviceCertificate) -> str:
        key = cert.to_json()
        device_id = self._verified.get(key)
        if device_id is None:
            try:
                device_id = verify_certificate(cert, self.context)
            except MeshlineError as exc:
                raise failure_from_meshline(exc) from None
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified[key] = device_id
        return device_id
