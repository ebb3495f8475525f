"""``DeviceCertificate`` and ``AccountDeviceState``: issuing and verifying.

Certificates are signed device first (input drops both signatures), then
account (input drops only ``account_signature``, so it covers the device
signature). A certificate with valid signatures proves identity, not current
authority: that needs the account's current device state and the validity
window (``is_valid_at``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import (
    NetworkContext,
    canonical_json,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._errors import BadRequest, InvalidSignature, RequestTooLarge
from gapline.meshline._fields import (
    b64_field,
    extensions,
    int_field,
    object_of,
    str_field,
    type_field,
)
from gapline.meshline._identity import AccountKey, DeviceKeys, account_verify, device_verify
from gapline.meshline._ids import check_account_id, derive_device_id, neo_account_id

__all__ = [
    "CERTIFICATE_MAX_BYTES",
    "CERTIFICATE_MAX_LIFETIME",
    "DEVICE_STATE_MAX_BYTES",
    "DEVICE_STATE_MAX_CERTIFICATES",
    "AccountDeviceState",
    "CurrentDevices",
    "DeviceCertificate",
    "issue_certificate",
    "sign_device_state",
    "verify_certificate",
    "verify_device_state",
]

CERTIFICATE_TYPE = "meshline.device.certificate"
DEVICE_STATE_TYPE = "meshline.account.device.state"
CERTIFICATE_MAX_BYTES = 4096
CERTIFICATE_MAX_LIFETIME = 720 * 86400
DEVICE_STATE_MAX_BYTES = 131072
DEVICE_STATE_MAX_CERTIFICATES = 8

_CERT_FIELDS = frozenset(
    {
        "$type",
        "account",
        "account_public_key",
        "signing_public_key",
        "encryption_public_key",
        "not_before",
        "expires_at",
        "device_signature",
        "account_signature",
    }
)
_STATE_FIELDS = frozenset(
    {"$type", "account", "account_public_key", "revision", "certificates", "account_signature"}
)


@dataclass(frozen=True, slots=True)
class DeviceCertificate:
    """A device certificate as transmitted (binary fields kept as base64url text)."""

    account: str
    account_public_key: str
    signing_public_key: str
    encryption_public_key: str
    not_before: int
    expires_at: int
    device_signature: str
    account_signature: str
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "$type": CERTIFICATE_TYPE,
            "account": self.account,
            "account_public_key": self.account_public_key,
            "signing_public_key": self.signing_public_key,
            "encryption_public_key": self.encryption_public_key,
            "not_before": self.not_before,
            "expires_at": self.expires_at,
            "device_signature": self.device_signature,
            "account_signature": self.account_signature,
        }

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @classmethod
    def from_wire(cls, value: object) -> DeviceCertificate:
        """Structural parse: types, base64url lengths. Signatures: see ``verify_certificate``."""
        obj = object_of(value, "DeviceCertificate")
        type_field(obj, CERTIFICATE_TYPE)
        return cls(
            account=str_field(obj, "account"),
            account_public_key=b64_field(obj, "account_public_key", 33),
            signing_public_key=b64_field(obj, "signing_public_key", 32),
            encryption_public_key=b64_field(obj, "encryption_public_key", 32),
            not_before=int_field(obj, "not_before"),
            expires_at=int_field(obj, "expires_at"),
            device_signature=b64_field(obj, "device_signature", 64),
            account_signature=b64_field(obj, "account_signature", 64),
            extensions=extensions(obj, _CERT_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> DeviceCertificate:
        return cls.from_wire(parse_json(data))

    def device_id(self, context: NetworkContext) -> str:
        return derive_device_id(
            self.account, self.signing_public_key, self.encryption_public_key, context
        )

    @property
    def signing_key_bytes(self) -> bytes:
        return b64u_decode(self.signing_public_key, length=32)

    @property
    def encryption_key_bytes(self) -> bytes:
        return b64u_decode(self.encryption_public_key, length=32)

    def is_valid_at(self, now: int) -> bool:
        """The validity-window half of "currently valid" (the other half is device state)."""
        return self.not_before <= now < self.expires_at


def issue_certificate(
    account_key: AccountKey,
    device_keys: DeviceKeys,
    context: NetworkContext,
    *,
    not_before: int,
    expires_at: int,
) -> DeviceCertificate:
    """Sign a certificate: the device first, then the account over the result."""
    if not not_before < expires_at <= not_before + CERTIFICATE_MAX_LIFETIME:
        raise BadRequest("certificate window must be non-empty and at most 720 days")
    body: dict[str, Any] = {
        "$type": CERTIFICATE_TYPE,
        "account": account_key.account_id(context),
        "account_public_key": account_key.public_key_b64,
        "signing_public_key": b64u_encode(device_keys.signing_public_key),
        "encryption_public_key": b64u_encode(device_keys.encryption_public_key),
        "not_before": not_before,
        "expires_at": expires_at,
    }
    body["device_signature"] = device_keys.sign_object(body, context, exclude=())
    body["account_signature"] = account_key.sign_object(body, context, exclude=())
    return DeviceCertificate.from_wire(body)


def verify_certificate(cert: DeviceCertificate, context: NetworkContext) -> str:
    """Check size, window shape, account binding and both signatures; return the device ID.

    Does not judge current validity (state membership, ``now``): callers that
    need it use the account's device state and ``is_valid_at``.
    """
    wire = cert.to_wire()
    if len(canonical_json(wire)) > CERTIFICATE_MAX_BYTES:
        raise RequestTooLarge("device certificate exceeds 4096 bytes")
    check_account_id(cert.account, context)
    if not cert.not_before < cert.expires_at <= cert.not_before + CERTIFICATE_MAX_LIFETIME:
        raise BadRequest("certificate window must be non-empty and at most 720 days")
    account_key = b64u_decode(cert.account_public_key, length=33, field="account_public_key")
    try:
        derived = neo_account_id(account_key, context)
    except BadRequest:
        raise InvalidSignature("certificate account key is not a compressed P-256 key") from None
    if derived != cert.account:
        raise InvalidSignature("certificate account does not derive from its account key")
    device_input = network_bound_bytes(
        wire, context, exclude=("device_signature", "account_signature")
    )
    if not device_verify(
        cert.signing_key_bytes, device_input, b64u_decode(cert.device_signature, length=64)
    ):
        raise InvalidSignature("certificate device signature does not verify")
    account_input = network_bound_bytes(wire, context, exclude=("account_signature",))
    if not account_verify(
        account_key, account_input, b64u_decode(cert.account_signature, length=64)
    ):
        raise InvalidSignature("certificate account signature does not verify")
    return cert.device_id(context)


@dataclass(frozen=True, slots=True)
class AccountDeviceState:
    """The account-signed, complete set of an account's device certificates."""

    account: str
    account_public_key: str
    revision: int
    certificates: tuple[DeviceCertificate, ...]
    account_signature: str
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "$type": DEVICE_STATE_TYPE,
            "account": self.account,
            "account_public_key": self.account_public_key,
            "revision": self.revision,
            "certificates": [c.to_wire() for c in self.certificates],
            "account_signature": self.account_signature,
        }

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @classmethod
    def from_wire(cls, value: object) -> AccountDeviceState:
        obj = object_of(value, "AccountDeviceState")
        type_field(obj, DEVICE_STATE_TYPE)
        certs = obj.get("certificates")
        if not isinstance(certs, list):
            raise BadRequest("certificates: expected an array")
        return cls(
            account=str_field(obj, "account"),
            account_public_key=b64_field(obj, "account_public_key", 33),
            revision=int_field(obj, "revision", minimum=0),
            certificates=tuple(DeviceCertificate.from_wire(c) for c in certs),
            account_signature=b64_field(obj, "account_signature", 64),
            extensions=extensions(obj, _STATE_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> AccountDeviceState:
        return cls.from_wire(parse_json(data))


def sign_device_state(
    account_key: AccountKey,
    certificates: Sequence[DeviceCertificate],
    context: NetworkContext,
    *,
    revision: int,
) -> AccountDeviceState:
    body: dict[str, Any] = {
        "$type": DEVICE_STATE_TYPE,
        "account": account_key.account_id(context),
        "account_public_key": account_key.public_key_b64,
        "revision": revision,
        "certificates": [c.to_wire() for c in certificates],
    }
    body["account_signature"] = account_key.sign_object(body, context, exclude=())
    state = AccountDeviceState.from_wire(body)
    verify_device_state(state, context)
    return state


def verify_device_state(
    state: AccountDeviceState, context: NetworkContext
) -> dict[str, DeviceCertificate]:
    """Verify the whole state; return its certificates by derived device ID."""
    wire = state.to_wire()
    if len(canonical_json(wire)) > DEVICE_STATE_MAX_BYTES:
        raise RequestTooLarge("account device state exceeds 128 KiB")
    check_account_id(state.account, context)
    if len(state.certificates) > DEVICE_STATE_MAX_CERTIFICATES:
        raise BadRequest("account device state holds more than 8 certificates")
    account_key = b64u_decode(state.account_public_key, length=33, field="account_public_key")
    try:
        derived = neo_account_id(account_key, context)
    except BadRequest:
        raise InvalidSignature("state account key is not a compressed P-256 key") from None
    if derived != state.account:
        raise InvalidSignature("state account does not derive from its account key")
    if not account_verify(
        account_key,
        network_bound_bytes(wire, context, exclude=("account_signature",)),
        b64u_decode(state.account_signature, length=64),
    ):
        raise InvalidSignature("device state account signature does not verify")
    by_id: dict[str, DeviceCertificate] = {}
    for cert in state.certificates:
        if cert.account != state.account:
            raise BadRequest("a certificate in the device state belongs to another account")
        device_id = verify_certificate(cert, context)
        if device_id in by_id:
            raise BadRequest("device state lists one device twice")
        by_id[device_id] = cert
    return by_id


@dataclass(frozen=True, slots=True)
class CurrentDevices:
    """An account's device certificates by device ID, from a device state already verified.

    What grants, invitations and profiles are checked against: a signature counts
    only from a device listed here whose window holds ``now``. ``verified`` checks
    the state first; ``trusted`` is for a state verified when it was accepted (a
    relay's stored authoritative state) and only derives the IDs.
    """

    account: str
    by_id: Mapping[str, DeviceCertificate]

    @classmethod
    def verified(cls, state: AccountDeviceState, context: NetworkContext) -> CurrentDevices:
        return cls(state.account, verify_device_state(state, context))

    @classmethod
    def trusted(cls, state: AccountDeviceState, context: NetworkContext) -> CurrentDevices:
        return cls(state.account, {c.device_id(context): c for c in state.certificates})

    def valid(self, device_id: str, now: int) -> DeviceCertificate | None:
        """The certificate of ``device_id`` if it is currently valid, else None."""
        cert = self.by_id.get(device_id)
        return cert if cert is not None and cert.is_valid_at(now) else None

    def valid_at(self, now: int) -> list[DeviceCertificate]:
        return [c for c in self.by_id.values() if c.is_valid_at(now)]
