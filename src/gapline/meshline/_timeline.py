"""The Message Timeline Processing Flow, sans I/O.

Feed ``process_page`` one ``message.timeline.sync`` page and what is already
known; get back what to apply, what was refused and why, any retention gap and
the new sync position. Nothing here touches a network or a database, so every
rule is testable with crafted pages.

Two levels of refusal:

- **Page** (``InvalidPage``): the relay broke the response rules (a bad or
  missing certificate, a certificate of another account, duplicate derived
  IDs, sequences not ascending or not after ``after``, ``has_more`` on an
  empty page). Nothing from the page is applied and the position stays.
- **Record** (``RejectedRecord``): one record fails (envelope signature, key
  box for another device, payload that does not authenticate, direction
  rules, invalid business content, an inbound policy refusal). It is never
  applied; it is finished, so the position may pass it.

Deduplication is by ``(from, message_id)`` across relays: the first accepted
copy wins; a later copy with the same envelope is a plain duplicate, one with a
different envelope is a conflict. Neither is applied again.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import x25519

from gapline.meshline._canonical import NetworkContext, parse_json
from gapline.meshline._certificates import DeviceCertificate, verify_certificate
from gapline.meshline._content import (
    BusinessContent,
    DirectMessage,
    UnknownContent,
    parse_content,
)
from gapline.meshline._envelope import (
    MessageEnvelope,
    decrypt_payload,
    envelope_aad,
    verify_envelope,
)
from gapline.meshline._errors import BadRequest, InvalidPage, MeshlineError
from gapline.meshline._fields import extensions, int_field, object_of
from gapline.meshline._keybox import MessageHeader, MessageKeyBox, unwrap_content_key

__all__ = [
    "AcceptAll",
    "AcceptedMessage",
    "Direction",
    "DuplicateRecord",
    "GapState",
    "InboundPolicy",
    "LocalDevice",
    "PageOutcome",
    "PolicyDecision",
    "RejectedRecord",
    "RetentionGap",
    "SyncPage",
    "TimelineEntry",
    "envelope_digest",
    "process_page",
]

_ENTRY_FIELDS = frozenset({"sequence", "envelope", "key_box", "accepted_at"})
_PAGE_FIELDS = frozenset({"items", "certificates", "has_more", "has_retention_gap"})


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """``MessageTimelineEntry``: one record as the calling device sees it."""

    sequence: int
    envelope: MessageEnvelope
    key_box: MessageKeyBox
    accepted_at: int
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> TimelineEntry:
        obj = object_of(value, "MessageTimelineEntry")
        return cls(
            sequence=int_field(obj, "sequence", minimum=0),
            envelope=MessageEnvelope.from_wire(obj.get("envelope")),
            key_box=MessageKeyBox.from_wire(obj.get("key_box")),
            accepted_at=int_field(obj, "accepted_at", minimum=0),
            extensions=extensions(obj, _ENTRY_FIELDS),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.extensions,
            "sequence": self.sequence,
            "envelope": self.envelope.to_wire(),
            "key_box": self.key_box.to_wire(),
            "accepted_at": self.accepted_at,
        }


@dataclass(frozen=True, slots=True)
class SyncPage:
    """The ``message.timeline.sync`` result."""

    items: tuple[TimelineEntry, ...]
    certificates: tuple[DeviceCertificate, ...]
    has_more: bool
    has_retention_gap: bool = False
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> SyncPage:
        obj = object_of(value, "message.timeline.sync result")
        items, certs = obj.get("items"), obj.get("certificates")
        if not isinstance(items, list) or not isinstance(certs, list):
            raise BadRequest("sync result needs items and certificates arrays")
        has_more = obj.get("has_more")
        gap = obj.get("has_retention_gap", False)
        if not isinstance(has_more, bool) or not isinstance(gap, bool):
            raise BadRequest("has_more / has_retention_gap must be booleans")
        return cls(
            items=tuple(TimelineEntry.from_wire(i) for i in items),
            certificates=tuple(DeviceCertificate.from_wire(c) for c in certs),
            has_more=has_more,
            has_retention_gap=gap,
            extensions=extensions(obj, _PAGE_FIELDS),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> SyncPage:
        return cls.from_wire(parse_json(data))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            **self.extensions,
            "items": [i.to_wire() for i in self.items],
            "certificates": [c.to_wire() for c in self.certificates],
            "has_more": self.has_more,
        }
        if self.has_retention_gap:
            wire["has_retention_gap"] = True
        return wire


@dataclass(frozen=True, slots=True)
class LocalDevice:
    """Who is syncing: the account, this device's ID and its X25519 private key."""

    context: NetworkContext
    account: str
    device_id: str
    encryption_key: x25519.X25519PrivateKey = field(repr=False)


