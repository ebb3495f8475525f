"""The values `gapline.e2ee` hands to its callers.

Everything here is a frozen value: devices with their trust level, the outcome
of decrypting a room event (`DecryptedEvent` or `UnableToDecrypt`), the room
keys a step received, refusals of bad input, and the requests to send.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from gapline.matrix import (
    EmptyResponse,
    KeysClaimResponse,
    KeysQueryResponse,
    KeysUploadResponse,
    Request,
)

__all__ = [
    "MEGOLM",
    "OLM",
    "DecryptedEvent",
    "DecryptedToDevice",
    "Device",
    "EncryptionSettings",
    "KeyUpdates",
    "OutgoingRequest",
    "Refusal",
    "RefusalCode",
    "RequestKind",
    "RoomKeyId",
    "ShareReport",
    "ShareState",
    "TrustLevel",
    "UnableToDecrypt",
    "UtdReason",
]

OLM = "m.olm.v1.curve25519-aes-sha2"
MEGOLM = "m.megolm.v1.aes-sha2"


class TrustLevel(enum.StrEnum):
    """How far a device is vouched for."""

    OWN = "own"  # this very device
    VERIFIED = "verified"  # cross-signed under a master key we trust (ours, or one we signed)
    CROSS_SIGNED = (
        "cross_signed"  # signed by its owner's self-signing key, itself signed by the master key
    )
    UNSIGNED = "unsigned"  # a valid self-signed device, not cross-signed by its owner


@dataclass(frozen=True, slots=True)
class Device:
    """A device whose self-signed keys were accepted (its key pair is pinned for good)."""

    user_id: str
    device_id: str
    curve25519: str
    ed25519: str
    algorithms: tuple[str, ...]
    display_name: str | None
    trust: TrustLevel
    deleted: bool = False  # gone from the owner's device list; kept so its keys stay pinned


class UtdReason(enum.StrEnum):
    """Why an event could not be decrypted; the exact names cross the wire."""

    MISSING_ROOM_KEY = "MissingRoomKey"
    UNKNOWN_MESSAGE_INDEX = "UnknownMessageIndex"
    WITHHELD = "Withheld"
    MALFORMED = "Malformed"
    UNTRUSTED = "Untrusted"


class RefusalCode(enum.StrEnum):
    """The rule an input broke. Each refusal is also logged with its detail."""

    BAD_SIGNATURE = "bad_signature"
    CHANGED_DEVICE_KEY = "changed_device_key"
    MISMATCHED_IDS = "mismatched_ids"
    UNKNOWN_DEVICE = "unknown_device"
    OLM_UNDECRYPTABLE = "olm_undecryptable"
    OLM_REPLAY = "olm_replay"
    MALFORMED = "malformed"
    WRONG_RECIPIENT = "wrong_recipient"
    SENDER_MISMATCH = "sender_mismatch"
    UNSUPPORTED_ALGORITHM = "unsupported_algorithm"
    SESSION_MISMATCH = "session_mismatch"
    FORWARD_NOT_TRUSTED = "forward_not_trusted"
    MEGOLM_REPLAY = "megolm_replay"
    UNVERIFIED_DEVICE = "unverified_device"


@dataclass(frozen=True, slots=True)
class Refusal:
    """An input refused by a rule: what it was, who sent it, and why."""

    code: RefusalCode
    detail: str
    sender: str | None = None
    device_id: str | None = None


@dataclass(frozen=True, slots=True)
class UnableToDecrypt:
    """An event that could not be decrypted: retain it, show the reason, retry when its
    session's key arrives (`KeyUpdates.room_keys`)."""

    event_id: str
    room_id: str
    session_id: str | None
    reason: UtdReason
    detail: str = ""
    withheld_code: str | None = None  # the sender's m.room_key.withheld code, if any
    refusal: RefusalCode | None = None  # set when a rule refused it (replay, sender mismatch)

    def to_wire(self) -> dict[str, Any]:
        """The Event row's ``decryption`` field."""
        return {"UnableToDecrypt": {"session_id": self.session_id, "reason": self.reason.value}}


