"""What an event *is* to the timeline: a row of its own, or a relation to another event.

Pure functions of one event (sans-I/O). They read only what a decrypted
event carries (``type``, ``state_key``, ``content``, ``unsigned``), so an
encrypted event, once decrypted, goes through the same rules:

- ``m.room.redaction`` redacts ``redacts``;
- ``m.relates_to`` with ``rel_type`` ``m.replace`` (an edit), ``m.annotation``
  (a reaction, with a ``key``) or ``m.thread`` (a thread reply) relates to
  ``event_id``; anything else (``m.reference``, unknown types) is no relation;
- a state event is never a relation: its ``m.relates_to`` is ignored;
- ``m.in_reply_to`` is a *reply*, not a relation that hides the event; in a
  thread reply with ``is_falling_back`` it is only the fallback for clients
  without threads and quotes nothing.

Edits, reactions, redactions and thread replies are never rows of the room's
main timeline (:func:`shown_in_room`); a thread reply is a row of its thread.
An edit whose ``m.new_content`` is not an object, or a reaction without a
key, is still not a row, and changes nothing: the rule that checks it is
:func:`relation_of`, which reports it as :attr:`Relation.valid` ``False``.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from gapline.matrix import ClientEvent

__all__ = [
    "REACTION",
    "REDACTION",
    "RelKind",
    "Relation",
    "is_redacted",
    "relation_of",
    "reply_target",
    "shown_in_room",
    "strip_reply_fallback",
]

REDACTION = "m.room.redaction"
REACTION = "m.reaction"


class RelKind(enum.Enum):
    REPLACE = "replace"
    ANNOTATION = "annotation"
    THREAD = "thread"
    REDACTION = "redaction"


class Relation(msgspec.Struct, frozen=True):
    """One event's relation: its kind, the event it relates to, and what it carries.

    ``valid`` is false for a relation whose shape is wrong (an edit without an
    ``m.new_content`` object, a reaction without a key): it stays hidden and
    applies nowhere.
    """

    kind: RelKind
    target: str
    key: str | None = None
    new_content: dict[str, Any] | None = None
    valid: bool = True


def _target(value: object) -> str | None:
    return value if isinstance(value, str) and value.startswith("$") and len(value) > 1 else None


def is_redacted(event: ClientEvent) -> bool:
    """The server redacted this event (its content is gone)."""
    return event.redacted_because is not None


def relation_of(event: ClientEvent) -> Relation | None:
    """The event's relation, or ``None`` for an event that is only itself."""
    if event.type == REDACTION:
        target = _target(event.redacted_event_id)
        return Relation(RelKind.REDACTION, target, valid=True) if target else None
    if event.state_key is not None:
        return None
    relates = event.content.get("m.relates_to")
    if not isinstance(relates, dict):
        return None
    target = _target(relates.get("event_id"))
    if target is None:
        return None
    match relates.get("rel_type"):
        case "m.replace":
            new = event.content.get("m.new_content")
            if isinstance(new, dict):
                return Relation(RelKind.REPLACE, target, new_content=new)
            return Relation(RelKind.REPLACE, target, valid=False)
        case "m.annotation":
            key = relates.get("key")
            if isinstance(key, str) and key and event.type == REACTION:
                return Relation(RelKind.ANNOTATION, target, key=key)
            return Relation(RelKind.ANNOTATION, target, valid=False)
        case "m.thread":
            return Relation(RelKind.THREAD, target)
    return None


def shown_in_room(event: ClientEvent, relation: Relation | None) -> bool:
    """Whether the event is a row of the room's main timeline."""
    if event.type in (REDACTION, REACTION):
        return False
    return relation is None


def reply_target(event: ClientEvent) -> str | None:
    """The event this one quotes as a reply, if any (a thread's fallback quotes nothing)."""
    if event.state_key is not None:
        return None
    relates = event.content.get("m.relates_to")
    if not isinstance(relates, dict):
        return None
    if relates.get("rel_type") == "m.thread" and relates.get("is_falling_back") is not False:
        return None
    reply = relates.get("m.in_reply_to")
    return _target(reply.get("event_id")) if isinstance(reply, dict) else None


def strip_reply_fallback(body: str) -> str:
    """Drop the quoted lines a rich reply puts before its own text (``> <@a:x> ...``
    then an empty line), as the spec asks clients to do before showing it."""
    if not body.startswith("> "):
        return body
    lines = body.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith(">"):
        i += 1
    if i < len(lines) and lines[i] == "":
        i += 1
    return "\n".join(lines[i:])