class Direction(enum.Enum):
    INBOUND = "inbound"  # from another account to us
    OUTBOUND = "outbound"  # a sent record: from us to another account (sender boxes)
    SELF = "self"  # account self-delivery


class GapState(enum.Enum):
    """In the history engine's vocabulary, a retention gap is ``Unavailable``: never fillable."""

    UNAVAILABLE = "Unavailable"


@dataclass(frozen=True, slots=True)
class RetentionGap:
    """Records after ``after`` on this relay that were visible to this device have expired."""

    account: str
    relay_id: str
    after: int
    #: The first sequence still readable after the gap, when the page had one.
    before: int | None
    state: GapState = GapState.UNAVAILABLE


@dataclass(frozen=True, slots=True)
class AcceptedMessage:
    relay_id: str
    sequence: int
    accepted_at: int
    direction: Direction
    envelope: MessageEnvelope
    content: BusinessContent
    plaintext: bytes = field(repr=False)
    digest: str

    @property
    def key(self) -> tuple[str, str]:
        return self.envelope.key

    @property
    def text(self) -> str | None:
        """The body text of a direct message, for display; None otherwise."""
        content = self.content
        if isinstance(content, DirectMessage) and content.body is not None:
            return content.body.text
        return None

    @property
    def applicable(self) -> bool:
        """False for unknown ``$type`` content: saved, but drives no state change."""
        return not isinstance(self.content, UnknownContent)


@dataclass(frozen=True, slots=True)
class RejectedRecord:
    sequence: int
    key: tuple[str, str]
    error: MeshlineError


@dataclass(frozen=True, slots=True)
class DuplicateRecord:
    sequence: int
    key: tuple[str, str]
    #: True when the earlier accepted copy has a different envelope (never applied).
    conflict: bool


class PolicyDecision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    #: A dependency (e.g. the sender's contact state) is not available yet: stop here.
    DEFER = "defer"


class InboundPolicy(Protocol):
    """Sender-relationship check for content from other accounts (contacts are the caller's)."""

    def decide(self, sender: str, content: BusinessContent) -> PolicyDecision: ...


class AcceptAll:
    """Accept every authenticated sender: for deployments without a contact model."""

    def decide(self, sender: str, content: BusinessContent) -> PolicyDecision:
        return PolicyDecision.ALLOW


@dataclass(frozen=True, slots=True)
class PageOutcome:
    """Results in sequence order; ``position`` is the new sync position."""

    accepted: tuple[AcceptedMessage, ...]
    duplicates: tuple[DuplicateRecord, ...]
    rejected: tuple[RejectedRecord, ...]
    gap: RetentionGap | None
    position: int
    #: True if processing stopped at a deferred record (do not loop on has_more).
    stalled: bool = False


def envelope_digest(envelope: MessageEnvelope) -> str:
    return "sha256:" + hashlib.sha256(envelope.to_json()).hexdigest()


_SELF_ALLOWED = (DirectMessage, UnknownContent)
_CERT_CACHE: dict[tuple[str, bytes], str] = {}


def _certificate_id(cert: DeviceCertificate, context: NetworkContext) -> str:
    """verify_certificate with a small cache: pages repeat the same senders."""
    key = (str(context), cert.to_json())
    cached = _CERT_CACHE.get(key)
    if cached is None:
        cached = verify_certificate(cert, context)
        if len(_CERT_CACHE) > 4096:
            _CERT_CACHE.clear()
        _CERT_CACHE[key] = cached
    return cached


