"""`CryptoMachine`: the sans-I/O end-to-end encryption facade, a machine of machines.

Each job has its own sub-machine (a reader finds a rule by the name)::

    account    AccountMachine        identity keys, one-time and fallback keys, /keys/upload
    devices    DeviceTracker         tracked users, /keys/query, pinned keys, cross-signing trust
    olm        OlmSessions           pairwise Olm sessions: decrypt and encrypt to-device payloads
    receiver   ToDeviceReceiver      to-device routing: room keys, forwarded keys, withheld notices
    inbound    InboundGroupSessions  Megolm room keys and room-event decryption (replay, sender)
    outbound   GroupSessionManager   our Megolm session per room: sharing, /keys/claim, rotation

    vault          SecretVault   the private keys held: backup key, cross-signing seeds
    cross_signing  CrossSigning  our cross-signing keys, signing devices and users, VERIFIED
    backup         KeyBackup     server-side key backup: trusted version, uploads, restore

Key files (`_key_export.py`) and recovery (`_recovery.py`) are functions over the
machine; the async steps of recovery, backup and cross-signing are in
`_key_driver.py`. ``verification`` (`Verifications`) runs interactive SAS verification;
``sharing`` (`SharingPolicy`) decides whether trust limits who gets room keys.

The caller drives it (no I/O here): feed what the homeserver said
(`receive_sync`, room state via `set_room_encryption` / `room_member_left` /
`update_tracked_users`), decrypt room events, ask for `outgoing_requests`, send
them, report each answer (`mark_request_as_sent`), and save `take_changes` in
the transaction of what caused them. `outgoing_requests` refuses to hand out
requests while changes wait unsaved.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gapline.matrix import (
    ClientEvent,
    KeysClaimResponse,
    KeysQueryResponse,
    KeysUploadResponse,
    SyncResponse,
    ToDeviceEvent,
    api,
)

from ._account import SIGNED_CURVE25519, AccountMachine
from ._backup import KeyBackup
from ._canonical import SignatureInvalid, verify_signature
from ._changes import ChangeBuilder, Changes, OutgoingRecord
from ._cross_signing import CrossSigning
from ._devices import DeviceTracker
from ._errors import (
    CorruptCryptoStore,
    CryptoStoreError,
    UnknownRequest,
    UnsavedChanges,
    WrongStoreKey,
)
from ._inbound import InboundGroupSessions
from ._megolm_worker import RawDecryption
from ._olm import OlmSessions
from ._outbound import GroupSessionManager
from ._parts import Parts
from ._secrets import CryptoKeys
from ._sharing_policy import SharingPolicy, apply_policy
from ._store import StoredState
from ._to_device import Received, ToDeviceReceiver
from ._types import (
    DecryptedEvent,
    Device,
    EncryptionSettings,
    KeyUpdates,
    OutgoingRequest,
    RefusalCode,
    RequestKind,
    ShareReport,
    ShareState,
    TrustLevel,
    UnableToDecrypt,
)
from ._vault import SecretVault
from ._verification import Verifications
from ._verified import VerifiedMarks

__all__ = ["CryptoMachine"]

log = logging.getLogger("gapline.e2ee")

_TO_DEVICE_CHUNK = 250  # device messages per sendToDevice request
_NO_OLM_RETRY_MS = 3600 * 1000  # retry claiming for a device that had no key after this
_SHARE_VISIBILITY_FOR_INVITED = ("invited", "shared", "world_readable")


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class _Out:
    kind: RequestKind
    request: Any
    users: tuple[str, ...] = ()
    devices: tuple[Device, ...] = ()


class CryptoMachine:
    """One device's end-to-end encryption state and rules. Not thread-safe: one caller."""

    def __init__(self, keys: CryptoKeys, account: AccountMachine, clock: Callable[[], int]) -> None:
        self._keys = keys
        self._clock = clock
        self.account = account
        self.devices = DeviceTracker(
            account.user_id, account.device_id, account.ed25519, account.curve25519
        )
        self.olm = OlmSessions(account)
        self.inbound = InboundGroupSessions(keys, self._device_by_curve25519)
        parts = Parts(account, self.devices, self.olm, self.inbound, keys, clock)
        self.receiver = ToDeviceReceiver(parts)
        self.outbound = GroupSessionManager(parts)
        self._outgoing: dict[str, OutgoingRecord] = {}
        self._outgoing_added: set[str] = set()
        self._outgoing_removed: set[str] = set()
        self._seq = 0
        self._out: dict[str, _Out] = {}  # outstanding requests by ID
        self._claim_wanted: dict[tuple[str, str], Device] = {}
        self._no_olm: dict[tuple[str, str], int] = {}  # device -> when its claim came back empty
        self._requery: set[str] = set()
        self.vault = SecretVault(keys)  # private keys held: backup key, cross-signing seeds
        self.cross_signing = CrossSigning(account, self.devices, self.vault)
        self.backup = KeyBackup(self.inbound, self.vault, self.devices, account, self.cross_signing)
        self.cross_signing.marks = VerifiedMarks(self.vault)
        self.verification = Verifications(
            account, self.devices, self.cross_signing, self.cross_signing.marks, clock
        )
        self.sharing = SharingPolicy.ALL_DEVICES  # set by the caller after opening

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls, store_key: bytes, user_id: str, device_id: str, *, clock: Callable[[], int] = _wall_ms
    ) -> CryptoMachine:
        """A new device identity. Its first `take_changes` holds the account: save it
        before anything else, so a restart finds the same device."""
        machine = cls(
            CryptoKeys(store_key), AccountMachine.create(user_id, device_id, clock()), clock
        )
        machine.devices.track([user_id])
        return machine

    @classmethod
    def from_state(
        cls,
        state: StoredState,
        store_key: bytes,
        *,
        user_id: str | None = None,
        device_id: str | None = None,
        clock: Callable[[], int] = _wall_ms,
    ) -> CryptoMachine:
        """Rebuild the machine from `load_state`'s rows; all or nothing.

        Raises `WrongStoreKey` when ``store_key`` is not this state's key,
        `CorruptCryptoStore` when a row does not open, and `CryptoStoreError` when the
        state belongs to another user or device than the one given.
        """
        if state.account is None:
            raise CryptoStoreError("this store holds no end-to-end encryption account")
        keys = CryptoKeys(store_key)
        if not keys.matches(state.account.key_check):
            raise WrongStoreKey("wrong store key: it does not open this device's encryption state")
        a = state.account
        if (user_id, device_id) != (None, None) and (user_id, device_id) != (
            a.user_id,
            a.device_id,
        ):
            raise CryptoStoreError(
                f"the encryption state belongs to {a.user_id} {a.device_id}, "
                f"not {user_id} {device_id}"
            )
        part = "account"
        try:
            machine = cls(keys, AccountMachine.from_record(a, keys), clock)
            part = "devices"
            machine.devices.load(state.devices, state.cross_signing, state.tracked_users)
            part = "Olm sessions"
            machine.olm.load(state.olm_sessions, keys)
            part = "inbound group sessions"
            machine.inbound.load(state.inbound_sessions, state.withheld, state.seen)
            part = "outbound group sessions"
            machine.outbound.load(state.rooms, state.outbound_sessions, state.shares)
            part = "pending to-device events"
            machine.receiver.load(state.pending)
            part = "held secrets"
            machine.vault.load(state.secrets)
            part = "key backup state"
            machine.backup.load(state.backup_version, state.backed_up)
        except (
            ValueError,
            KeyError,
            TypeError,
        ) as exc:  # vodozemac, JSON and cipher errors are ValueErrors
            raise CorruptCryptoStore(f"the stored {part} do not open: {exc}") from None
        for record in state.outgoing:
            machine._outgoing[record.request_id] = record
            machine._seq = max(machine._seq, record.seq + 1)
        return machine

    # -- identity and lookups -----------------------------------------------------------------

    @property
    def user_id(self) -> str:
        return self.account.user_id

    @property
    def device_id(self) -> str:
        return self.account.device_id

    @property
    def identity_keys(self) -> dict[str, str]:
        return {"curve25519": self.account.curve25519, "ed25519": self.account.ed25519}

    def devices_of(self, user_id: str) -> list[Device]:
        """A user's current devices with their trust level (for a device list)."""
        trust = self.cross_signing.trust_of
        return [replace(d, trust=trust(d)) for d in self.devices.devices_of(user_id)]

    def _device_by_curve25519(self, key: str) -> Device | None:
        """The device of a Curve25519 key, its trust raised to ``VERIFIED`` where due."""
        d = self.devices.by_curve25519(key)
        if d is None or d.trust is TrustLevel.OWN:
            return d
        return replace(d, trust=self.cross_signing.trust_of(d))

    def device(self, user_id: str, device_id: str) -> Device | None:
        d = self.devices.get(user_id, device_id)
        return None if d is None else replace(d, trust=self.cross_signing.trust_of(d))

    # -- what the homeserver said ---------------------------------------------------------------

    def receive_sync(self, sync: SyncResponse, *, initial: bool = False) -> KeyUpdates:
        """Feed one sync's encryption fields (to-device, device lists, key counts).

        ``initial``: this sync had no ``since`` token (or follows a gap in which
        device-list changes may have been missed): every tracked user is queried again.
        """
        return self.receive_sync_changes(
            initial=initial,
            to_device=sync.to_device.events,
            changed=sync.device_lists.changed,
            left=sync.device_lists.left,
            one_time_key_counts=sync.device_one_time_keys_count,
            unused_fallback_key_types=sync.device_unused_fallback_key_types,
        )

    def receive_sync_changes(
        self,
        *,
        to_device: Iterable[ToDeviceEvent] = (),
        changed: Iterable[str] = (),
        left: Iterable[str] = (),
        one_time_key_counts: Mapping[str, int] | None = None,
        unused_fallback_key_types: list[str] | None = None,
        initial: bool = False,
    ) -> KeyUpdates:
        changed = list(changed)
        if initial:
            changed.extend(self.devices.tracked)
        self.devices.mark_changed(changed)
        in_flight = {
            u for o in self._out.values() if o.kind is RequestKind.KEYS_QUERY for u in o.users
        }
        self._requery.update(in_flight.intersection(changed))
        self.devices.mark_left(left)
        self.account.receive_counts(one_time_key_counts or {}, unused_fallback_key_types)
        received = Received()
        self.receiver.receive(to_device, received)
        return _updates(received)

    def update_tracked_users(self, users: Iterable[str]) -> None:
        """Follow the devices of these users (members of encrypted rooms)."""
        self.devices.track(users)

    def set_room_encryption(self, room_id: str, content: dict[str, Any]) -> None:
        """The room's ``m.room.encryption`` state: from now on the room is encrypted."""
        self.outbound.set_room_encryption(room_id, content)

    def room_settings(self, room_id: str) -> EncryptionSettings | None:
        return self.outbound.settings(room_id)

    def is_room_encrypted(self, room_id: str) -> bool:
        return self.outbound.settings(room_id) is not None

    def room_member_left(self, room_id: str, user_id: str) -> None:
        """A member left or was kicked/banned: retire the room's session if they had it."""
        self.outbound.member_left(room_id, user_id)

    # -- room events ----------------------------------------------------------------------------

    def decrypt_room_event(
        self, room_id: str, event: ClientEvent
    ) -> DecryptedEvent | UnableToDecrypt:
        return apply_policy(self.sharing, self.inbound.decrypt(room_id, event))

    def decrypt_room_events(
        self,
        room_id: str,
        events: Iterable[ClientEvent],
        *,
        raw: Sequence[RawDecryption | None] | None = None,
    ) -> list[DecryptedEvent | UnableToDecrypt]:
        """``raw``: the vodozemac results of a decrypt worker, one per event (see
        `InboundGroupSessions.decrypt_many`)."""
        results = self.inbound.decrypt_many(room_id, events, raw)
        policy = self.sharing
        if policy is SharingPolicy.ALL_DEVICES:
            return results
        return [apply_policy(policy, r) for r in results]

    def share_room_key(
        self,
        room_id: str,
        joined: Iterable[str],
        *,
        invited: Iterable[str] = (),
        history_visibility: str = "shared",
    ) -> ShareReport:
        """One step of making the room's outbound session known to every recipient device.

        Not READY: send `outgoing_requests`, report their answers, call again.
        READY: the key's to-device messages are queued (send them before the event);
        `encrypt_room_event` may now be used. Raises `EncryptionRefused` for a room
        that is not encrypted or names an unknown algorithm.
        """
        users = set(joined)
        if history_visibility in _SHARE_VISIBILITY_FOR_INVITED:
            users |= set(invited)
        users.add(self.user_id)
        self.devices.track(users)
        if any(self.devices.tracked.get(u) for u in users):
            return ShareReport(room_id, ShareState.NEEDS_KEYS_QUERY)
        plan = self.outbound.plan(room_id, users, self._may_receive)
        now = self._clock()
        need, no_olm = [], []
        for d in plan.need_session:
            failed_at = self._no_olm.get((d.user_id, d.device_id))
            if failed_at is not None and now - failed_at < _NO_OLM_RETRY_MS:
                no_olm.append(d)
            else:
                need.append(d)
        if need:
            for d in need:
                self._claim_wanted[(d.user_id, d.device_id)] = d
            return ShareReport(room_id, ShareState.NEEDS_KEYS_CLAIM, plan.session_id, plan.rotated)
        self._queue_to_device("m.room.encrypted", self.outbound.share(room_id, plan.can_share))
        self._queue_to_device("m.room_key.withheld", self.outbound.withhold(room_id, no_olm))
        self.outbound.mark_ready(room_id)
        return ShareReport(
            room_id,
            ShareState.READY,
            plan.session_id,
            plan.rotated,
            shared_with=tuple((d.user_id, d.device_id) for d in plan.can_share),
            withheld=tuple((d.user_id, d.device_id) for d in no_olm),
            unreachable_users=plan.unreachable_users,
        )

    def _may_receive(self, device: Device) -> bool:
        trust = self.cross_signing.trust_of(device)
        return self.sharing.may_receive(replace(device, trust=trust))

    def encrypt_room_event(
        self, room_id: str, event_type: str, content: dict[str, Any]
    ) -> dict[str, Any]:
        """The ``m.room.encrypted`` content to send instead of ``content``; raises
        `EncryptionRefused` (never returns plaintext). Save the changes before sending."""
        return self.outbound.encrypt(room_id, event_type, content)

    # -- requests ---------------------------------------------------------------------------------

    def outgoing_requests(self) -> list[OutgoingRequest]:
        """Every request waiting to be sent (the same ones again until answered or failed)."""
        if self.has_unsaved_changes:
            raise UnsavedChanges("take_changes() and save them before sending requests")
        kinds = {o.kind for o in self._out.values()}
        if (
            RequestKind.KEYS_UPLOAD not in kinds
            and (body := self.account.upload_body()) is not None
        ):
            self._new(_Out(RequestKind.KEYS_UPLOAD, api.keys_upload(**body)))
        asked = {u for o in self._out.values() if o.kind is RequestKind.KEYS_QUERY for u in o.users}
        if users := tuple(u for u in self.devices.outdated() if u not in asked):
            self._new(
                _Out(RequestKind.KEYS_QUERY, api.keys_query({u: [] for u in users}), users=users)
            )
        claimed = {(d.user_id, d.device_id) for o in self._out.values() for d in o.devices}
        if wanted := tuple(d for k, d in sorted(self._claim_wanted.items()) if k not in claimed):
            body: dict[str, dict[str, str]] = {}
            for d in wanted:
                body.setdefault(d.user_id, {})[d.device_id] = SIGNED_CURVE25519
            self._new(_Out(RequestKind.KEYS_CLAIM, api.keys_claim(body), devices=wanted))
        for record in sorted(self._outgoing.values(), key=lambda r: r.seq):
            if record.request_id not in self._out:
                request = api.send_to_device(
                    record.event_type, json.loads(record.messages_json), record.request_id
                )
                self._out[record.request_id] = _Out(RequestKind.TO_DEVICE, request)
        return [OutgoingRequest(rid, o.kind, o.request) for rid, o in self._out.items()]

    def _new(self, out: _Out) -> None:
        self._out[uuid.uuid4().hex] = out

    def mark_request_as_failed(self, request_id: str) -> None:
        """The request could not be sent: it is built again by the next `outgoing_requests`."""
        out = self._out.pop(request_id, None)
        if out is not None and out.kind is RequestKind.KEYS_QUERY:
            self.devices.mark_changed(out.users)

    def mark_request_as_sent(self, request_id: str, answer: object) -> KeyUpdates:
        """Report a request's parsed answer (its `OutgoingRequest.response_type`)."""
        out = self._out.pop(request_id, None)
        if out is None:
            raise UnknownRequest(f"no outstanding request {request_id}")
        received = Received()
        changed: tuple[str, ...] = ()
        expected = OutgoingRequest(request_id, out.kind, out.request).response_type
        if not isinstance(answer, expected):
            self._out[request_id] = out  # still outstanding: the caller passed the wrong value
            raise TypeError(f"the answer to a {out.kind.value} request is a {expected.__name__}")
        if isinstance(answer, KeysUploadResponse):
            self.account.mark_uploaded(answer)
        elif isinstance(answer, KeysQueryResponse):
            result = self.devices.receive_query(out.users, answer)
            received.refusals.extend(result.refusals)
            changed = result.changed_users
            self.outbound.devices_removed(result.removed)
            self.receiver.retry_pending(out.users, received)
            again = self._requery.intersection(out.users)
            self._requery -= again
            self.devices.mark_changed(again)
        elif isinstance(answer, KeysClaimResponse):
            self._receive_claim(out.devices, answer, received)
        else:
            if self._outgoing.pop(request_id, None) is not None:
                self._outgoing_added.discard(request_id)
                self._outgoing_removed.add(request_id)
        return _updates(received, changed)

    def _receive_claim(
        self, devices: Iterable[Device], answer: KeysClaimResponse, into: Received
    ) -> None:
        now = self._clock()
        for d in devices:
            self._claim_wanted.pop((d.user_id, d.device_id), None)
            keys = answer.one_time_keys.get(d.user_id, {}).get(d.device_id, {})
            key = next(
                (v for k, v in sorted(keys.items()) if k.startswith(SIGNED_CURVE25519 + ":")), None
            )
            try:
                if not isinstance(key, dict) or not isinstance(key.get("key"), str):
                    raise LookupError("no one-time key")
                verify_signature(key, d.user_id, f"ed25519:{d.device_id}", d.ed25519)
                self.olm.add_outbound(d.curve25519, key["key"], now)
                self._no_olm.pop((d.user_id, d.device_id), None)
            except LookupError:
                log.info("keys/claim: no one-time key for %s %s", d.user_id, d.device_id)
                self._no_olm[(d.user_id, d.device_id)] = now
            except (SignatureInvalid, ValueError) as exc:
                into.refuse(
                    RefusalCode.BAD_SIGNATURE,
                    f"claimed one-time key: {exc}",
                    d.user_id,
                    d.device_id,
                )
                self._no_olm[(d.user_id, d.device_id)] = now

    def _queue_to_device(
        self, event_type: str, messages: dict[str, dict[str, dict[str, Any]]]
    ) -> None:
        flat = [(u, d, c) for u, by in sorted(messages.items()) for d, c in sorted(by.items())]
        for start in range(0, len(flat), _TO_DEVICE_CHUNK):
            chunk: dict[str, dict[str, dict[str, Any]]] = {}
            for u, d, c in flat[start : start + _TO_DEVICE_CHUNK]:
                chunk.setdefault(u, {})[d] = c
            request_id = uuid.uuid4().hex
            self._outgoing[request_id] = OutgoingRecord(
                request_id, event_type, json.dumps(chunk), self._seq
            )
            self._seq += 1
            self._outgoing_added.add(request_id)

    # -- changes ----------------------------------------------------------------------------------

    @property
    def has_unsaved_changes(self) -> bool:
        return (
            self.account.dirty
            or self.devices.dirty
            or self.olm.dirty
            or self.inbound.dirty
            or self.outbound.dirty
            or self.receiver.dirty
            or self.vault.dirty
            or self.backup.dirty
            or bool(self._outgoing_added or self._outgoing_removed)
        )

    def take_changes(self) -> Changes:
        """Every row changed since the last call, as one value for `save_changes`.

        Save it in the transaction of what caused it. If that transaction fails,
        this machine is ahead of the store: discard it and open it again.
        """
        out = ChangeBuilder()
        if self.account.dirty:
            out.account = self.account.record(self._keys)
            self.account.dirty = False
        self.devices.drain(out)
        self.olm.drain(out, self._keys)
        self.inbound.drain(out)
        self.outbound.drain(out)
        self.receiver.drain(out)
        self.vault.drain(out)
        self.backup.drain(out)
        out.add(
            "outgoing_added",
            *(self._outgoing[r] for r in sorted(self._outgoing_added) if r in self._outgoing),
        )
        out.add("outgoing_removed", *sorted(self._outgoing_removed))
        self._outgoing_added.clear()
        self._outgoing_removed.clear()
        return out.freeze()


def _updates(received: Received, changed: tuple[str, ...] = ()) -> KeyUpdates:
    return KeyUpdates(
        room_keys=tuple(received.room_keys),
        withheld=tuple(received.withheld),
        to_device=tuple(received.to_device),
        devices_changed=changed,
        refusals=tuple(received.refusals),
    )
