"""``AccountRoute``: the account's signed choice of home relay, co-signed by that relay.

Signing order: the account signs the route minus both signatures; the relay then
signs it minus only ``relay_signature``, so its signature covers the account's.
Revisions order one account's routes; one revision may carry only one content
(the route minus its signatures). Every node keeps, forever and per account, the
highest revision it verified, a digest of the content at it, and whether a
different content at that revision was seen (``RouteHistory``): routes below it
are never current again, and an unresolved conflict suspends the account until a
higher revision arrives. The publish checks (``accept_route_publication``) and the
resolution (``select_route``) are pure; where the documents live is the caller's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline._base64 import b64u_decode
from gapline.meshline._canonical import (
    NetworkContext,
    canonical_json,
    network_bound_bytes,
    parse_json,
    sha256_text,
)
from gapline.meshline._certificates import AccountDeviceState
from gapline.meshline._errors import (
    BadRequest,
    ClockSkew,
    Forbidden,
    InvalidSignature,
    InvalidState,
    NotFound,
    RequestTooLarge,
    StaleState,
    StateConflict,
)
from gapline.meshline._fields import (
    b64_field,
    extensions,
    int_field,
    no_nulls,
    object_of,
    str_field,
    type_field,
)
from gapline.meshline._identity import AccountKey, account_verify
from gapline.meshline._ids import check_account_id, check_relay_id, neo_account_id
from gapline.meshline._ids import relay_id_from_public_key as _relay_id_of

__all__ = [
    "ROUTE_MAX_BYTES",
    "ROUTE_MAX_LIFETIME",
    "AccountRoute",
    "ResolutionStatus",
    "RouteHistory",
    "RouteOrder",
    "RoutePublication",
    "RouteResolution",
    "accept_route_publication",
    "check_cosigned",
    "compare_routes",
    "cosign_route",
    "route_usable_state",
    "select_route",
    "sign_route",
    "verify_resolved_route",
    "verify_route",
    "verify_route_draft",
]

ROUTE_TYPE = "meshline.account.route"
ROUTE_MAX_BYTES = 4096
ROUTE_MAX_LIFETIME = 3650 * 86400
_FIELDS = frozenset(
    {
        "$type",
        "account",
        "account_public_key",
        "revision",
        "relay_id",
        "updated_at",
        "expires_at",
        "account_signature",
        "relay_signature",
    }
)


@dataclass(frozen=True, slots=True)
class AccountRoute:
    account: str
    account_public_key: str
    revision: int
    relay_id: str
    updated_at: int
    expires_at: int
    account_signature: str
    relay_signature: str | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> AccountRoute:
        """Structure and field rules; a document over 4 KiB can never be valid, so that first."""
        obj = object_of(value, "AccountRoute")
        if len(canonical_json(obj)) > ROUTE_MAX_BYTES:
            raise RequestTooLarge(f"account route exceeds {ROUTE_MAX_BYTES} canonical bytes")
        type_field(obj, ROUTE_TYPE)
        no_nulls(obj, "AccountRoute")
        return cls(
            account=str_field(obj, "account"),
            account_public_key=b64_field(obj, "account_public_key", 33),
            revision=int_field(obj, "revision", minimum=0),
            relay_id=check_relay_id(obj.get("relay_id")),
            updated_at=int_field(obj, "updated_at", minimum=0),
            expires_at=int_field(obj, "expires_at", minimum=0),
            account_signature=b64_field(obj, "account_signature", 64),
            relay_signature=(
                b64_field(obj, "relay_signature", 64) if "relay_signature" in obj else None
            ),
            extensions=extensions(obj, _FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> AccountRoute:
        return cls.from_wire(parse_json(data))

    def content(self) -> dict[str, Any]:
        """The route minus both signatures: what one revision may carry only once."""
        return {
            **self.extensions,
            "$type": ROUTE_TYPE,
            "account": self.account,
            "account_public_key": self.account_public_key,
            "revision": self.revision,
            "relay_id": self.relay_id,
            "updated_at": self.updated_at,
            "expires_at": self.expires_at,
        }

    def to_wire(self) -> dict[str, Any]:
        wire = {**self.content(), "account_signature": self.account_signature}
        if self.relay_signature is not None:
            wire["relay_signature"] = self.relay_signature
        return wire

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    def draft(self) -> AccountRoute:
        """This route without the relay's signature (what the client submitted)."""
        return AccountRoute(
            self.account,
            self.account_public_key,
            self.revision,
            self.relay_id,
            self.updated_at,
            self.expires_at,
            self.account_signature,
            None,
            self.extensions,
        )

    def content_digest(self, context: NetworkContext) -> str:
        """``sha256:`` of the network-bound content: equal iff the contents are equal."""
        return sha256_text(network_bound_bytes(self.content(), context))

    def is_expired(self, now: int) -> bool:
        return now >= self.expires_at


