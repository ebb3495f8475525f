"""The values of interactive verification: what arrives, what to send, where a flow is."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from gapline.matrix import ClientEvent, Request, ToDeviceEvent, api

from ._sas import ShortString
from ._types import DecryptedEvent, DecryptedToDevice

__all__ = [
    "CancelCode",
    "VerificationEvent",
    "VerificationMessage",
    "VerificationState",
    "VerificationStatus",
]

PREFIX = "m.key.verification."


class CancelCode(enum.StrEnum):
    """The spec's ``m.key.verification.cancel`` codes."""

    USER = "m.user"
    TIMEOUT = "m.timeout"
    UNKNOWN_TRANSACTION = "m.unknown_transaction"
    UNKNOWN_METHOD = "m.unknown_method"
    UNEXPECTED_MESSAGE = "m.unexpected_message"
    KEY_MISMATCH = "m.key_mismatch"
    USER_MISMATCH = "m.user_mismatch"
    INVALID_MESSAGE = "m.invalid_message"
    ACCEPTED = "m.accepted"
    MISMATCHED_COMMITMENT = "m.mismatched_commitment"
    MISMATCHED_SAS = "m.mismatched_sas"


class VerificationState(enum.StrEnum):
    REQUESTED = "requested"  # a request sent or received, not answered yet
    READY = "ready"  # both sides ready; a start may be sent
    STARTED = "started"  # a start sent or received, not accepted yet
    ACCEPTED = "accepted"  # the method agreed, the keys not yet exchanged
    SHOW_SAS = "show_sas"  # keys exchanged: show `ShortString`, ask the person to compare
    CONFIRMED = "confirmed"  # we confirmed; waiting for the other side's MAC or done
    DONE = "done"  # both MACs checked: verified
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class VerificationEvent:
    """One received ``m.key.verification.*`` event, from to-device or a room.

    ``sender`` is the homeserver's; ``sender_device`` is set only when Olm proved it."""

    sender: str
    type: str
    content: dict[str, Any] = field(repr=False)
    room_id: str | None = None
    event_id: str | None = None
    sender_device: str | None = None
    origin_server_ts: int | None = None

    @classmethod
    def from_to_device(cls, event: ToDeviceEvent | DecryptedToDevice) -> VerificationEvent:
        device = event.sender_device if isinstance(event, DecryptedToDevice) else None
        return cls(event.sender, event.type, dict(event.content), sender_device=device)

    @classmethod
    def from_room(
        cls, room_id: str, event: ClientEvent, decrypted: DecryptedEvent | None = None
    ) -> VerificationEvent:
        """A room event, or (``decrypted``) what an encrypted one decrypted to."""
        kind, content = (event.type, event.content) if decrypted is None else (
            decrypted.type, decrypted.content)  # fmt: skip
        return cls(event.sender, kind, dict(content), room_id, event.event_id,
                   origin_server_ts=event.origin_server_ts)  # fmt: skip

    @property
    def is_verification(self) -> bool:
        if self.type.startswith(PREFIX):
            return True
        return self.type == "m.room.message" and self.content.get("msgtype") == PREFIX + "request"


@dataclass(frozen=True, slots=True)
class VerificationMessage:
    """An event to send: to one device (``room_id`` None) or into a room.

    An in-room message into an encrypted room is encrypted by the caller like any event."""

    type: str
    content: dict[str, Any]
    user_id: str | None = None
    device_id: str | None = None  # "*" for every device of the user
    room_id: str | None = None
    flow_id: str = ""

    def request(self, txn_id: str) -> Request:
        """The `gapline.matrix` request that sends it (``txn_id`` stable across retries)."""
        if self.room_id is not None:
            return api.send_event(self.room_id, self.type, self.content, txn_id)
        assert self.user_id is not None and self.device_id is not None
        return api.send_to_device(self.type, {self.user_id: {self.device_id: self.content}}, txn_id)


@dataclass(frozen=True, slots=True)
class VerificationStatus:
    """Where one flow is, for a prompt: whom, which state, what to compare, why it ended."""

    flow_id: str
    user_id: str
    device_id: str | None
    room_id: str | None
    state: VerificationState
    we_started: bool
    short_string: ShortString | None = None
    cancel_code: str | None = None
    cancel_reason: str | None = None
    cancelled_by_us: bool = False
    verified_devices: tuple[str, ...] = ()
    verified_master_key: str | None = None
    # ``/keys/signatures/upload`` body to send after success (our device or their master key
    # signed with our cross-signing keys), None when nothing can be signed.
    signatures: dict[str, dict[str, Any]] | None = field(default=None, repr=False)
