"""Contact authorization as verdicts: grants, invitations, public discovery, signed queries.

A home relay decides here whether a requester may reach a target account: send it
a message (``message.send``) or read its device state (``device.state.resolve``).
The material is a ``ContactGrant`` (from the target to the requester, with at least
one signature by a device currently valid in the target's state) or a
``ContactInvite`` (issued by the target, signed by a currently valid device,
unexpired). Without material, only a target whose published profile has
``public_discovery`` may be reached. Invalid material never falls back to public
access. Every function is pure and returns an ``AccessVerdict``; ``check()`` raises
its error with the spec's code.

Codes (device-state.md, contacts.md, conventions.md): malformed material, an
unknown ``$type`` and material on self-delivery are ``bad_request``; a signature
that fails cryptographically is ``invalid_signature``; everything that is validly
signed but grants nothing here (another issuer or audience, expired, signed only
by devices no longer, or not yet, valid: the revocation case) is ``forbidden``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline._base64 import b64u_decode
from gapline.meshline._canonical import NetworkContext, canonical_json, network_bound_bytes
from gapline.meshline._certificates import CurrentDevices, DeviceCertificate, verify_certificate
from gapline.meshline._contacts import GRANT_TYPE, INVITE_TYPE, ContactGrant, ContactInvite
from gapline.meshline._errors import (
    BadRequest,
    ClockSkew,
    Forbidden,
    InvalidSignature,
    MeshlineError,
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
from gapline.meshline._identity import DeviceKeys, device_verify
from gapline.meshline._ids import check_account_id
from gapline.meshline._profile import AccountProfile

__all__ = [
    "SIGNED_QUERY_FIELDS",
    "AccessBasis",
    "AccessVerdict",
    "Authorization",
    "Refusal",
    "SignedStateQuery",
    "authorize_delivery",
    "authorize_state_query",
    "evaluate_authorization",
    "evaluate_grant",
    "evaluate_invite",
    "parse_authorization",
    "public_access",
    "sign_state_query",
    "verify_state_query",
]

Authorization = ContactGrant | ContactInvite

STATE_QUERY_TYPE = "meshline.device.state.resolve"
#: The fields whose presence makes a ``device.state.resolve`` a signed query.
SIGNED_QUERY_FIELDS = frozenset(
    {"$type", "authorization", "signer_certificate", "created_at", "device_signature"}
)


class Refusal(enum.Enum):
    """Why access was refused; ``code`` is the spec's error code for it."""

    MALFORMED = "malformed"
    UNSUPPORTED_TYPE = "unsupported_type"
    SELF_DELIVERY = "self_delivery"  # authorization on a send to one's own account
    NOT_PUBLIC = "not_public"  # no material, and the target has no public profile
    WRONG_ISSUER = "wrong_issuer"  # granted or invited by another account than the target
    WRONG_AUDIENCE = "wrong_audience"  # a grant to another account than the requester
    EXPIRED = "expired"
    NO_CURRENT_SIGNER = "no_current_signer"  # no signing device currently valid (revoked)
    BAD_SIGNATURE = "bad_signature"

    @property
    def code(self) -> str:
        if self in (Refusal.MALFORMED, Refusal.UNSUPPORTED_TYPE, Refusal.SELF_DELIVERY):
            return "bad_request"
        if self is Refusal.BAD_SIGNATURE:
            return "invalid_signature"
        return "forbidden"


class AccessBasis(enum.Enum):
    """What an allowed access rests on."""

    SELF = "self"
    PUBLIC = "public"
    GRANT = "grant"
    INVITE = "invite"


@dataclass(frozen=True, slots=True)
class AccessVerdict:
    basis: AccessBasis | None
    refusal: Refusal | None = None
    message: str = ""

    @classmethod
    def allow(cls, basis: AccessBasis) -> AccessVerdict:
        return cls(basis)

    @classmethod
    def refuse(cls, refusal: Refusal, message: str) -> AccessVerdict:
        return cls(None, refusal, message)

    @property
    def allowed(self) -> bool:
        return self.refusal is None

    @property
    def code(self) -> str | None:
        return None if self.refusal is None else self.refusal.code

    def check(self) -> AccessBasis:
        """The basis, or the refusal raised as its typed error."""
        if self.refusal is None:
            assert self.basis is not None
            return self.basis
        error = {"bad_request": BadRequest, "invalid_signature": InvalidSignature}
        raise error.get(self.refusal.code, Forbidden)(self.message)


