"""`OlmSessions`: the pairwise Olm sessions with other devices, keyed by their Curve25519 key.

Decryption rules (``m.olm.v1.curve25519-aes-sha2``):

- a pre-key message (type 0) first goes to an existing session it matches;
  if none matches, it opens a new inbound session, which consumes the
  one-time key it names. A replayed pre-key message therefore fails twice
  over: its message key is used up in the matching session, and its
  one-time key is gone;
- a normal message (type 1) is tried on each session with that device,
  newest first; a replay fails because its message key was used up;
- a failed decryption never advances a ratchet.

To encrypt, the most recently used session with the device is taken.
Every session touched is marked dirty; its pickle goes into the step's `Changes`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import vodozemac

from ._account import AccountMachine
from ._canonical import b64decode, b64encode
from ._changes import ChangeBuilder, OlmSessionRecord
from ._secrets import CryptoKeys
from ._types import RefusalCode

__all__ = ["OlmFailure", "OlmSessions"]


class OlmFailure(Exception):
    """An Olm message that could not be decrypted, with the rule it broke."""

    def __init__(self, code: RefusalCode, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(detail)


@dataclass(slots=True)
class _Entry:
    session: vodozemac.Session
    session_id: str
    created_ms: int
    last_used_ms: int


class OlmSessions:
    def __init__(self, account: AccountMachine) -> None:
        self._account = account
        self._sessions: dict[str, list[_Entry]] = {}
        self._dirty: set[tuple[str, str]] = set()

    def load(self, records: Iterable[OlmSessionRecord], keys: CryptoKeys) -> None:
        for r in records:
            session = vodozemac.Session.from_pickle(r.pickle, keys.pickle_key)
            if session.session_id != r.session_id:
                raise ValueError(
                    f"Olm session row {r.session_id} holds session {session.session_id}"
                )
            self._sessions.setdefault(r.sender_key, []).append(
                _Entry(session, r.session_id, r.created_ms, r.last_used_ms)
            )

    def drain(self, out: ChangeBuilder, keys: CryptoKeys) -> None:
        for sender_key, session_id in sorted(self._dirty):
            entry = next(e for e in self._sessions[sender_key] if e.session_id == session_id)
            out.add(
                "olm_sessions",
                OlmSessionRecord(
                    sender_key,
                    session_id,
                    entry.session.pickle(keys.pickle_key),
                    entry.created_ms,
                    entry.last_used_ms,
                ),
            )
        self._dirty.clear()

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def has_session(self, curve25519: str) -> bool:
        return bool(self._sessions.get(curve25519))

    def session_count(self, curve25519: str) -> int:
        return len(self._sessions.get(curve25519, ()))

    def _touch(self, sender_key: str, entry: _Entry, now_ms: int) -> None:
        entry.last_used_ms = max(now_ms, entry.last_used_ms)
        self._dirty.add((sender_key, entry.session_id))

    def _newest_first(self, sender_key: str) -> list[_Entry]:
        return sorted(
            self._sessions.get(sender_key, ()),
            key=lambda e: (e.last_used_ms, e.created_ms),
            reverse=True,
        )

    # -- decryption ---------------------------------------------------------------------------

    def decrypt(self, sender_key: str, message_type: object, body: object, now_ms: int) -> bytes:
        """Decrypt one Olm ciphertext addressed to us, or raise `OlmFailure`."""
        if not isinstance(body, str):
            raise OlmFailure(RefusalCode.MALFORMED, "Olm ciphertext body is not a string")
        try:
            identity = vodozemac.Curve25519PublicKey.from_base64(sender_key)
            if message_type == 0:
                return self._decrypt_pre_key(sender_key, identity, body, now_ms)
            if message_type == 1:
                message = vodozemac.AnyOlmMessage.normal(b64decode(body))
            else:
                raise OlmFailure(
                    RefusalCode.MALFORMED, f"unknown Olm message type {message_type!r}"
                )
        except (vodozemac.KeyException, vodozemac.DecodeException, ValueError) as exc:
            if isinstance(exc, OlmFailure):
                raise
            raise OlmFailure(RefusalCode.MALFORMED, f"malformed Olm message: {exc}") from None
        for entry in self._newest_first(sender_key):
            try:
                plaintext = entry.session.decrypt(message)
            except vodozemac.OlmDecryptionException:
                continue
            self._touch(sender_key, entry, now_ms)
            return plaintext
        raise OlmFailure(
            RefusalCode.OLM_UNDECRYPTABLE,
            f"no Olm session with {sender_key} decrypts this message "
            f"({self.session_count(sender_key)} tried; a replay, or a session we lost)",
        )

    def _decrypt_pre_key(
        self, sender_key: str, identity: vodozemac.Curve25519PublicKey, body: str, now_ms: int
    ) -> bytes:
        pre_key = vodozemac.PreKeyMessage.from_base64(body)
        for entry in self._sessions.get(sender_key, ()):
            if entry.session.session_matches(pre_key):
                try:
                    plaintext = entry.session.decrypt(pre_key.to_any())
                except vodozemac.OlmDecryptionException as exc:
                    raise OlmFailure(
                        RefusalCode.OLM_REPLAY,
                        f"pre-key message for an existing session failed: {exc}",
                    ) from None
                self._touch(sender_key, entry, now_ms)
                return plaintext
        try:
            session, plaintext = self._account.create_inbound_session(identity, pre_key)
        except (vodozemac.SessionCreationException, vodozemac.OlmDecryptionException) as exc:
            raise OlmFailure(
                RefusalCode.OLM_REPLAY,
                f"pre-key message opens no session (its one-time key is used or unknown): {exc}",
            ) from None
        entry = _Entry(session, session.session_id, now_ms, now_ms)
        self._sessions.setdefault(sender_key, []).append(entry)
        self._touch(sender_key, entry, now_ms)
        return plaintext

    # -- encryption ---------------------------------------------------------------------------

    def add_outbound(self, curve25519: str, one_time_key: str, now_ms: int) -> None:
        """Open a session to a device from a one-time key it published (after ``/keys/claim``)."""
        session = self._account.create_outbound_session(curve25519, one_time_key)
        entry = _Entry(session, session.session_id, now_ms, now_ms)
        self._sessions.setdefault(curve25519, []).append(entry)
        self._touch(curve25519, entry, now_ms)

    def encrypt(self, curve25519: str, plaintext: bytes, now_ms: int) -> dict[str, object]:
        """Encrypt with the newest session to that device: ``{"type": 0|1, "body": b64}``."""
        entries = self._newest_first(curve25519)
        if not entries:
            raise LookupError(f"no Olm session with {curve25519}")
        entry = entries[0]
        message_type, ciphertext = entry.session.encrypt(plaintext).to_parts()
        self._touch(curve25519, entry, now_ms)
        return {"type": message_type, "body": b64encode(ciphertext)}