def sign_route(
    account_key: AccountKey,
    context: NetworkContext,
    *,
    relay_id: str,
    revision: int,
    updated_at: int,
    expires_at: int,
    extensions: Mapping[str, Any] | None = None,
) -> AccountRoute:
    """The account-signed draft for ``account.route.publish`` (no ``relay_signature``)."""
    content = {
        **(extensions or {}),
        "$type": ROUTE_TYPE,
        "account": account_key.account_id(context),
        "account_public_key": account_key.public_key_b64,
        "revision": revision,
        "relay_id": relay_id,
        "updated_at": updated_at,
        "expires_at": expires_at,
    }
    signature = account_key.sign_object(content, context, exclude=())
    return AccountRoute.from_wire({**content, "account_signature": signature})


def _check_body(route: AccountRoute, context: NetworkContext, *, now: int, max_skew: int) -> None:
    """Every rule but the relay signature's: account binding, window, expiry, skew, account
    signature. ``clock_skew`` wins over a valid signature: a future route is never stored."""
    check_account_id(route.account, context)
    if not route.updated_at < route.expires_at <= route.updated_at + ROUTE_MAX_LIFETIME:
        raise BadRequest("route window must be non-empty and at most 3,650 days")
    if route.is_expired(now):
        raise BadRequest("the route has expired")
    if route.updated_at > now + max_skew:
        raise ClockSkew("route updated_at is beyond the allowed clock skew")
    key = b64u_decode(route.account_public_key, length=33, field="account_public_key")
    try:
        derived = neo_account_id(key, context)
    except BadRequest:
        raise InvalidSignature("route account key is not a compressed P-256 key") from None
    if derived != route.account:
        raise InvalidSignature("route account does not derive from its account key")
    data = network_bound_bytes(route.content(), context)
    if not account_verify(key, data, b64u_decode(route.account_signature, length=64)):
        raise InvalidSignature("route account signature does not verify")


def verify_route_draft(
    route: AccountRoute, context: NetworkContext, *, now: int, max_skew: int
) -> None:
    """A publication request: every rule, ``relay_signature`` absent."""
    if route.relay_signature is not None:
        raise BadRequest("a route submitted for publication must omit relay_signature")
    _check_body(route, context, now=now, max_skew=max_skew)


def verify_route(
    route: AccountRoute,
    context: NetworkContext,
    *,
    relay_public_key: bytes,
    now: int,
    max_skew: int,
) -> None:
    """A final route, as a client or DHT node uses it.

    ``relay_public_key`` is the designated relay's key from its verified
    ``RelayDescriptor``; it must derive ``relay_id``, and sign the route.
    """
    if route.relay_signature is None:
        raise BadRequest("a final route carries relay_signature")
    if len(route.to_json()) > ROUTE_MAX_BYTES:
        raise RequestTooLarge(f"account route exceeds {ROUTE_MAX_BYTES} canonical bytes")
    _check_body(route, context, now=now, max_skew=max_skew)
    try:
        relay_id = _relay_id_of(relay_public_key)
    except BadRequest:
        raise InvalidSignature("relay key is not a compressed P-256 key") from None
    if relay_id != route.relay_id:
        raise InvalidSignature("the relay key does not derive the route's relay_id")
    data = network_bound_bytes(route.draft().to_wire(), context)
    if not account_verify(relay_public_key, data, b64u_decode(route.relay_signature, length=64)):
        raise InvalidSignature("route relay signature does not verify")