def parse_authorization(value: object) -> Authorization:
    """``ContactGrant`` or ``ContactInvite`` by exact ``$type``; anything else ``bad_request``."""
    kind = value.get("$type") if isinstance(value, Mapping) else None
    if kind == GRANT_TYPE:
        return ContactGrant.from_wire(value)
    if kind == INVITE_TYPE:
        return ContactInvite.from_wire(value)
    raise BadRequest(f"authorization: unsupported $type {kind!r}")


def evaluate_grant(
    grant: ContactGrant,
    *,
    grantee: str,
    grantor_devices: CurrentDevices,
    now: int,
    context: NetworkContext,
) -> AccessVerdict:
    """Does ``grant`` let ``grantee`` reach the account of ``grantor_devices``?

    A signature counts only if keyed by a device currently valid in that state;
    signatures of other devices are ignored, never treated as failures.
    """
    if grant.grantor != grantor_devices.account:
        return AccessVerdict.refuse(Refusal.WRONG_ISSUER, "the grant is from another account")
    if grant.grantee != grantee:
        return AccessVerdict.refuse(Refusal.WRONG_AUDIENCE, "the grant is for another account")
    if grant.is_expired(now):
        return AccessVerdict.refuse(Refusal.EXPIRED, "the grant has expired")
    data: bytes | None = None
    for device_id, signature in grant.signatures.items():
        cert = grantor_devices.valid(device_id, now)
        if cert is None:
            continue
        data = grant.signing_input(context) if data is None else data
        if device_verify(cert.signing_key_bytes, data, b64u_decode(signature, length=64)):
            return AccessVerdict.allow(AccessBasis.GRANT)
    if data is None:
        return AccessVerdict.refuse(
            Refusal.NO_CURRENT_SIGNER, "no grant signature is from a currently valid device"
        )
    return AccessVerdict.refuse(Refusal.BAD_SIGNATURE, "the grant signatures do not verify")


def evaluate_invite(
    invite: ContactInvite, *, inviter_devices: CurrentDevices, now: int, context: NetworkContext
) -> AccessVerdict:
    """Is ``invite`` a current invitation to the account of ``inviter_devices``?

    Usable by any number of accounts until it expires or its signing device leaves.
    """
    if invite.inviter != inviter_devices.account:
        return AccessVerdict.refuse(Refusal.WRONG_ISSUER, "the invitation is for another account")
    if invite.is_expired(now):
        return AccessVerdict.refuse(Refusal.EXPIRED, "the invitation has expired")
    cert = inviter_devices.valid(invite.signer_device_id, now)
    if cert is None:
        return AccessVerdict.refuse(
            Refusal.NO_CURRENT_SIGNER, "the invitation's signing device is not currently valid"
        )
    signature = b64u_decode(invite.device_signature, length=64)
    if not device_verify(cert.signing_key_bytes, invite.signing_input(context), signature):
        return AccessVerdict.refuse(Refusal.BAD_SIGNATURE, "the invitation signature is invalid")
    return AccessVerdict.allow(AccessBasis.INVITE)


def evaluate_authorization(
    authorization: object,
    *,
    requester: str,
    target_devices: CurrentDevices,
    now: int,
    context: NetworkContext,
) -> AccessVerdict:
    """Parse wire material (or take a parsed one) and evaluate it for ``requester``."""
    try:
        material = (
            authorization
            if isinstance(authorization, ContactGrant | ContactInvite)
            else parse_authorization(authorization)
        )
    except MeshlineError as exc:
        kind = authorization.get("$type") if isinstance(authorization, Mapping) else None
        refusal = (
            Refusal.UNSUPPORTED_TYPE if kind not in (GRANT_TYPE, INVITE_TYPE) else Refusal.MALFORMED
        )
        return AccessVerdict.refuse(refusal, exc.message)
    if isinstance(material, ContactGrant):
        return evaluate_grant(
            material, grantee=requester, grantor_devices=target_devices, now=now, context=context
        )
    return evaluate_invite(material, inviter_devices=target_devices, now=now, context=context)


def public_access(profile: AccountProfile | None) -> AccessVerdict:
    """Public device queries and first contact without material: the profile decides."""
    if profile is not None and profile.public_discovery:
        return AccessVerdict.allow(AccessBasis.PUBLIC)
    return AccessVerdict.refuse(Refusal.NOT_PUBLIC, "the account does not allow public discovery")


