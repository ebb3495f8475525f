"""`InboundGroupSessions`: Megolm room keys others gave us, and room-event decryption.

Rules:

- A room key is stored under (room, session ID) with the Curve25519 key of the
  Olm channel that delivered it (for a forwarded key: the original sender's
  key, plus the chain of devices it passed through) and the sender's claimed
  Ed25519 key. A key whose session ID is not the session it opens, or that
  names another sender than the session already stored, is refused. A second
  copy replaces the first only when it reaches further back (lower first
  known index), or is the sender's own copy of a forwarded one.
- ``m.room_key.withheld`` is remembered for a session we have no key for; it
  is dropped when the key arrives.
- Decrypting an event: the session must be there (else `MissingRoomKey`, or
  `Withheld` with the sender's code), know the message's index (else
  `UnknownMessageIndex`), and the ciphertext must decode and verify (else
  `Malformed`). The plaintext must name this room. Each (session, index) is
  bound to the first event ID that used it: another event at the same index is
  a replay and is refused. An event whose sender is not the session's owner is
  refused (`Untrusted`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import vodozemac

from gapline.matrix import ClientEvent

from ._changes import ChangeBuilder, InboundSessionRecord, SeenRecord, WithheldRecord
from ._megolm_worker import RawDecryption, decrypt_one
from ._secrets import CryptoKeys
from ._types import (
    MEGOLM,
    DecryptedEvent,
    Device,
    Refusal,
    RefusalCode,
    TrustLevel,
    UnableToDecrypt,
    UtdReason,
)

__all__ = ["InboundGroupSessions", "RoomKey"]

log = logging.getLogger("gapline.e2ee.megolm")

_decode = msgspec.json.Decoder().decode  # several times faster than json.loads per event


@dataclass(frozen=True, slots=True)
class RoomKey:
    """A Megolm session key as received (``m.room_key`` or ``m.forwarded_room_key``)."""

    room_id: str
    session_id: str
    session_key: str
    sender_key: str  # Curve25519 key of the session's original sender
    signing_key: str  # the original sender's claimed Ed25519 key
    sender_user: str | None
    sender_device: str | None
    forwarded: bool = False
    forwarding_chain: tuple[str, ...] = ()


@dataclass(slots=True)
class _Inbound:
    session: vodozemac.InboundGroupSession
    key: RoomKey
    first_known_index: int


class InboundGroupSessions:
    def __init__(self, keys: CryptoKeys, device_for_curve: Callable[[str], Device | None]) -> None:
        self._keys = keys
        self._device_for_curve = device_for_curve
        self._sessions: dict[tuple[str, str], _Inbound] = {}
        self._withheld: dict[tuple[str, str], WithheldRecord] = {}
        self._seen: dict[str, dict[int, bytes]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._dirty_withheld: set[tuple[str, str]] = set()
        self._withheld_removed: set[tuple[str, str]] = set()
        self._new_seen: list[SeenRecord] = []
        # Called with (room, session) whenever a new or better key is stored (key backup).
        self.on_stored: list[Callable[[tuple[str, str]], None]] = []

    # -- loading and saving ----------------------------------------------------------------

    def load(
        self,
        sessions: Iterable[InboundSessionRecord],
        withheld: Iterable[WithheldRecord],
        seen: Iterable[SeenRecord],
    ) -> None:
        for r in sessions:
            session = vodozemac.InboundGroupSession.from_pickle(r.pickle, self._keys.pickle_key)
            if session.session_id != r.session_id:
                raise ValueError(f"inbound session row {r.session_id} holds {session.session_id}")
            key = RoomKey(
                r.room_id,
                r.session_id,
                "",
                r.sender_key,
                r.signing_key,
                r.sender_user,
                r.sender_device,
                r.forwarded,
                tuple(json.loads(r.forwarding_chain_json)),
            )
            self._sessions[(r.room_id, r.session_id)] = _Inbound(session, key, r.first_known_index)
        for w in withheld:
            self._withheld[(w.room_id, w.session_id)] = w
        for s in seen:
            self._seen.setdefault(s.session_id, {})[s.message_index] = s.event_digest

    def drain(self, out: ChangeBuilder) -> None:
        for ident in sorted(self._dirty):
            entry = self._sessions[ident]
            k = entry.key
            out.add(
                "inbound_sessions",
                InboundSessionRecord(
                    k.room_id,
                    k.session_id,
                    k.sender_key,
                    k.signing_key,
                    k.sender_user,
                    k.sender_device,
                    k.forwarded,
                    json.dumps(list(k.forwarding_chain)),
                    entry.first_known_index,
                    entry.session.pickle(self._keys.pickle_key),
                ),
            )
        out.add("withheld", *(self._withheld[i] for i in sorted(self._dirty_withheld)))
        out.add("withheld_removed", *sorted(self._withheld_removed))
        out.add("seen", *self._new_seen)
        self._dirty.clear()
        self._dirty_withheld.clear()
        self._withheld_removed.clear()
        self._new_seen = []

    @property
    def dirty(self) -> bool:
        return bool(self._dirty or self._dirty_withheld or self._withheld_removed or self._new_seen)

    def has_session(self, room_id: str, session_id: str) -> bool:
        return (room_id, session_id) in self._sessions

    def first_known_index(self, room_id: str, session_id: str) -> int | None:
        entry = self._sessions.get((room_id, session_id))
        return None if entry is None else entry.first_known_index

    def withheld(self, room_id: str, session_id: str) -> WithheldRecord | None:
        return self._withheld.get((room_id, session_id))

    def identifiers(self) -> list[tuple[str, str]]:
        return sorted(self._sessions)

    def export(self, room_id: str, session_id: str) -> tuple[RoomKey, int] | None:
        """The session's key exported at its first known index (secret), and that index."""
        entry = self._sessions.get((room_id, session_id))
        if entry is None:
            return None
        exported = entry.session.export_at(entry.first_known_index)
        if exported is None:
            return None
        return replace(entry.key, session_key=exported.to_base64()), entry.first_known_index

    def worker_pickle(self, room_id: str, session_id: str, key: bytes) -> str | None:
        """The session pickled under ``key`` (a worker's own, never stored), for the
        worker process that decrypts a large heal beside this one."""
        entry = self._sessions.get((room_id, session_id))
        return None if entry is None else entry.session.pickle(key)

    # -- receiving keys ---------------------------------------------------------------------------

    def add(self, key: RoomKey) -> bool | Refusal:
        """Store a room key; ``True`` if it is new or better, ``False`` if we had as good."""
        try:
            if key.forwarded:
                session = vodozemac.InboundGroupSession.import_session(
                    vodozemac.ExportedSessionKey(key.session_key)
                )
            else:
                session = vodozemac.InboundGroupSession(vodozemac.SessionKey(key.session_key))
        except (vodozemac.SessionKeyDecodeException, ValueError) as exc:
            return Refusal(
                RefusalCode.MALFORMED, f"room key does not decode: {exc}", key.sender_user
            )
        if session.session_id != key.session_id:
            return Refusal(
                RefusalCode.SESSION_MISMATCH,
                f"room key names session {key.session_id} but opens {session.session_id}",
                key.sender_user,
            )
        ident = (key.room_id, key.session_id)
        known = self._sessions.get(ident)
        if known is not None:
            if known.key.sender_key != key.sender_key or known.key.signing_key != key.signing_key:
                return Refusal(
                    RefusalCode.SESSION_MISMATCH,
                    f"session {key.session_id} is already known from another sender",
                    key.sender_user,
                )
            better_index = session.first_known_index < known.first_known_index
            unforwarded = known.key.forwarded and not key.forwarded
            if not (
                better_index
                or (unforwarded and session.first_known_index <= known.first_known_index)
            ):
                return False
        self._sessions[ident] = _Inbound(session, key, session.first_known_index)
        self._dirty.add(ident)
        for listener in self.on_stored:
            listener(ident)
        if ident in self._withheld:
            del self._withheld[ident]
            self._dirty_withheld.discard(ident)
            self._withheld_removed.add(ident)
        return True

    def add_withheld(self, record: WithheldRecord) -> bool:
        ident = (record.room_id, record.session_id)
        if ident in self._sessions or self._withheld.get(ident) == record:
            return False
        self._withheld[ident] = record
        self._dirty_withheld.add(ident)
        self._withheld_removed.discard(ident)
        return True

    # -- decrypting room events -------------------------------------------------------------------

    def decrypt(self, room_id: str, event: ClientEvent) -> DecryptedEvent | UnableToDecrypt:
        return self.decrypt_many(room_id, (event,))[0]

    def decrypt_many(
        self,
        room_id: str,
        events: Iterable[ClientEvent],
        raw: Sequence[RawDecryption | None] | None = None,
    ) -> list[DecryptedEvent | UnableToDecrypt]:
        """Decrypt a room's events in order. A session is looked up and its sender's trust
        worked out once per call (a heal is thousands of events of one session), and
        nothing but the checks runs per event.

        ``raw``, one per event, holds the vodozemac results another process made with a
        copy of the session (`worker_pickle`); None (or no entry) means the call is made
        here. Every check is the same either way: only where the call ran differs."""
        sessions: dict[str, tuple[_Inbound, TrustLevel] | None] = {}
        seen_of = self._seen
        digest = self._keys.event_digest
        out: list[DecryptedEvent | UnableToDecrypt] = []
        append = out.append
        for position, event in enumerate(events):
            content = event.content
            sid = content.get("session_id")
            if not isinstance(sid, str):
                sid = None
            if content.get("algorithm") != MEGOLM:
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.MALFORMED,
                        f"not a Megolm event: {content.get('algorithm')!r}",
                        RefusalCode.UNSUPPORTED_ALGORITHM,
                    )
                )
                continue
            ciphertext = content.get("ciphertext")
            if sid is None or not isinstance(ciphertext, str):
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.MALFORMED,
                        "no session_id or ciphertext",
                        RefusalCode.MALFORMED,
                    )
                )
                continue
            if sid in sessions:
                known = sessions[sid]
            else:
                entry = self._sessions.get((room_id, sid))
                known = sessions[sid] = None if entry is None else (entry, self._trust(entry.key))
            if known is None:
                append(self._missing(event, room_id, sid))
                continue
            entry, trust = known
            key = entry.key
            claimed = content.get("sender_key")
            if isinstance(claimed, str) and claimed != key.sender_key:
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.MALFORMED,
                        "the event names another sender key than its session",
                        RefusalCode.SESSION_MISMATCH,
                    )
                )
                continue
            got = None if raw is None else raw[position]
            if got is None:
                got = decrypt_one(entry.session, ciphertext)
            index = got.index
            if index < 0:
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.MALFORMED,
                        f"ciphertext does not decode: {got.error}",
                        RefusalCode.MALFORMED,
                    )
                )
                continue
            if index < entry.first_known_index:
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.UNKNOWN_MESSAGE_INDEX,
                        f"index {index} precedes the first known index {entry.first_known_index}",
                    )
                )
                continue
            if got.plaintext is None:
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.MALFORMED,
                        f"Megolm decryption failed: {got.error}",
                        RefusalCode.MALFORMED,
                    )
                )
                continue
            seen = seen_of.setdefault(sid, {})
            first = seen.get(index)
            mine = digest(event.event_id)
            if first is not None and first != mine:
                append(
                    _utd(
                        event,
                        room_id,
                        sid,
                        UtdReason.MALFORMED,
                        f"message index {index} of this session was already used by another"
                        " event (replay)",
                        RefusalCode.MEGOLM_REPLAY,
                    )
                )
                continue
            result = self._checked(event, room_id, entry, trust, index, got.plaintext)
            if first is None and isinstance(result, DecryptedEvent):
                seen[index] = mine
                self._new_seen.append(SeenRecord(sid, index, mine))
            append(result)
        return out

    def _missing(self, event: ClientEvent, room_id: str, sid: str) -> UnableToDecrypt:
        withheld = self._withheld.get((room_id, sid))
        if withheld is not None:
            return _utd(
                event, room_id, sid, UtdReason.WITHHELD, withheld.reason, code=withheld.code
            )
        return _utd(event, room_id, sid, UtdReason.MISSING_ROOM_KEY, "no key for this session")

    @staticmethod
    def _checked(
        event: ClientEvent,
        room_id: str,
        entry: _Inbound,
        trust: TrustLevel,
        index: int,
        plaintext: bytes,
    ) -> DecryptedEvent | UnableToDecrypt:
        """The decrypted payload, if it is an event of this room sent by the session's
        owner."""
        sid = entry.key.session_id
        try:
            payload: Any = _decode(plaintext)
        except msgspec.DecodeError as exc:
            return _utd(
                event,
                room_id,
                sid,
                UtdReason.MALFORMED,
                f"plaintext is not JSON: {exc}",
                RefusalCode.MALFORMED,
            )
        inner = payload.get("content") if isinstance(payload, dict) else None
        if not (isinstance(inner, dict) and isinstance(payload.get("type"), str)):
            return _utd(
                event,
                room_id,
                sid,
                UtdReason.MALFORMED,
                "plaintext lacks type or content",
                RefusalCode.MALFORMED,
            )
        if payload.get("room_id") != room_id:
            return _utd(
                event,
                room_id,
                sid,
                UtdReason.MALFORMED,
                f"plaintext names room {payload.get('room_id')!r}",
                RefusalCode.MISMATCHED_IDS,
            )
        key = entry.key
        if key.sender_user is not None and key.sender_user != event.sender:
            return _utd(
                event,
                room_id,
                sid,
                UtdReason.UNTRUSTED,
                f"sent by {event.sender} with a session of {key.sender_user}",
                RefusalCode.SENDER_MISMATCH,
            )
        relates = event.content.get("m.relates_to")
        if relates is not None and "m.relates_to" not in inner:
            inner = {**inner, "m.relates_to": relates}
        return DecryptedEvent(
            event.event_id,
            room_id,
            event.sender,
            payload["type"],
            inner,
            sid,
            index,
            key.sender_key,
            key.sender_device,
            trust,
            key.forwarded,
        )

    def _trust(self, key: RoomKey) -> TrustLevel:
        if key.forwarded:
            return TrustLevel.UNSIGNED  # a forwarded key proves nothing about who first sent it
        device = self._device_for_curve(key.sender_key)
        if device is None or device.ed25519 != key.signing_key:
            return TrustLevel.UNSIGNED
        return device.trust


def _utd(
    event: ClientEvent,
    room_id: str,
    sid: str | None,
    reason: UtdReason,
    detail: str,
    refusal: RefusalCode | None = None,
    code: str | None = None,
) -> UnableToDecrypt:
    if refusal is not None:
        log.warning("refused %s in %s from %s: %s", event.event_id, room_id, event.sender, detail)
    return UnableToDecrypt(event.event_id, room_id, sid, reason, detail, code, refusal)