def cosign_route(
    route: AccountRoute, relay_key: AccountKey, context: NetworkContext
) -> AccountRoute:
    """Append this relay's signature; the final document must still fit in 4 KiB."""
    if route.relay_signature is not None:
        raise BadRequest("route already carries relay_signature")
    signature = relay_key.sign_object(route.to_wire(), context, exclude=())
    final = AccountRoute(
        route.account,
        route.account_public_key,
        route.revision,
        route.relay_id,
        route.updated_at,
        route.expires_at,
        route.account_signature,
        signature,
        route.extensions,
    )
    if len(final.to_json()) > ROUTE_MAX_BYTES:
        raise RequestTooLarge(f"the co-signed route exceeds {ROUTE_MAX_BYTES} canonical bytes")
    return final


def check_cosigned(draft: AccountRoute, final: AccountRoute) -> None:
    """The publish answer only appended ``relay_signature`` to what was submitted."""
    if final.relay_signature is None or canonical_json(final.draft().to_wire()) != canonical_json(
        draft.to_wire()
    ):
        raise InvalidSignature("the relay changed the submitted route")


class RouteOrder(enum.Enum):
    OLDER = "older"
    NEWER = "newer"
    SAME = "same"  # same revision, same content (signatures may differ)
    CONFLICT = "conflict"  # same revision, different content


def compare_routes(route: AccountRoute, other: AccountRoute) -> RouteOrder:
    """Where ``route`` stands against ``other`` (the same account's)."""
    if route.account != other.account:
        raise BadRequest("routes of different accounts do not compare")
    if route.revision != other.revision:
        return RouteOrder.OLDER if route.revision < other.revision else RouteOrder.NEWER
    same = canonical_json(route.content()) == canonical_json(other.content())
    return RouteOrder.SAME if same else RouteOrder.CONFLICT


def verify_resolved_route(
    route: AccountRoute,
    *,
    account: str,
    known: AccountRoute | None,
    relay_public_key: bytes,
    context: NetworkContext,
    now: int,
    max_skew: int,
) -> None:
    """A client's checks on a route a relay answered for ``account``.

    ``known`` is the highest route this client verified for it: an older answer is
    ``stale_state`` and another content at the same revision ``invalid_state``.
    """
    if route.account != account:
        raise InvalidSignature("the relay answered another account's route")
    verify_route(route, context, relay_public_key=relay_public_key, now=now, max_skew=max_skew)
    if known is not None:
        order = compare_routes(route, known)
        if order is RouteOrder.OLDER:
            raise StaleState("an older route than one already verified")
        if order is RouteOrder.CONFLICT:
            raise InvalidState("two routes of one revision with different content")


@dataclass(frozen=True, slots=True)
class RouteHistory:
    """What a node persists forever per (network context, account).

    ``revision`` only grows (-1: nothing verified yet), whatever expires or restarts;
    ``digest`` is ``AccountRoute.content_digest`` at that revision; ``conflict``
    records two contents seen at that revision (``digest`` is then None: no content
    at a conflicting revision is ever current).
    """

    revision: int = -1
    digest: str | None = None
    conflict: bool = False

    def observe(self, route: AccountRoute, context: NetworkContext) -> RouteHistory:
        """After a fully verified, unexpired final route (or this relay's own co-signing)."""
        if route.revision < self.revision:
            return self
        digest = route.content_digest(context)
        if route.revision > self.revision:
            return RouteHistory(route.revision, digest, False)
        if digest == self.digest or self.conflict:
            return self
        # Which content came first is arrival order, not protocol state: keep neither.
        return RouteHistory(self.revision, None, True)

    def admits(self, route: AccountRoute, context: NetworkContext) -> bool:
        """Whether ``route`` may be current under this history."""
        return (
            not self.conflict
            and route.revision == self.revision
            and route.content_digest(context) == self.digest
        )