@dataclass(frozen=True, slots=True)
class DecryptedEvent:
    """A room event decrypted by a Megolm session, with what is known of its sender."""

    event_id: str
    room_id: str
    sender: str
    type: str
    content: dict[str, Any] = field(repr=False)
    session_id: str
    message_index: int
    sender_key: str
    sender_device: str | None
    trust: TrustLevel
    forwarded: bool


@dataclass(frozen=True, slots=True)
class DecryptedToDevice:
    """An Olm-decrypted to-device event that is not a room key (those are consumed)."""

    sender: str
    sender_device: str
    sender_key: str
    type: str
    content: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True, order=True)
class RoomKeyId:
    room_id: str
    session_id: str


@dataclass(frozen=True, slots=True)
class KeyUpdates:
    """What one step received: room keys (retry the retained events of these sessions),
    withheld notices, other decrypted to-device events, users whose devices changed,
    and the refusals."""

    room_keys: tuple[RoomKeyId, ...] = ()
    withheld: tuple[RoomKeyId, ...] = ()
    to_device: tuple[DecryptedToDevice, ...] = ()
    devices_changed: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()


_WEEK_MS = 7 * 24 * 3600 * 1000  # the spec's default rotation_period_ms
_DEFAULT_MSGS = 100  # the spec's default rotation_period_msgs


@dataclass(frozen=True, slots=True)
class EncryptionSettings:
    """An encrypted room's ``m.room.encryption`` content, with the spec's defaults."""

    algorithm: str = MEGOLM
    rotation_period_ms: int = _WEEK_MS
    rotation_period_msgs: int = _DEFAULT_MSGS

    @classmethod
    def from_content(cls, content: dict[str, Any]) -> EncryptionSettings:
        def positive(name: str, default: int) -> int:
            value = content.get(name)
            return value if isinstance(value, int) and value > 0 else default

        algorithm = content.get("algorithm")
        return cls(
            algorithm=algorithm if isinstance(algorithm, str) else "",
            rotation_period_ms=positive("rotation_period_ms", _WEEK_MS),
            rotation_period_msgs=positive("rotation_period_msgs", _DEFAULT_MSGS),
        )


class RequestKind(enum.StrEnum):
    KEYS_UPLOAD = "keys_upload"
    KEYS_QUERY = "keys_query"
    KEYS_CLAIM = "keys_claim"
    TO_DEVICE = "to_device"


_RESPONSE_TYPES: dict[RequestKind, type] = {
    RequestKind.KEYS_UPLOAD: KeysUploadResponse,
    RequestKind.KEYS_QUERY: KeysQueryResponse,
    RequestKind.KEYS_CLAIM: KeysClaimResponse,
    RequestKind.TO_DEVICE: EmptyResponse,
}


@dataclass(frozen=True, slots=True)
class OutgoingRequest:
    """A request the machine wants sent. Send ``request``, parse the answer as
    ``response_type`` and report it with ``mark_request_as_sent(request_id, answer)``."""

    request_id: str
    kind: RequestKind
    request: Request

    @property
    def response_type(self) -> type:
        return _RESPONSE_TYPES[self.kind]


class ShareState(enum.Enum):
    """Where sharing a room's session stands; anything but READY means: send the
    outgoing requests, report their answers, and call ``share_room_key`` again."""

    NEEDS_KEYS_QUERY = "needs_keys_query"
    NEEDS_KEYS_CLAIM = "needs_keys_claim"
    READY = "ready"


@dataclass(frozen=True, slots=True)
class ShareReport:
    """One ``share_room_key`` step: where it stands and who was reached or not."""

    room_id: str
    state: ShareState
    session_id: str | None = None
    rotated: bool = False
    shared_with: tuple[tuple[str, str], ...] = ()  # (user, device) given the key in this step
    withheld: tuple[tuple[str, str], ...] = ()  # no Olm channel (m.no_olm sent)
    unreachable_users: tuple[str, ...] = ()  # members with no device that can receive the key
