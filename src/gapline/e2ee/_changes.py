"""`Changes`: every row one step of the machine changed, saved at once with its cause.

A step (a sync's to-device events, an answer to a request, a share, an
encryption, a batch of decryptions) mutates the machine in memory; the rows it
changed wait in the machine until the caller takes them as one `Changes` value
and saves it with `save_changes(tx, changes)` inside the same storage
transaction as what caused the step (the sync token advance, the outbox row).
So an Olm ratchet is never on disk advanced without the room keys it carried,
nor the reverse.

Secrets in these records are already sealed: vodozemac pickles under the
machine's pickle key, other secret values under its value cipher. The records
hold no key material in the clear.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = [
    "AccountRecord",
    "BackedUpRecord",
    "BackupVersionRecord",
    "ChangeBuilder",
    "Changes",
    "CrossSigningRecord",
    "DeviceRecord",
    "InboundSessionRecord",
    "OlmSessionRecord",
    "OutboundSessionRecord",
    "OutgoingRecord",
    "PendingToDeviceRecord",
    "RoomRecord",
    "SecretRecord",
    "SeenRecord",
    "ShareRecord",
    "WithheldRecord",
]


@dataclass(frozen=True, slots=True)
class AccountRecord:
    user_id: str
    device_id: str
    key_check: bytes  # proves the store key at open, before any pickle is tried
    pickle: str = field(repr=False)
    device_keys_uploaded: bool
    server_otk_count: int | None
    created_ms: int


@dataclass(frozen=True, slots=True)
class OlmSessionRecord:
    sender_key: str
    session_id: str
    pickle: str = field(repr=False)
    created_ms: int
    last_used_ms: int


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    user_id: str
    device_id: str
    curve25519: str
    ed25519: str
    keys_json: str  # the signed device keys object as received
    deleted: bool


@dataclass(frozen=True, slots=True)
class CrossSigningRecord:
    user_id: str
    keys_json: str  # {"master": ..., "self_signing": ..., "user_signing": ...} as received


@dataclass(frozen=True, slots=True)
class RoomRecord:
    room_id: str
    settings_json: str  # the room's m.room.encryption content


@dataclass(frozen=True, slots=True)
class InboundSessionRecord:
    room_id: str
    session_id: str
    sender_key: str
    signing_key: str  # the sender's claimed Ed25519 device key
    sender_user: str | None
    sender_device: str | None
    forwarded: bool
    forwarding_chain_json: str
    first_known_index: int
    pickle: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class WithheldRecord:
    room_id: str
    session_id: str
    sender_key: str
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class SeenRecord:
    session_id: str
    message_index: int
    event_digest: bytes  # keyed hash of the event ID that used this index


@dataclass(frozen=True, slots=True)
class OutboundSessionRecord:
    room_id: str
    session_id: str
    pickle: str = field(repr=False)
    created_ms: int
    message_count: int
    settings_json: str


@dataclass(frozen=True, slots=True)
class ShareRecord:
    room_id: str
    session_id: str
    user_id: str
    device_id: str
    status: str  # "shared" or "withheld"
    message_index: int


@dataclass(frozen=True, slots=True)
class PendingToDeviceRecord:
    pending_id: str
    sender: str
    sealed: bytes = field(repr=False)  # the decrypted payload, sealed: it may hold a room key


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    request_id: str  # also the sendToDevice transaction ID, so a resend delivers once
    event_type: str
    messages_json: str  # {user: {device: content}}; Olm ciphertext or a withheld notice
    seq: int


@dataclass(frozen=True, slots=True)
class SecretRecord:
    name: str  # the secret-storage name, e.g. m.megolm_backup.v1
    sealed: bytes = field(repr=False)  # the private key, sealed by the value cipher


@dataclass(frozen=True, slots=True)
class BackupVersionRecord:
    version: str
    algorithm: str
    auth_data_json: str


@dataclass(frozen=True, slots=True)
class BackedUpRecord:
    room_id: str
    session_id: str
    version: str
    first_known_index: int
    restored: bool


@dataclass(frozen=True, slots=True)
class Changes:
    """The rows one or more steps changed, to be saved in one transaction."""

    account: AccountRecord | None = None
    olm_sessions: tuple[OlmSessionRecord, ...] = ()
    devices: tuple[DeviceRecord, ...] = ()
    cross_signing: tuple[CrossSigningRecord, ...] = ()
    tracked_users: tuple[tuple[str, bool], ...] = ()  # (user, outdated)
    untracked_users: tuple[str, ...] = ()
    rooms: tuple[RoomRecord, ...] = ()
    inbound_sessions: tuple[InboundSessionRecord, ...] = ()
    withheld: tuple[WithheldRecord, ...] = ()
    withheld_removed: tuple[tuple[str, str], ...] = ()
    seen: tuple[SeenRecord, ...] = ()
    outbound_sessions: tuple[OutboundSessionRecord, ...] = ()
    outbound_removed: tuple[str, ...] = ()  # room IDs whose session was discarded
    shares: tuple[ShareRecord, ...] = ()
    pending_added: tuple[PendingToDeviceRecord, ...] = ()
    pending_removed: tuple[str, ...] = ()
    outgoing_added: tuple[OutgoingRecord, ...] = ()
    outgoing_removed: tuple[str, ...] = ()
    secrets: tuple[SecretRecord, ...] = ()
    secrets_removed: tuple[str, ...] = ()
    backup_version: tuple[BackupVersionRecord, ...] = ()  # at most one: the version now used
    backup_version_removed: bool = False  # no version is used any more
    backed_up: tuple[BackedUpRecord, ...] = ()

    def is_empty(self) -> bool:
        return all(not getattr(self, f.name) for f in fields(self))

    def __len__(self) -> int:
        """How many rows this saves or deletes."""
        return sum(
            (1 if f.name in _SINGLE else len(getattr(self, f.name)))
            for f in fields(self)
            if getattr(self, f.name)
        )


_SINGLE = ("account", "backup_version_removed")


class ChangeBuilder:
    """The mutable collector the sub-machines fill while the caller takes changes."""

    def __init__(self) -> None:
        self.account: AccountRecord | None = None
        self.backup_version_removed = False
        self.lists: dict[str, list[object]] = {
            f.name: [] for f in fields(Changes) if f.name not in _SINGLE
        }

    def add(self, name: str, *items: object) -> None:
        self.lists[name].extend(items)

    def freeze(self) -> Changes:
        return Changes(
            account=self.account,
            backup_version_removed=self.backup_version_removed,
            **{k: tuple(v) for k, v in self.lists.items()},  # ty: ignore[invalid-argument-type]
        )
