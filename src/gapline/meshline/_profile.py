"""``AccountProfile``: the device-signed public profile, and the checks around it.

One device of the account signs the profile (Ed25519 over the network-bound profile
minus ``device_signature``). The profile names no device, so a reader verifies it
with the ``signer_certificate`` that ``profile.resolve`` returns beside it: the
certificate the home relay checked at publication. ``public_discovery`` is what
opens the account's device set and a first contact to accounts without a grant or
invitation; a stored profile stays current after its signing device leaves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline._base64 import b64u_decode
from gapline.meshline._canonical import (
    NetworkContext,
    canonical_json,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._certificates import DeviceCertificate, verify_certificate
from gapline.meshline._content import ContentReference, is_whitespace_only, parse_media_type
from gapline.meshline._errors import (
    BadRequest,
    ClockSkew,
    DeviceUnknown,
    Forbidden,
    InvalidSignature,
    RequestTooLarge,
    StaleState,
)
from gapline.meshline._fields import (
    b64_field,
    bool_field,
    extensions,
    int_field,
    no_nulls,
    object_of,
    str_field,
    type_field,
)
from gapline.meshline._identity import DeviceKeys, device_verify
from gapline.meshline._ids import check_account_id

__all__ = [
    "PROFILE_MAX_BYTES",
    "AccountProfile",
    "ResolvedProfile",
    "check_profile_publish",
    "sign_profile",
    "verify_profile",
    "verify_resolved_profile",
]

PROFILE_TYPE = "meshline.profile"
PROFILE_MAX_BYTES = 8192
NICKNAME_MAX_BYTES = 256
BIO_MAX_BYTES = 2048
_FIELDS = frozenset(
    {
        "$type",
        "account",
        "nickname",
        "avatar",
        "bio",
        "public_discovery",
        "updated_at",
        "device_signature",
    }
)


def _text(obj: Mapping[str, Any], name: str, limit: int) -> str | None:
    """An optional user text: absent, empty, or holding a non-whitespace character."""
    if name not in obj:
        return None
    value = str_field(obj, name)
    if value and is_whitespace_only(value):
        raise BadRequest(f"{name}: must not be whitespace only")
    if len(value.encode("utf-8")) > limit:
        raise BadRequest(f"{name}: longer than {limit} UTF-8 bytes")
    return value


@dataclass(frozen=True, slots=True)
class AccountProfile:
    account: str
    public_discovery: bool
    updated_at: int
    device_signature: str
    nickname: str | None = None
    avatar: ContentReference | None = None
    bio: str | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> AccountProfile:
        """Size first (``request_too_large`` whatever else is wrong), then every field rule."""
        obj = object_of(value, "AccountProfile")
        if len(canonical_json(obj)) > PROFILE_MAX_BYTES:
            raise RequestTooLarge(f"profile exceeds {PROFILE_MAX_BYTES} canonical bytes")
        type_field(obj, PROFILE_TYPE)
        no_nulls(obj, "AccountProfile")
        avatar = None
        if "avatar" in obj:
            avatar = ContentReference.from_wire(obj["avatar"])
            if not parse_media_type(avatar.content_type)[0].startswith("image/"):
                raise BadRequest("avatar: content_type must be an image media type")
        return cls(
            account=str_field(obj, "account"),
            public_discovery=bool_field(obj, "public_discovery"),
            updated_at=int_field(obj, "updated_at", minimum=0),
            device_signature=b64_field(obj, "device_signature", 64),
            nickname=_text(obj, "nickname", NICKNAME_MAX_BYTES),
            avatar=avatar,
            bio=_text(obj, "bio", BIO_MAX_BYTES),
            extensions=extensions(obj, _FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> AccountProfile:
        return cls.from_wire(parse_json(data))

    def body(self) -> dict[str, Any]:
        """The signed part: everything but ``device_signature``."""
        wire: dict[str, Any] = {
            **self.extensions,
            "$type": PROFILE_TYPE,
            "account": self.account,
            "public_discovery": self.public_discovery,
            "updated_at": self.updated_at,
        }
        if self.nickname is not None:
            wire["nickname"] = self.nickname
        if self.avatar is not None:
            wire["avatar"] = self.avatar.to_wire()
        if self.bio is not None:
            wire["bio"] = self.bio
        return wire

    def to_wire(self) -> dict[str, Any]:
        return {**self.body(), "device_signature": self.device_signature}

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    def signing_input(self, context: NetworkContext) -> bytes:
        return network_bound_bytes(self.body(), context)


def sign_profile(
    device_keys: DeviceKeys,
    account: str,
    context: NetworkContext,
    *,
    public_discovery: bool,
    updated_at: int | None = None,
    nickname: str | None = None,
    avatar: ContentReference | None = None,
    bio: str | None = None,
    extensions: Mapping[str, Any] | None = None,
) -> AccountProfile:
    """A profile signed by this device; every object rule is checked on the result."""
    unsigned = AccountProfile(
        account=account,
        public_discovery=public_discovery,
        updated_at=int(time.time()) if updated_at is None else updated_at,
        device_signature="",
        nickname=nickname,
        avatar=avatar,
        bio=bio,
        extensions=dict(extensions or {}),
    )
    body = unsigned.body()
    return AccountProfile.from_wire(
        {**body, "device_signature": device_keys.sign_object(body, context, exclude=())}
    )


def verify_profile(
    profile: AccountProfile, signer: DeviceCertificate, context: NetworkContext
) -> None:
    """The account belongs to this network and ``signer`` (of that account) signed it.

    ``signer``'s own signatures are the caller's to check (``verify_certificate``);
    a relay checked them when it authenticated the device.
    """
    check_account_id(profile.account, context)
    if signer.account != profile.account:
        raise InvalidSignature("the signer certificate belongs to another account")
    signature = b64u_decode(profile.device_signature, length=64)
    if not device_verify(signer.signing_key_bytes, profile.signing_input(context), signature):
        raise InvalidSignature("profile device signature does not verify")


def check_profile_publish(
    profile: AccountProfile,
    *,
    account: str,
    signer: DeviceCertificate,
    context: NetworkContext,
    now: int,
    max_skew: int,
    current_updated_at: int | None,
) -> None:
    """What a home relay checks before storing a ``profile.publish`` (raises; store nothing).

    ``account`` and ``signer`` come from the device session (the calling device's
    certificate, current in the account's device state); ``current_updated_at`` is
    the stored profile's, or None. Sizes and field rules were checked by parsing.
    Equal ``updated_at`` passes: the later accepted profile replaces the earlier.
    """
    if profile.account != account:
        raise Forbidden("the profile belongs to another account than the session's")
    if not signer.is_valid_at(now):
        raise DeviceUnknown("the signing device is not currently valid")
    if profile.updated_at > now + max_skew:
        raise ClockSkew("profile updated_at is beyond this relay's clock tolerance")
    verify_profile(profile, signer, context)
    if current_updated_at is not None and profile.updated_at < current_updated_at:
        raise StaleState("a more recent profile is stored")


@dataclass(frozen=True, slots=True)
class ResolvedProfile:
    """The ``profile.resolve`` result: the profile and the certificate that verified it."""

    profile: AccountProfile
    signer_certificate: DeviceCertificate
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> ResolvedProfile:
        obj = object_of(value, "profile.resolve result")
        return cls(
            AccountProfile.from_wire(obj.get("profile")),
            DeviceCertificate.from_wire(obj.get("signer_certificate")),
            extensions(obj, frozenset({"profile", "signer_certificate"})),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "profile": self.profile.to_wire(),
            "signer_certificate": self.signer_certificate.to_wire(),
        }


def verify_resolved_profile(
    result: ResolvedProfile, *, account: str, context: NetworkContext
) -> AccountProfile:
    """A reader's checks: the profile is ``account``'s and its certificate and signature verify.

    The certificate need not be current: it was checked at publication.
    """
    if result.profile.account != account:
        raise InvalidSignature("the relay returned another account's profile")
    verify_certificate(result.signer_certificate, context)
    verify_profile(result.profile, result.signer_certificate, context)
    return result.profile