def _check_page(
    page: SyncPage, after: int, context: NetworkContext
) -> dict[str, DeviceCertificate]:
    if not page.items and page.has_more:
        raise InvalidPage("an empty page must not claim has_more")
    last = after
    for item in page.items:
        if item.sequence <= last:
            raise InvalidPage(f"sequence {item.sequence} is not ascending after {last}")
        last = item.sequence
    by_id: dict[str, DeviceCertificate] = {}
    for cert in page.certificates:
        try:
            device_id = _certificate_id(cert, context)
        except MeshlineError as exc:
            raise InvalidPage(f"page certificate does not verify: {exc.message}") from exc
        if device_id in by_id:
            raise InvalidPage(f"two page certificates derive {device_id}")
        by_id[device_id] = cert
    for item in page.items:
        cert = by_id.get(item.envelope.from_device_id)
        if cert is None:
            raise InvalidPage(f"no certificate for sending device {item.envelope.from_device_id}")
        if cert.account != item.envelope.from_:
            raise InvalidPage(
                f"certificate for {item.envelope.from_device_id} belongs to another account"
            )
    return by_id


def process_page(
    page: SyncPage,
    *,
    local: LocalDevice,
    relay_id: str,
    after: int,
    known: Callable[[tuple[str, str]], str | None],
    policy: InboundPolicy | None = None,
) -> PageOutcome:
    """Run the processing flow over one page requested with ``after``.

    ``known(key)`` returns the envelope digest of an already accepted message
    with that ``(from, message_id)`` (from any relay), or None.
    Raises ``InvalidPage`` when nothing of the page may be applied.
    """
    policy = AcceptAll() if policy is None else policy
    context = local.context
    certs = _check_page(page, after, context)
    accepted: list[AcceptedMessage] = []
    duplicates: list[DuplicateRecord] = []
    rejected: list[RejectedRecord] = []
    seen: dict[tuple[str, str], str] = {}
    position = after
    stalled = False
    for item in page.items:
        envelope = item.envelope
        key = envelope.key
        try:
            direction, box_account = _direction(envelope, local.account)
            verify_envelope(envelope, certs[envelope.from_device_id].signing_key_bytes, context)
            digest = envelope_digest(envelope)
            earlier = seen.get(key) or known(key)
            if earlier is not None:
                duplicates.append(DuplicateRecord(item.sequence, key, conflict=earlier != digest))
                position = item.sequence
                continue
            if item.key_box.device_id != local.device_id:
                raise BadRequest("key box is for another device")
            content_key = unwrap_content_key(
                item.key_box,
                MessageHeader.of(envelope),
                account=box_account,
                encryption_key=local.encryption_key,
                context=context,
            )
            plaintext = decrypt_payload(
                envelope.payload, content_key, envelope_aad(envelope, context)
            )
            content = parse_content(plaintext)
            if direction is Direction.SELF and not isinstance(content, _SELF_ALLOWED):
                raise BadRequest(f"{type(content).__name__} is not allowed in self-delivery")
            if direction is Direction.INBOUND:
                decision = policy.decide(envelope.from_, content)
                if decision is PolicyDecision.DEFER:
                    stalled = True
                    break
                if decision is PolicyDecision.DENY:
                    raise BadRequest("sender is not authorised for this content")
        except MeshlineError as exc:
            rejected.append(RejectedRecord(item.sequence, key, exc))
            position = item.sequence
            continue
        seen[key] = digest
        accepted.append(
            AcceptedMessage(
                relay_id=relay_id,
                sequence=item.sequence,
                accepted_at=item.accepted_at,
                direction=direction,
                envelope=envelope,
                content=content,
                plaintext=plaintext,
                digest=digest,
            )
        )
        position = item.sequence
    gap = None
    if page.has_retention_gap:
        first = page.items[0].sequence if page.items else None
        gap = RetentionGap(local.account, relay_id, after, first)
    return PageOutcome(tuple(accepted), tuple(duplicates), tuple(rejected), gap, position, stalled)


def _direction(envelope: MessageEnvelope, account: str) -> tuple[Direction, str]:
    """Direction and the account the box was sealed for; refuses records not ours."""
    if envelope.from_ == account and envelope.to == account:
        return Direction.SELF, account
    if envelope.from_ == account:
        return Direction.OUTBOUND, account
    if envelope.to == account:
        return Direction.INBOUND, account
    raise BadRequest("record neither from nor to the local account")