def authorize_delivery(
    authorization: object | None,
    *,
    sender: str,
    recipient: str,
    recipient_devices: CurrentDevices,
    recipient_profile: AccountProfile | None,
    now: int,
    context: NetworkContext,
) -> AccessVerdict:
    """Receiving rule 4 of ``message.send``/``message.deliver``: may ``sender`` deliver here?

    ``authorization`` is the params' ``authorization`` value (None when omitted).
    """
    if sender == recipient:
        if authorization is not None:
            return AccessVerdict.refuse(
                Refusal.SELF_DELIVERY, "authorization must be omitted for self-delivery"
            )
        return AccessVerdict.allow(AccessBasis.SELF)
    if recipient_devices.account != recipient:
        raise ValueError("recipient_devices belong to another account")
    if authorization is None:
        return public_access(recipient_profile)
    return evaluate_authorization(
        authorization, requester=sender, target_devices=recipient_devices, now=now, context=context
    )


@dataclass(frozen=True, slots=True)
class SignedStateQuery:
    """The signed ``device.state.resolve`` params (HTTP POST body or WebSocket params)."""

    account: str
    authorization: Authorization
    signer_certificate: DeviceCertificate
    created_at: int
    device_signature: str
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> SignedStateQuery:
        """Structure only; a missing or malformed field is ``bad_request``, never a fallback."""
        obj = object_of(value, "signed device.state.resolve")
        type_field(obj, STATE_QUERY_TYPE)
        no_nulls(obj, "signed device.state.resolve")
        return cls(
            account=str_field(obj, "account"),
            authorization=parse_authorization(obj.get("authorization")),
            signer_certificate=DeviceCertificate.from_wire(obj.get("signer_certificate")),
            created_at=int_field(obj, "created_at", minimum=0),
            device_signature=b64_field(obj, "device_signature", 64),
            extensions=extensions(obj, SIGNED_QUERY_FIELDS | {"account"}),
        )

    def body(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "$type": STATE_QUERY_TYPE,
            "account": self.account,
            "authorization": self.authorization.to_wire(),
            "signer_certificate": self.signer_certificate.to_wire(),
            "created_at": self.created_at,
        }

    def to_wire(self) -> dict[str, Any]:
        return {**self.body(), "device_signature": self.device_signature}

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @property
    def requester(self) -> str:
        return self.signer_certificate.account


def sign_state_query(
    device_keys: DeviceKeys,
    certificate: DeviceCertificate,
    context: NetworkContext,
    *,
    account: str,
    authorization: Authorization,
    created_at: int,
) -> SignedStateQuery:
    """A signed query for ``account``'s device state, carrying a grant or invitation."""
    body = SignedStateQuery(account, authorization, certificate, created_at, "").body()
    signature = device_keys.sign_object(body, context, exclude=())
    return SignedStateQuery.from_wire({**body, "device_signature": signature})


def verify_state_query(
    query: SignedStateQuery,
    *,
    context: NetworkContext,
    now: int,
    max_skew: int,
    max_age: int,
    caller: tuple[str, str] | None = None,
) -> str:
    """The request checks of a signed query; the requesting account.

    ``caller`` is the device session's ``(account, device_id)`` on the connected relay
    (which must be the certificate's device); a destination relay passes None.
    ``created_at`` must lie in ``[now - max_age, now + max_skew]``. Raises
    ``bad_request``, ``invalid_signature`` (certificate or request signature),
    ``forbidden`` (another device's certificate; a query for one's own account),
    ``clock_skew``.
    """
    check_account_id(query.account, context)
    device_id = verify_certificate(query.signer_certificate, context)
    if caller is not None and caller != (query.signer_certificate.account, device_id):
        raise Forbidden("signer_certificate is not the calling device's")
    if query.account == query.requester:
        raise Forbidden("a signed query cannot read one's own account")
    if not now - max_age <= query.created_at <= now + max_skew:
        raise ClockSkew("created_at fails this relay's freshness check")
    data = network_bound_bytes(query.body(), context)
    signature = b64u_decode(query.device_signature, length=64)
    if not device_verify(query.signer_certificate.signing_key_bytes, data, signature):
        raise InvalidSignature("the query signature does not verify")
    return query.requester


def authorize_state_query(
    query: SignedStateQuery, *, target_devices: CurrentDevices, now: int, context: NetworkContext
) -> AccessVerdict:
    """The target relay's decision on a verified signed query: does its material admit the
    requester? (Public discovery plays no part; an invalid grant never becomes public.)"""
    if target_devices.account != query.account:
        raise ValueError("target_devices belong to another account")
    return evaluate_authorization(
        query.authorization,
        requester=query.requester,
        target_devices=target_devices,
        now=now,
        context=context,
    )