def route_usable_state(
    account: str, state: AccountDeviceState | None, *, staged_until: int | None, now: int
) -> bool:
    """Publish precondition: this relay holds the account's authoritative device state
    (``staged_until`` None), or staged state whose retention has not ended."""
    if state is None or state.account != account:
        return False
    return staged_until is None or now < staged_until


@dataclass(frozen=True, slots=True)
class RoutePublication:
    """An accepted ``account.route.publish``: the final route and the history to persist,
    in one commit with the route (and the device state it relied on)."""

    route: AccountRoute
    history: RouteHistory


def accept_route_publication(
    draft: AccountRoute,
    *,
    session_account: str,
    relay_key: AccountKey,
    history: RouteHistory,
    device_state: AccountDeviceState | None,
    staged_until: int | None = None,
    context: NetworkContext,
    now: int,
    max_skew: int,
) -> RoutePublication:
    """Every check ``account.route.publish`` makes, then the co-signature.

    Raises with the spec's code and nothing to store: ``forbidden`` (another account's
    route), ``bad_request`` (fields, window, expired, ``relay_signature`` present, a
    route naming another relay), ``invalid_signature``, ``clock_skew``,
    ``state_conflict`` (no usable device state; same revision with other content;
    not above an unresolved conflict), ``stale_state`` (below the highest revision),
    ``request_too_large`` (the co-signed document over 4 KiB). Republishing the
    accepted route again returns the same final document (RFC 6979 signatures).
    """
    if draft.account != session_account:
        raise Forbidden("the route belongs to another account than the session's")
    if draft.relay_id != relay_key.relay_id():
        raise BadRequest("the route designates another relay")
    verify_route_draft(draft, context, now=now, max_skew=max_skew)
    if not route_usable_state(draft.account, device_state, staged_until=staged_until, now=now):
        raise StateConflict("this relay holds no usable device state for the account")
    if draft.revision < history.revision:
        raise StaleState("a higher route revision is known")
    if draft.revision == history.revision:
        if history.conflict:
            raise StateConflict("a same-revision conflict needs a higher revision to resolve")
        if draft.content_digest(context) != history.digest:
            raise StateConflict("another route content is known at this revision")
    final = cosign_route(draft, relay_key, context)
    return RoutePublication(final, history.observe(final, context))


class ResolutionStatus(enum.Enum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    CONFLICT = "invalid_state"


@dataclass(frozen=True, slots=True)
class RouteResolution:
    status: ResolutionStatus
    route: AccountRoute | None
    history: RouteHistory

    def result(self) -> AccountRoute:
        """The route, or the ``account.route.resolve`` error (``not_found``/``invalid_state``)."""
        if self.status is ResolutionStatus.CONFLICT:
            raise InvalidState("an unresolved same-revision route conflict")
        if self.route is None:
            raise NotFound("no usable route for this account")
        return self.route


def select_route(
    candidates: Iterable[AccountRoute],
    history: RouteHistory,
    *,
    context: NetworkContext,
    now: int,
) -> RouteResolution:
    """Choose among verified final candidates for one account, under the persisted history.

    Callers verify each candidate first (``verify_route``, or ``route_from_record`` for
    DHT values) and drop those that fail: a failed record changes no history.
    Expired candidates are ignored; the others advance the history; a conflict at the
    highest revision yields ``CONFLICT`` (never a pick by arrival or digest); else the
    candidate whose content is the history's, or ``NOT_FOUND`` (the highest revision
    may be known only from history, its route gone: an older one is never reinstated).
    Persist ``history`` whenever it changed, before using the route.
    """
    live = sorted((r for r in candidates if not r.is_expired(now)), key=lambda r: r.revision)
    for route in live:
        history = history.observe(route, context)
    if history.conflict:
        return RouteResolution(ResolutionStatus.CONFLICT, None, history)
    for route in live:
        if history.admits(route, context):
            return RouteResolution(ResolutionStatus.FOUND, route, history)
    return RouteResolution(ResolutionStatus.NOT_FOUND, None, history)
