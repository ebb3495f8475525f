"""How an encrypted event is kept in the cache: decrypted, or retained as ciphertext.

Pure functions (sans-I/O). Every ``m.room.encrypted`` event that enters the
cache passes :func:`as_cached` once, with the machine's result:

- decrypted: the event is kept as its plaintext event (type and content from
  the decryption, ``m.relates_to`` from the cleartext, where the spec puts it),
  so every relation rule applies to it as to any event;
- undecryptable: the ciphertext event itself is kept (the cache seals every
  body at rest), marked with the session and the reason, and indexed by
  session so it can heal when the key arrives.

The mark lives in ``unsigned`` under :data:`MARK`, a key only gapline writes:
every event from the server passes :func:`as_cached` or :func:`unmarked`, which
drop a mark the server may have put there, so a homeserver cannot make a
plaintext event look encrypted (or a UTD look decrypted).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gapline.e2ee import DecryptedEvent, UnableToDecrypt, UtdReason
from gapline.history._items import Undecrypted
from gapline.matrix import ClientEvent

__all__ = [
    "ENCRYPTED",
    "MARK",
    "as_cached",
    "awaits_key",
    "decryption_of",
    "is_undecrypted",
    "unmarked",
]

ENCRYPTED = "m.room.encrypted"
MARK = "io.gapline.decryption"


def unmarked(event: ClientEvent) -> ClientEvent:
    """The event without a mark the server put in ``unsigned`` (the common case: as is)."""
    if MARK not in event.unsigned:
        return event
    unsigned = {k: v for k, v in event.unsigned.items() if k != MARK}
    return msgspec.structs.replace(event, unsigned=unsigned)


def as_cached(event: ClientEvent, result: DecryptedEvent | UnableToDecrypt) -> ClientEvent:
    """The event as the cache keeps it, given what decrypting it gave."""
    unsigned = {k: v for k, v in event.unsigned.items() if k != MARK}
    if isinstance(result, UnableToDecrypt):
        unsigned[MARK] = {"session_id": result.session_id, "reason": result.reason.value}
        return msgspec.structs.replace(event, unsigned=unsigned)
    content: dict[str, Any] = dict(result.content)
    relates = event.content.get("m.relates_to")
    if isinstance(relates, dict):
        content["m.relates_to"] = relates  # the cleartext relation is the one servers index
    else:
        content.pop("m.relates_to", None)
    unsigned[MARK] = {}
    return msgspec.structs.replace(event, type=result.type, content=content, unsigned=unsigned)


def decryption_of(event: ClientEvent) -> tuple[bool, Undecrypted | None]:
    """Whether the event arrived encrypted, and why it has no body if it could not be
    decrypted."""
    mark = event.unsigned.get(MARK)
    if mark is None:
        if event.type != ENCRYPTED or event.redacted_because is not None:
            return event.type == ENCRYPTED, None
        # Never tried (an engine without a crypto machine): this client holds no key.
        session = event.content.get("session_id")
        return True, Undecrypted(
            session if isinstance(session, str) else "", UtdReason.MISSING_ROOM_KEY
        )
    if not isinstance(mark, dict) or "reason" not in mark:
        return True, None
    try:
        reason = UtdReason(mark["reason"])
    except ValueError:
        reason = UtdReason.MALFORMED
    session = mark.get("session_id")
    return True, Undecrypted(session if isinstance(session, str) else "", reason)


def is_undecrypted(event: ClientEvent) -> bool:
    """Retained as ciphertext, waiting for its key."""
    mark = event.unsigned.get(MARK)
    return isinstance(mark, dict) and "reason" in mark


def awaits_key(event: ClientEvent) -> bool:
    """Retained as ciphertext and decryptable once its key is here: marked undecryptable,
    or stored before this device decrypted anything (never tried, so unmarked)."""
    mark = event.unsigned.get(MARK)
    if mark is None:
        return (
            event.type == ENCRYPTED
            and event.state_key is None
            and event.unsigned.get("redacted_because") is None
        )
    return isinstance(mark, dict) and "reason" in mark
