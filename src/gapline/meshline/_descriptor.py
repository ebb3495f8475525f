"""``RelayDescriptor``: a relay's self-signed key and endpoints.

What a client checks a relay's signatures against (a route's ``relay_signature``):
``public_key`` must derive ``relay_id`` and sign the descriptor, which must not
have expired. Endpoint syntax (and the libp2p address a public relay lists) is
the federation work's; here the endpoints need only be a nonempty list of
distinct strings, because a standalone relay has no libp2p listener.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gapline.meshline._base64 import b64u_decode
from gapline.meshline._canonical import NetworkContext, canonical_json, network_bound_bytes
from gapline.meshline._errors import BadRequest, InvalidSignature
from gapline.meshline._fields import b64_field, extensions, int_field, object_of, type_field
from gapline.meshline._identity import AccountKey, account_verify
from gapline.meshline._ids import check_relay_id, relay_id_from_public_key

__all__ = ["RelayDescriptor", "sign_relay_descriptor", "verify_relay_descriptor"]

DESCRIPTOR_TYPE = "meshline.relay.descriptor"
_FIELDS = frozenset(
    {
        "$type",
        "relay_id",
        "public_key",
        "endpoints",
        "capabilities",
        "expires_at",
        "relay_signature",
    }
)


def _strings(obj: Mapping[str, Any], name: str, *, nonempty: bool) -> tuple[str, ...]:
    value = obj.get(name)
    if not isinstance(value, list) or (nonempty and not value):
        raise BadRequest(f"{name}: expected a{' nonempty' if nonempty else 'n'} array")
    if not all(isinstance(v, str) and v for v in value) or len(set(value)) != len(value):
        raise BadRequest(f"{name}: expected distinct nonempty strings")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class RelayDescriptor:
    relay_id: str
    public_key: str
    endpoints: tuple[str, ...]
    expires_at: int
    relay_signature: str
    capabilities: tuple[str, ...] | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> RelayDescriptor:
        obj = object_of(value, "RelayDescriptor")
        type_field(obj, DESCRIPTOR_TYPE)
        capabilities = None
        if "capabilities" in obj:
            capabilities = _strings(obj, "capabilities", nonempty=False)
            if len(capabilities) > 64 or any(len(c.encode()) > 128 for c in capabilities):
                raise BadRequest("capabilities: at most 64 of at most 128 bytes each")
        return cls(
            relay_id=check_relay_id(obj.get("relay_id")),
            public_key=b64_field(obj, "public_key", 33),
            endpoints=_strings(obj, "endpoints", nonempty=True),
            expires_at=int_field(obj, "expires_at", minimum=0),
            relay_signature=b64_field(obj, "relay_signature", 64),
            capabilities=capabilities,
            extensions=extensions(obj, _FIELDS),
        )

    def body(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            **self.extensions,
            "$type": DESCRIPTOR_TYPE,
            "relay_id": self.relay_id,
            "public_key": self.public_key,
            "endpoints": list(self.endpoints),
            "expires_at": self.expires_at,
        }
        if self.capabilities is not None:
            wire["capabilities"] = list(self.capabilities)
        return wire

    def to_wire(self) -> dict[str, Any]:
        return {**self.body(), "relay_signature": self.relay_signature}

    def to_json(self) -> bytes:
        return canonical_json(self.to_wire())

    @property
    def public_key_bytes(self) -> bytes:
        return b64u_decode(self.public_key, length=33)


def sign_relay_descriptor(
    relay_key: AccountKey,
    context: NetworkContext,
    *,
    endpoints: Sequence[str],
    expires_at: int,
    capabilities: Sequence[str] | None = None,
) -> RelayDescriptor:
    body: dict[str, Any] = {
        "$type": DESCRIPTOR_TYPE,
        "relay_id": relay_key.relay_id(),
        "public_key": relay_key.public_key_b64,
        "endpoints": list(endpoints),
        "expires_at": expires_at,
    }
    if capabilities is not None:
        body["capabilities"] = list(capabilities)
    signature = relay_key.sign_object(body, context, exclude=())
    return RelayDescriptor.from_wire({**body, "relay_signature": signature})


def verify_relay_descriptor(
    descriptor: RelayDescriptor, context: NetworkContext, *, relay_id: str, now: int
) -> bytes:
    """The relay's 33-byte public key, once the descriptor is ``relay_id``'s, current and
    self-signed. (Without a Registry, ``relay_id`` is the pinned one; see docs.)"""
    if descriptor.relay_id != relay_id:
        raise InvalidSignature("the descriptor belongs to another relay")
    if now >= descriptor.expires_at:
        raise BadRequest("the relay descriptor has expired")
    key = descriptor.public_key_bytes
    try:
        derived = relay_id_from_public_key(key)
    except BadRequest:
        raise InvalidSignature("relay key is not a compressed P-256 key") from None
    if derived != relay_id:
        raise InvalidSignature("the descriptor key does not derive its relay_id")
    data = network_bound_bytes(descriptor.body(), context)
    if not account_verify(key, data, b64u_decode(descriptor.relay_signature, length=64)):
        raise InvalidSignature("relay descriptor signature does not verify")
    return key
