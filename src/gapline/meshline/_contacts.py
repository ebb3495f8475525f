"""``ContactGrant`` and ``ContactInvite``: the authorization material of cross-account sends.

A grant's body (everything but ``signatures``) is signed independently by each
authorising device of ``grantor`` (Ed25519 over the network-bound body); a
signature counts only if its device is currently valid in the grantor's
device state. Selection keeps, per ``(context, grantor, grantee)``, the grant
that lasts longest, merging device signatures over identical bodies.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import (
    MAX_SAFE_INTEGER,
    NetworkContext,
    canonical_json,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._certificates import DeviceCertificate, verify_certificate
from gapline.meshline._errors import BadRequest, MeshlineError
from gapline.meshline._fields import (
    b64_field,
    extensions,
    no_nulls,
    object_of,
    str_field,
    type_field,
)
from gapline.meshline._identity import DeviceKeys, device_verify
from gapline.meshline._ids import check_device_id, decode_prefixed

__all__ = [
    "ContactGrant",
    "ContactInvite",
    "GrantAction",
    "issue_grant",
    "issue_invite",
    "select_grant",
    "sign_grant",
    "valid_grant_signers",
    "verify_invite",
]

GRANT_TYPE = "meshline.contact.grant"
INVITE_TYPE = "meshline.contact.invite"
_GRANT_FIELDS = frozenset({"$type", "grantor", "grantee", "expires_at", "signatures"})
_INVITE_FIELDS = frozenset(
    {"$type", "inviter", "signer_device_id", "expires_at", "device_signature"}
)


def _int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise BadRequest(f"{name}: expected a nonnegative safe integer")
    return value


@dataclass(frozen=True, slots=True)
class ContactGrant:
    grantor: str
    grantee: str
    signatures: Mapping[str, str]
    expires_at: int | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> ContactGrant:
        obj = object_of(value, "ContactGrant")
        type_field(obj, GRANT_TYPE)
        sigs = obj.get("signatures")
        if not isinstance(sigs, Mapping) or not sigs:
            raise BadRequest("signatures: expected a nonempty object")
        for device_id, signature in sigs.items():
            check_device_id(device_id, field="signatures key")
            decode_prefixed(device_id, "dev_", 16)
            b64u_decode(signature, length=64, field="signature")
        body = {k: v for k, v in obj.items() if k != "signatures"}
        no_nulls(body, "ContactGrant")
        return cls(
            grantor=str_field(obj, "grantor"),
            grantee=str_field(obj, "grantee"),
            signatures=dict(sigs),
            expires_at=_int(obj["expires_at"], "expires_at") if "expires_at" in obj else None,
            extensions=extensions(obj, _GRANT_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> ContactGrant:
        return cls.from_wire(parse_json(data))

    def body(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            **self.extensions,
            "$type": GRANT_TYPE,
            "grantor": self.grantor,
            "grantee": self.grantee,
        }
        if self.expires_at is not None:
            wire["expires_at"] = self.expires_at
        return wire

    def to_wire(self) -> dict[str, Any]:
        return {**self.body(), "signatures": dict(self.signatures)}

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    def signing_input(self, context: NetworkContext) -> bytes:
        return network_bound_bytes(self.body(), context)

    def is_expired(self, now: int) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def sign_grant(
    grant: ContactGrant, device_keys: DeviceKeys, device_id: str, context: NetworkContext
) -> ContactGrant:
    """Add this device's signature over the grant body."""
    signature = b64u_encode(device_keys.sign(grant.signing_input(context)))
    return ContactGrant(
        grant.grantor,
        grant.grantee,
        {**grant.signatures, device_id: signature},
        grant.expires_at,
        grant.extensions,
    )


def issue_grant(
    device_keys: DeviceKeys,
    device_id: str,
    context: NetworkContext,
    *,
    grantor: str,
    grantee: str,
    expires_at: int | None = None,
    extensions: Mapping[str, Any] | None = None,
) -> ContactGrant:
    """A new grant from ``grantor`` to ``grantee``, signed by one device of ``grantor``."""
    unsigned = ContactGrant(grantor, grantee, {}, expires_at, dict(extensions or {}))
    no_nulls(unsigned.body(), "ContactGrant")
    return sign_grant(unsigned, device_keys, device_id, context)


def valid_grant_signers(
    grant: ContactGrant,
    devices: Mapping[str, DeviceCertificate],
    *,
    now: int,
    context: NetworkContext,
) -> set[str]:
    """Device IDs whose signature verifies with a currently valid ``grantor`` device.

    ``devices`` are the grantor's current devices by ID (from its verified device
    state); each is re-checked: signatures, derived ID, account, validity window.
    """
    data = grant.signing_input(context)
    valid: set[str] = set()
    for device_id, signature in grant.signatures.items():
        cert = devices.get(device_id)
        if cert is None or cert.account != grant.grantor or not cert.is_valid_at(now):
            continue
        try:
            if verify_certificate(cert, context) != device_id:
                continue
        except MeshlineError:
            continue
        if device_verify(cert.signing_key_bytes, data, b64u_decode(signature, length=64)):
            valid.add(device_id)
    return valid


