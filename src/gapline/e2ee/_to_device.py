"""`ToDeviceReceiver`: Olm-decrypts sync's to-device events and routes what they carry.

For an ``m.room.encrypted`` to-device event (Olm):

1. it must be addressed to this device's Curve25519 key and decrypt with an
   Olm session (`OlmSessions` holds the replay rules);
2. the payload must name the homeserver-asserted sender, us as recipient, and
   our Ed25519 key as the recipient's key;
3. the sending device must be known (accepted from ``/keys/query``) with the
   Curve25519 key of the Olm channel, belong to the sender, and have the
   Ed25519 key the payload claims. A payload from a device we do not know yet
   is *kept* (sealed, with the step's changes) and its sender queried; once
   the answer arrives it is handled, or refused if the device is still unknown.
   So a room key that outruns its sender's device keys is not lost;
4. then ``m.room_key`` is bound to that channel and that Ed25519 key;
   ``m.forwarded_room_key`` is accepted only from our own devices and marked
   forwarded with its chain; anything else goes back to the caller.

Unencrypted ``m.room_key.withheld`` notices are recorded; a room key sent in
the clear is refused.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gapline.matrix import ToDeviceEvent

from ._changes import ChangeBuilder, PendingToDeviceRecord, WithheldRecord
from ._inbound import RoomKey
from ._olm import OlmFailure
from ._parts import Parts
from ._types import (
    MEGOLM,
    OLM,
    DecryptedToDevice,
    Device,
    Refusal,
    RefusalCode,
    RoomKeyId,
)

__all__ = ["Received", "ToDeviceReceiver"]

log = logging.getLogger("gapline.e2ee.to_device")

_WITHHELD_TYPES = ("m.room_key.withheld", "org.matrix.room_key.withheld")


@dataclass(slots=True)
class Received:
    """What a batch of to-device events delivered (collected across one step)."""

    room_keys: list[RoomKeyId] = field(default_factory=list)
    withheld: list[RoomKeyId] = field(default_factory=list)
    to_device: list[DecryptedToDevice] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    def refuse(
        self, code: RefusalCode, detail: str, sender: str | None, device: str | None = None
    ) -> None:
        log.warning(
            "refused to-device from %s %s: %s (%s)", sender, device or "", detail, code.value
        )
        self.refusals.append(Refusal(code, detail, sender, device))


@dataclass(frozen=True, slots=True)
class _Pending:
    sender: str
    sender_key: str
    payload: dict[str, Any]


class ToDeviceReceiver:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._pending: dict[str, _Pending] = {}
        self._added: set[str] = set()
        self._removed: set[str] = set()

    # -- loading and saving ----------------------------------------------------------------

    def load(self, records: Iterable[PendingToDeviceRecord]) -> None:
        for r in records:
            data = json.loads(self._parts.keys.cipher.decrypt(r.sealed, aad=r.pending_id.encode()))
            self._pending[r.pending_id] = _Pending(r.sender, data["sender_key"], data["payload"])

    def drain(self, out: ChangeBuilder) -> None:
        for pending_id in sorted(self._added):
            p = self._pending[pending_id]
            plain = json.dumps({"sender_key": p.sender_key, "payload": p.payload}).encode()
            sealed = self._parts.keys.cipher.encrypt(plain, aad=pending_id.encode())
            out.add("pending_added", PendingToDeviceRecord(pending_id, p.sender, sealed))
        out.add("pending_removed", *sorted(self._removed))
        self._added.clear()
        self._removed.clear()

    @property
    def dirty(self) -> bool:
        return bool(self._added or self._removed)

    def pending_senders(self) -> set[str]:
        return {p.sender for p in self._pending.values()}

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, events: Iterable[ToDeviceEvent], into: Received) -> None:
        for event in events:
            if event.type == "m.room.encrypted":
                self._receive_encrypted(event, into)
            elif event.type in _WITHHELD_TYPES:
                self._receive_withheld(event, into)
            elif event.type in ("m.room_key", "m.forwarded_room_key"):
                into.refuse(RefusalCode.MALFORMED, f"{event.type} sent unencrypted", event.sender)

    def retry_pending(self, users: Iterable[str], into: Received) -> None:
        """The device lists of ``users`` were just fetched: handle what waited for them."""
        answered = set(users)
        for pending_id, p in list(self._pending.items()):
            if p.sender not in answered:
                continue
            del self._pending[pending_id]
            if pending_id in self._added:
                self._added.discard(pending_id)
            else:
                self._removed.add(pending_id)
            device = self._parts.devices.by_curve25519(p.sender_key)
            if device is None:
                into.refuse(
                    RefusalCode.UNKNOWN_DEVICE,
                    f"no device of {p.sender} has the Curve25519 key {p.sender_key}",
                    p.sender,
                )
                continue
            self._handle_payload(p.sender, p.sender_key, device, p.payload, into)

    def _receive_encrypted(self, event: ToDeviceEvent, into: Received) -> None:
        content = event.content
        if content.get("algorithm") != OLM:
            into.refuse(
                RefusalCode.UNSUPPORTED_ALGORITHM,
                f"to-device algorithm {content.get('algorithm')!r}",
                event.sender,
            )
            return
        sender_key = content.get("sender_key")
        ciphertext = content.get("ciphertext")
        if not isinstance(sender_key, str) or not isinstance(ciphertext, dict):
            into.refuse(
                RefusalCode.MALFORMED, "Olm event lacks sender_key or ciphertext", event.sender
            )
            return
        ours = ciphertext.get(self._parts.account.curve25519)
        if not isinstance(ours, dict):
            into.refuse(
                RefusalCode.WRONG_RECIPIENT, "no ciphertext for this device's key", event.sender
            )
            return
        try:
            plaintext = self._parts.olm.decrypt(
                sender_key, ours.get("type"), ours.get("body"), self._parts.clock()
            )
        except OlmFailure as exc:
            into.refuse(exc.code, exc.detail, event.sender)
            return
        try:
            payload = json.loads(plaintext)
        except ValueError:
            payload = None
        if (
            not isinstance(payload, dict)
            or not isinstance(payload.get("type"), str)
            or not isinstance(payload.get("content"), dict)
        ):
            into.refuse(RefusalCode.MALFORMED, "Olm payload is not an event", event.sender)
            return
        recipient_keys = payload.get("recipient_keys")
        if payload.get("sender") != event.sender:
            into.refuse(
                RefusalCode.SENDER_MISMATCH,
                f"payload names sender {payload.get('sender')!r}",
                event.sender,
            )
            return
        if (
            payload.get("recipient") != self._parts.account.user_id
            or not isinstance(recipient_keys, dict)
            or recipient_keys.get("ed25519") != self._parts.account.ed25519
        ):
            into.refuse(
                RefusalCode.WRONG_RECIPIENT, "payload is addressed to another device", event.sender
            )
            return
        device = self._parts.devices.by_curve25519(sender_key)
        if device is None:
            pending_id = uuid.uuid4().hex
            self._pending[pending_id] = _Pending(event.sender, sender_key, payload)
            self._added.add(pending_id)
            self._parts.devices.track([event.sender])
            self._parts.devices.mark_changed([event.sender])
            log.info(
                "to-device %s from an unknown device of %s: kept until its keys are fetched",
                payload["type"],
                event.sender,
            )
            return
        self._handle_payload(event.sender, sender_key, device, payload, into)

    def _handle_payload(
        self, sender: str, sender_key: str, device: Device, payload: dict[str, Any], into: Received
    ) -> None:
        keys = payload.get("keys")
        claimed = keys.get("ed25519") if isinstance(keys, dict) else None
        if device.user_id != sender:
            into.refuse(
                RefusalCode.SENDER_MISMATCH,
                f"the Olm channel belongs to {device.user_id}, not {sender}",
                sender,
            )
            return
        if claimed != device.ed25519:
            into.refuse(
                RefusalCode.SENDER_MISMATCH,
                "the payload claims another Ed25519 key than the device's",
                sender,
                device.device_id,
            )
            return
        event_type, content = payload["type"], payload["content"]
        if event_type == "m.room_key":
            self._room_key(sender, sender_key, device, content, into)
        elif event_type == "m.forwarded_room_key":
            self._forwarded_room_key(sender, sender_key, device, content, into)
        elif event_type != "m.dummy":
            into.to_device.append(
                DecryptedToDevice(sender, device.device_id, sender_key, event_type, content)
            )

    def _room_key(
        self, sender: str, sender_key: str, device: Device, content: dict[str, Any], into: Received
    ) -> None:
        fields = [content.get(k) for k in ("room_id", "session_id", "session_key")]
        if content.get("algorithm") != MEGOLM or not all(isinstance(f, str) for f in fields):
            into.refuse(
                RefusalCode.MALFORMED,
                "m.room_key lacks room_id, session_id or session_key",
                sender,
                device.device_id,
            )
            return
        room_id, session_id, session_key = (str(f) for f in fields)
        self._store(
            RoomKey(
                room_id,
                session_id,
                session_key,
                sender_key,
                device.ed25519,
                device.user_id,
                device.device_id,
            ),
            into,
        )

    def _forwarded_room_key(
        self, sender: str, sender_key: str, device: Device, content: dict[str, Any], into: Received
    ) -> None:
        if device.user_id != self._parts.account.user_id:
            into.refuse(
                RefusalCode.FORWARD_NOT_TRUSTED,
                "forwarded room keys are taken only from our own devices",
                sender,
                device.device_id,
            )
            return
        names = ("room_id", "session_id", "session_key", "sender_key", "sender_claimed_ed25519_key")
        fields = [content.get(k) for k in names]
        chain = content.get("forwarding_curve25519_key_chain", [])
        if (
            content.get("algorithm") != MEGOLM
            or not all(isinstance(f, str) for f in fields)
            or not isinstance(chain, list)
        ):
            into.refuse(
                RefusalCode.MALFORMED, "m.forwarded_room_key lacks fields", sender, device.device_id
            )
            return
        room_id, session_id, session_key, original_key, original_ed = (str(f) for f in fields)
        original = self._parts.devices.by_curve25519(original_key)
        owner = original if original is not None and original.ed25519 == original_ed else None
        self._store(
            RoomKey(
                room_id,
                session_id,
                session_key,
                original_key,
                original_ed,
                owner.user_id if owner else None,
                owner.device_id if owner else None,
                forwarded=True,
                forwarding_chain=(*(str(c) for c in chain), sender_key),
            ),
            into,
        )

    def _store(self, key: RoomKey, into: Received) -> None:
        outcome = self._parts.inbound.add(key)
        if isinstance(outcome, Refusal):
            log.warning("refused room key %s: %s", key.session_id, outcome.detail)
            into.refusals.append(outcome)
        elif outcome:
            into.room_keys.append(RoomKeyId(key.room_id, key.session_id))

    def _receive_withheld(self, event: ToDeviceEvent, into: Received) -> None:
        c = event.content
        room_id, session_id, code = c.get("room_id"), c.get("session_id"), c.get("code")
        if not isinstance(code, str):
            into.refuse(RefusalCode.MALFORMED, "withheld notice without a code", event.sender)
            return
        if not isinstance(room_id, str) or not isinstance(session_id, str):
            log.info("%s says %s (no session named)", event.sender, code)  # e.g. m.no_olm
            return
        reason = c.get("reason")
        sender_key = c.get("sender_key")
        record = WithheldRecord(
            room_id,
            session_id,
            sender_key if isinstance(sender_key, str) else "",
            code,
            reason if isinstance(reason, str) else code,
        )
        if self._parts.inbound.add_withheld(record):
            into.withheld.append(RoomKeyId(room_id, session_id))
