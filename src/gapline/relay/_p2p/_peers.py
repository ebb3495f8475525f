"""Whom a relay believes: the Registry seam and the handshake descriptor check.

A peer is believed only when the descriptor it sent inside the Noise handshake is its
Registry-active relay's, self-signed, unexpired, lists at least one libp2p TCP address,
and every such address names the Peer ID the handshake proved. The on-chain Registry is
out of reach here; ``Registry`` is the one seam its lookups pass through, and
``FileRegistry`` serves it from a local file of signed records (docs/relay.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gapline.meshline import (
    AccountKey,
    BadRequest,
    InvalidSignature,
    NetworkContext,
    RelayDescriptor,
    account_verify,
    b64u_decode,
    check_relay_id,
    network_bound_bytes,
    parse_json,
    relay_id_from_public_key,
    verify_relay_descriptor,
)
from gapline.relay._p2p._multiaddr import TcpAddr

__all__ = [
    "REGISTRY_ENTRY_TYPE",
    "FileRegistry",
    "Registry",
    "RegistryEntry",
    "libp2p_addrs",
    "sign_registry_entry",
    "verify_peer_descriptor",
]

REGISTRY_ENTRY_TYPE = "gapline.registry.entry"


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    relay_id: str
    public_key: str
    status: str  # "active" or anything else (then the relay is not eligible)
    url: str


class Registry(Protocol):
    def entry(self, relay_id: str) -> RegistryEntry | None: ...

    def entries(self) -> list[RegistryEntry]: ...


def sign_registry_entry(
    key: AccountKey, url: str, context: NetworkContext, status: str = "active"
) -> dict[str, Any]:
    """A relay's own record for a registry file: it signs what it claims."""
    body: dict[str, Any] = {
        "$type": REGISTRY_ENTRY_TYPE,
        "relay_id": key.relay_id(),
        "public_key": key.public_key_b64,
        "status": status,
        "url": url,
    }
    body["relay_signature"] = key.sign_object(body, context, exclude=())
    return body


def _entry(value: Mapping[str, Any], context: NetworkContext) -> RegistryEntry:
    if value.get("$type") != REGISTRY_ENTRY_TYPE:
        raise BadRequest("not a registry entry")
    body = {k: v for k, v in value.items() if k != "relay_signature"}
    key = b64u_decode(str(value.get("public_key", "")), length=33)
    relay_id = check_relay_id(value.get("relay_id"))
    if relay_id_from_public_key(key) != relay_id:
        raise InvalidSignature("registry entry key does not derive its relay_id")
    signature = b64u_decode(str(value.get("relay_signature", "")), length=64)
    if not account_verify(key, network_bound_bytes(body, context), signature):
        raise InvalidSignature("registry entry signature does not verify")
    status, url = value.get("status"), value.get("url")
    if not isinstance(status, str) or not isinstance(url, str):
        raise BadRequest("registry entry needs status and url strings")
    return RegistryEntry(relay_id, str(value["public_key"]), status, url)


class FileRegistry:
    """Registry records from a JSON file ``{"entries": [signed entry, ...]}``.

    Re-read when the file changes, so an operator can add a relay without a restart. A
    record that fails its signature makes the whole file refused: a half-trusted
    registry is worse than a missing one.
    """

    def __init__(self, path: Path, context: NetworkContext) -> None:
        self._path, self._context = path, context
        self._stamp: tuple[int, int] | None = None
        self._entries: dict[str, RegistryEntry] = {}

    def _load(self) -> None:
        stat = self._path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        data = parse_json(self._path.read_bytes())
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise BadRequest('registry file must be {"entries": [...]}')
        entries = [_entry(v, self._context) for v in data["entries"]]
        self._entries = {e.relay_id: e for e in entries}
        self._stamp = stamp

    def entry(self, relay_id: str) -> RegistryEntry | None:
        self._load()
        return self._entries.get(relay_id)

    def entries(self) -> list[RegistryEntry]:
        self._load()
        return list(self._entries.values())

    @staticmethod
    def write(path: Path, entries: list[dict[str, Any]]) -> None:
        path.write_text(json.dumps({"entries": entries}, indent=1, sort_keys=True))


def libp2p_addrs(endpoints: tuple[str, ...]) -> list[TcpAddr]:
    """The descriptor's libp2p TCP addresses; a malformed one invalidates the descriptor."""
    out = []
    for endpoint in endpoints:
        if endpoint.startswith("/") and "/tcp/" in endpoint:
            addr = TcpAddr.parse(endpoint)
            if addr.peer_id is None:
                raise BadRequest("a libp2p endpoint must carry /p2p/<peer id>")
            out.append(addr)
    return out


def verify_peer_descriptor(
    peer_id: bytes,
    raw: bytes,
    *,
    registry: Registry,
    context: NetworkContext,
    now: Callable[[], int],
) -> tuple[str, RelayDescriptor]:
    """The relay a handshake descriptor proves, or an exception saying why not."""
    descriptor = RelayDescriptor.from_wire(parse_json(raw))
    entry = registry.entry(descriptor.relay_id)
    if entry is None or entry.status != "active":
        raise InvalidSignature("the relay has no active registry record")
    if entry.public_key != descriptor.public_key:
        raise InvalidSignature("descriptor key differs from the registry record")
    verify_relay_descriptor(descriptor, context, relay_id=descriptor.relay_id, now=now())
    addrs = libp2p_addrs(descriptor.endpoints)
    if not addrs:
        raise BadRequest("the descriptor lists no libp2p TCP address")
    if any(a.peer_id != peer_id for a in addrs):
        raise InvalidSignature("the descriptor's Peer ID is not the handshake's")
    return descriptor.relay_id, descriptor