class GrantAction(enum.Enum):
    REPLACE = "replace"
    KEEP = "keep"
    MERGE = "merge"
    INVALID = "invalid"
    OUT_OF_SCOPE = "out_of_scope"


def select_grant(
    current: ContactGrant | None,
    candidate: ContactGrant,
    *,
    devices: Mapping[str, DeviceCertificate],
    now: int,
    context: NetworkContext,
    candidate_context: NetworkContext | None = None,
) -> tuple[GrantAction, ContactGrant | None]:
    """What to do with a received grant; the grant to keep for the scope afterwards."""
    if candidate_context is not None and candidate_context != context:
        return GrantAction.OUT_OF_SCOPE, current
    if current is not None and (candidate.grantor, candidate.grantee) != (
        current.grantor,
        current.grantee,
    ):
        return GrantAction.OUT_OF_SCOPE, current
    if candidate.is_expired(now):
        return GrantAction.INVALID, current
    candidate_valid = valid_grant_signers(candidate, devices, now=now, context=context)
    if not candidate_valid:
        return GrantAction.INVALID, current
    if current is None:
        return GrantAction.REPLACE, _only(candidate, candidate_valid)
    current_valid = valid_grant_signers(current, devices, now=now, context=context)
    if canonical_json(candidate.body()) == canonical_json(current.body()):
        merged = {d: current.signatures[d] for d in current_valid}
        for device_id in candidate_valid - current_valid:
            merged[device_id] = candidate.signatures[device_id]
        return GrantAction.MERGE, ContactGrant(
            current.grantor, current.grantee, merged, current.expires_at, current.extensions
        )
    if current.is_expired(now) or not current_valid or _lasts_longer(candidate, current):
        return GrantAction.REPLACE, _only(candidate, candidate_valid)
    return GrantAction.KEEP, current


def _lasts_longer(a: ContactGrant, b: ContactGrant) -> bool:
    if a.expires_at is None:
        return b.expires_at is not None
    return b.expires_at is not None and a.expires_at > b.expires_at


def _only(grant: ContactGrant, signers: set[str]) -> ContactGrant:
    sigs = {d: s for d, s in grant.signatures.items() if d in signers}
    return ContactGrant(grant.grantor, grant.grantee, sigs, grant.expires_at, grant.extensions)


@dataclass(frozen=True, slots=True)
class ContactInvite:
    inviter: str
    signer_device_id: str
    expires_at: int
    device_signature: str
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> ContactInvite:
        obj = object_of(value, "ContactInvite")
        type_field(obj, INVITE_TYPE)
        no_nulls(obj, "ContactInvite")
        return cls(
            inviter=str_field(obj, "inviter"),
            signer_device_id=check_device_id(obj.get("signer_device_id"), field="signer_device_id"),
            expires_at=_int(obj.get("expires_at"), "expires_at"),
            device_signature=b64_field(obj, "device_signature", 64),
            extensions=extensions(obj, _INVITE_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> ContactInvite:
        return cls.from_wire(parse_json(data))

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    def signing_input(self, context: NetworkContext) -> bytes:
        return network_bound_bytes(self.to_wire(), context, exclude=("device_signature",))

    def is_expired(self, now: int) -> bool:
        return now >= self.expires_at

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "$type": INVITE_TYPE,
            "inviter": self.inviter,
            "signer_device_id": self.signer_device_id,
            "expires_at": self.expires_at,
            "device_signature": self.device_signature,
        }


def verify_invite(
    invite: ContactInvite, signer: DeviceCertificate, *, now: int, context: NetworkContext
) -> bool:
    """Valid iff unexpired and signed by ``signer`` — a currently valid device of the inviter
    whose derived ID is ``signer_device_id`` (the caller takes it from verified device state)."""
    if now >= invite.expires_at or signer.account != invite.inviter:
        return False
    try:
        if verify_certificate(signer, context) != invite.signer_device_id:
            return False
    except MeshlineError:
        return False
    return device_verify(
        signer.signing_key_bytes,
        invite.signing_input(context),
        b64u_decode(invite.device_signature, length=64),
    )


def issue_invite(
    device_keys: DeviceKeys,
    device_id: str,
    context: NetworkContext,
    *,
    inviter: str,
    expires_at: int,
    extensions: Mapping[str, Any] | None = None,
) -> ContactInvite:
    """An invitation to contact ``inviter``, signed by its device ``device_id``."""
    body: dict[str, Any] = {
        **(extensions or {}),
        "$type": INVITE_TYPE,
        "inviter": inviter,
        "signer_device_id": device_id,
        "expires_at": expires_at,
    }
    signature = device_keys.sign_object(body, context, exclude=())
    return ContactInvite.from_wire({**body, "device_signature": signature})
