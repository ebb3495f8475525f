"""`GroupSessionManager`: our outbound Megolm session per encrypted room, shared over Olm.

Who gets the room key: every device of every joined member (and of invited
members when the room's history visibility is not ``joined``), except this
device, whose device keys were accepted. A device we have no Olm session with
needs a one-time key claimed first; a device for which ``/keys/claim``
returned nothing gets an ``m.room_key.withheld`` notice (``m.no_olm``) once per
session and the share goes on to the others; a withheld device stays due the key,
so it gets it as soon as an Olm session with it exists (it may have written to us
first) or a later claim succeeds (the machine spaces those claims out). A device that joins later gets the current
session from its current index (so it reads from then on, not before).

When a room's session is replaced (rotation): no session yet; the room's
``m.room.encryption`` ``rotation_period_msgs`` messages were encrypted or
``rotation_period_ms`` passed; the settings changed; a member it was shared
with left (`member_left`, or gone from the members at the next share); or a
device it was shared with was removed from its owner's list.

Encrypting needs a session made ready by a share that reached READY and not
expired since; otherwise `EncryptionRefused` (fail closed).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import vodozemac

from ._changes import ChangeBuilder, OutboundSessionRecord, RoomRecord, ShareRecord
from ._errors import EncryptionRefused, EncryptionRefusedReason
from ._inbound import RoomKey
from ._parts import Parts
from ._types import MEGOLM, OLM, Device, EncryptionSettings

__all__ = ["GroupSessionManager", "SharePlan"]

log = logging.getLogger("gapline.e2ee.outbound")

SHARED = "shared"
WITHHELD = "withheld"


@dataclass(slots=True)
class _Outbound:
    session: vodozemac.GroupSession
    session_id: str
    created_ms: int
    message_count: int
    settings: EncryptionSettings
    shares: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    ready: bool = False


@dataclass(frozen=True, slots=True)
class SharePlan:
    session_id: str
    rotated: bool
    need_session: tuple[Device, ...]  # no Olm session yet: claim a one-time key
    can_share: tuple[Device, ...]  # have an Olm session and not the key yet
    unreachable_users: tuple[str, ...]


def _settings_json(settings: EncryptionSettings) -> str:
    return json.dumps(
        {
            "algorithm": settings.algorithm,
            "rotation_period_ms": settings.rotation_period_ms,
            "rotation_period_msgs": settings.rotation_period_msgs,
        },
        sort_keys=True,
    )


class GroupSessionManager:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._rooms: dict[str, dict[str, Any]] = {}
        self._sessions: dict[str, _Outbound] = {}
        self._dirty_rooms: set[str] = set()
        self._dirty_sessions: set[str] = set()
        self._removed: set[str] = set()
        self._new_shares: list[ShareRecord] = []

    # -- loading and saving ----------------------------------------------------------------

    def load(
        self,
        rooms: Iterable[RoomRecord],
        sessions: Iterable[OutboundSessionRecord],
        shares: Iterable[ShareRecord],
    ) -> None:
        for room in rooms:
            self._rooms[room.room_id] = json.loads(room.settings_json)
        for r in sessions:
            session = vodozemac.GroupSession.from_pickle(r.pickle, self._parts.keys.pickle_key)
            if session.session_id != r.session_id:
                raise ValueError(f"outbound session row {r.session_id} holds {session.session_id}")
            settings = EncryptionSettings.from_content(json.loads(r.settings_json))
            self._sessions[r.room_id] = _Outbound(
                session, r.session_id, r.created_ms, r.message_count, settings
            )
        for s in shares:
            outbound = self._sessions.get(s.room_id)
            if outbound is not None and outbound.session_id == s.session_id:
                outbound.shares[(s.user_id, s.device_id)] = (s.status, s.message_index)

    def drain(self, out: ChangeBuilder) -> None:
        out.add(
            "rooms",
            *(
                RoomRecord(r, json.dumps(self._rooms[r], sort_keys=True))
                for r in sorted(self._dirty_rooms)
            ),
        )
        out.add("outbound_removed", *sorted(self._removed - set(self._sessions)))
        for room_id in sorted(self._dirty_sessions):
            o = self._sessions[room_id]
            out.add(
                "outbound_sessions",
                OutboundSessionRecord(
                    room_id,
                    o.session_id,
                    o.session.pickle(self._parts.keys.pickle_key),
                    o.created_ms,
                    o.message_count,
                    _settings_json(o.settings),
                ),
            )
        out.add("shares", *self._new_shares)
        self._dirty_rooms.clear()
        self._dirty_sessions.clear()
        self._removed.clear()
        self._new_shares = []

    @property
    def dirty(self) -> bool:
        return bool(self._dirty_rooms or self._dirty_sessions or self._removed or self._new_shares)

    # -- rooms ------------------------------------------------------------------------------------

    def set_room_encryption(self, room_id: str, content: dict[str, Any]) -> None:
        """Record ``m.room.encryption``; new settings retire the room's current session."""
        if self._rooms.get(room_id) == content:
            return
        self._rooms[room_id] = dict(content)
        self._dirty_rooms.add(room_id)
        outbound = self._sessions.get(room_id)
        if outbound is not None and outbound.settings != EncryptionSettings.from_content(content):
            self.invalidate(room_id, "the room's encryption settings changed")

    def settings(self, room_id: str) -> EncryptionSettings | None:
        content = self._rooms.get(room_id)
        return None if content is None else EncryptionSettings.from_content(content)

    def encrypted_rooms(self) -> list[str]:
        return sorted(self._rooms)

    def session_id(self, room_id: str) -> str | None:
        outbound = self._sessions.get(room_id)
        return None if outbound is None else outbound.session_id

    def invalidate(self, room_id: str, why: str) -> None:
        if self._sessions.pop(room_id, None) is not None:
            log.info("outbound session of %s retired: %s", room_id, why)
            self._dirty_sessions.discard(room_id)
            self._removed.add(room_id)
            self._new_shares = [s for s in self._new_shares if s.room_id != room_id]

    def member_left(self, room_id: str, user_id: str) -> None:
        outbound = self._sessions.get(room_id)
        if outbound is not None and any(
            u == user_id and st == SHARED for (u, _), (st, _) in outbound.shares.items()
        ):
            self.invalidate(room_id, f"{user_id} left")

    def devices_removed(self, removed: Iterable[tuple[str, str]]) -> None:
        gone = set(removed)
        for room_id, outbound in list(self._sessions.items()):
            if any(pair in gone and st == SHARED for pair, (st, _) in outbound.shares.items()):
                self.invalidate(room_id, "a device it was shared with was removed")

    # -- sharing ----------------------------------------------------------------------------------

    def _expired(
        self, outbound: _Outbound, settings: EncryptionSettings, now_ms: int
    ) -> str | None:
        if outbound.settings != settings:
            return "the room's encryption settings changed"
        if outbound.message_count >= settings.rotation_period_msgs:
            return f"{outbound.message_count} messages reached rotation_period_msgs"
        if now_ms - outbound.created_ms >= settings.rotation_period_ms:
            return "rotation_period_ms passed"
        return None

    def _require_settings(self, room_id: str) -> EncryptionSettings:
        settings = self.settings(room_id)
        if settings is None:
            raise EncryptionRefused(room_id, EncryptionRefusedReason.NOT_ENCRYPTED)
        if settings.algorithm != MEGOLM:
            raise EncryptionRefused(
                room_id, EncryptionRefusedReason.UNSUPPORTED_ALGORITHM, repr(settings.algorithm)
            )
        return settings

    def plan(
        self, room_id: str, users: Iterable[str], allow: Callable[[Device], bool] | None = None
    ) -> SharePlan:
        """Decide who needs the room's session; creates or rotates the session first.
        ``allow`` narrows the recipients (the sharing policy); one it drops rotates the session."""
        settings = self._require_settings(room_id)
        now = self._parts.clock()
        members = set(users) | {self._parts.account.user_id}
        recipients = [
            d
            for user in sorted(members)
            for d in self._parts.devices.devices_of(user)
            if d.device_id != self._parts.account.device_id
            or d.user_id != self._parts.account.user_id
            if OLM in d.algorithms and (allow is None or allow(d))
        ]
        current = {(d.user_id, d.device_id) for d in recipients}
        outbound = self._sessions.get(room_id)
        why = None if outbound is None else self._expired(outbound, settings, now)
        if outbound is not None and why is None:
            for pair, (status, _) in outbound.shares.items():
                if status == SHARED and pair not in current:
                    why = f"{pair[0]} {pair[1]} is no longer a recipient"
                    break
        rotated = False
        if outbound is None or why is not None:
            if outbound is not None:
                self.invalidate(room_id, str(why))
            outbound = self._new_session(room_id, settings, now)
            rotated = True
        # A withheld device is pending again: one moment without one-time keys must not
        # keep it out of the session until the next rotation.
        pending = [
            d
            for d in recipients
            if outbound.shares.get((d.user_id, d.device_id), (WITHHELD, 0))[0] == WITHHELD
        ]
        need = tuple(d for d in pending if not self._parts.olm.has_session(d.curve25519))
        can = tuple(d for d in pending if self._parts.olm.has_session(d.curve25519))
        withheld = {pair for pair, (st, _) in outbound.shares.items() if st == WITHHELD}
        reachable = (
            {d.user_id for d in (*need, *can) if (d.user_id, d.device_id) not in withheld}
            | {d.user_id for d in can}
            | {u for (u, _), (st, _) in outbound.shares.items() if st == SHARED}
        )
        unreachable = tuple(sorted(members - reachable - {self._parts.account.user_id}))
        return SharePlan(outbound.session_id, rotated, need, can, unreachable)

    def _new_session(self, room_id: str, settings: EncryptionSettings, now_ms: int) -> _Outbound:
        session = vodozemac.GroupSession()
        outbound = _Outbound(session, session.session_id, now_ms, 0, settings)
        self._sessions[room_id] = outbound
        self._dirty_sessions.add(room_id)
        self._removed.discard(room_id)
        a = self._parts.account
        # Our own inbound copy, so this device reads its own messages.
        self._parts.inbound.add(
            RoomKey(
                room_id,
                session.session_id,
                session.session_key.to_base64(),
                a.curve25519,
                a.ed25519,
                a.user_id,
                a.device_id,
            )
        )
        log.info("new outbound session %s for %s", session.session_id, room_id)
        return outbound

    def share(
        self, room_id: str, devices: Iterable[Device]
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """Olm-encrypt the room's session key to each device: ``{user: {device: content}}``."""
        outbound = self._sessions[room_id]
        now = self._parts.clock()
        a = self._parts.account
        key_content = {
            "algorithm": MEGOLM,
            "room_id": room_id,
            "session_id": outbound.session_id,
            "session_key": outbound.session.session_key.to_base64(),
        }
        index = outbound.session.message_index
        messages: dict[str, dict[str, dict[str, Any]]] = {}
        for d in devices:
            payload = {
                "type": "m.room_key",
                "content": key_content,
                "sender": a.user_id,
                "sender_device": a.device_id,
                "keys": {"ed25519": a.ed25519},
                "recipient": d.user_id,
                "recipient_keys": {"ed25519": d.ed25519},
            }
            ciphertext = self._parts.olm.encrypt(d.curve25519, json.dumps(payload).encode(), now)
            messages.setdefault(d.user_id, {})[d.device_id] = {
                "algorithm": OLM,
                "sender_key": a.curve25519,
                "ciphertext": {d.curve25519: ciphertext},
                "org.matrix.msgid": uuid.uuid4().hex,
            }
            self._record_share(room_id, outbound, d, SHARED, index)
        return messages

    def withhold(
        self, room_id: str, devices: Iterable[Device]
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """``m.room_key.withheld`` (``m.no_olm``) for devices no Olm channel could be made to."""
        outbound = self._sessions[room_id]
        a = self._parts.account
        messages: dict[str, dict[str, dict[str, Any]]] = {}
        for d in devices:
            if outbound.shares.get((d.user_id, d.device_id), (SHARED, 0))[0] == WITHHELD:
                continue  # told once for this session
            messages.setdefault(d.user_id, {})[d.device_id] = {
                "algorithm": MEGOLM,
                "code": "m.no_olm",
                "reason": "Unable to establish a secure channel (no one-time key).",
                "room_id": room_id,
                "session_id": outbound.session_id,
                "sender_key": a.curve25519,
                "from_device": a.device_id,
            }
            self._record_share(room_id, outbound, d, WITHHELD, outbound.session.message_index)
        return messages

    def _record_share(
        self, room_id: str, outbound: _Outbound, d: Device, status: str, index: int
    ) -> None:
        outbound.shares[(d.user_id, d.device_id)] = (status, index)
        self._new_shares.append(
            ShareRecord(room_id, outbound.session_id, d.user_id, d.device_id, status, index)
        )

    def mark_ready(self, room_id: str) -> None:
        self._sessions[room_id].ready = True

    def shared_with(self, room_id: str) -> dict[tuple[str, str], str]:
        outbound = self._sessions.get(room_id)
        return {} if outbound is None else {pair: st for pair, (st, _) in outbound.shares.items()}

    # -- encrypting -------------------------------------------------------------------------------

    def encrypt(self, room_id: str, event_type: str, content: dict[str, Any]) -> dict[str, Any]:
        settings = self._require_settings(room_id)
        outbound = self._sessions.get(room_id)
        if outbound is None or not outbound.ready:
            raise EncryptionRefused(
                room_id,
                EncryptionRefusedReason.NOT_SHARED,
                "call share_room_key until it is READY, and send its requests",
            )
        why = self._expired(outbound, settings, self._parts.clock())
        if why is not None:
            raise EncryptionRefused(room_id, EncryptionRefusedReason.EXPIRED, why)
        inner = dict(content)
        relates = inner.pop("m.relates_to", None)
        plaintext = json.dumps({"type": event_type, "content": inner, "room_id": room_id})
        ciphertext = outbound.session.encrypt(plaintext.encode()).to_base64()
        outbound.message_count += 1
        self._dirty_sessions.add(room_id)
        out: dict[str, Any] = {
            "algorithm": MEGOLM,
            "ciphertext": ciphertext,
            "session_id": outbound.session_id,
            "sender_key": self._parts.account.curve25519,
            "device_id": self._parts.account.device_id,
        }
        if relates is not None:
            out["m.relates_to"] = relates  # in the clear, so the server can aggregate relations
        return out
