"""An approval card on the wire, and how an answer to one reads (pure).

A card is a message the bot posts asking a human to approve one exact tool call. It
replies to the message whose turn asks (inside its thread), names the call in its
body and carries it under ``io.gapline.approval``. An allowed approver answers by
replying to the card (``approve`` / ``deny``, or yes / no) or by reacting to it
(✅ 👍 approve, ❌ 👎 deny). The decision is shown by one edit of the card (its
resolution), which the outbox delivers like any final edit.

Everything here is pure: the store builds resolution edits inside its transactions
(a membership fence cancels cards of other principals), and ingress and the
dispatcher read answers with the same functions.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gapline.journal._types import Decision, ToolCall

__all__ = [
    "APPROVAL_KEY",
    "APPROVE_WORDS",
    "DENY_WORDS",
    "RelatedAnswer",
    "approval_id_for",
    "card_content",
    "decision_of",
    "related_answer",
    "resolution_content",
]

APPROVAL_KEY = "io.gapline.approval"

APPROVE_WORDS = frozenset({"approve", "approved", "yes", "y", "ok", "✅", "👍", "✔"})
DENY_WORDS = frozenset({"deny", "denied", "no", "n", "reject", "❌", "👎", "✖"})

_VERDICT = {
    Decision.APPROVED: "Approved",
    Decision.DENIED: "Denied",
    Decision.EXPIRED: "Expired",
    Decision.CANCELLED: "Cancelled",
}


def approval_id_for(
    principal_id: str, turn_id: str, ordinal: int, call: ToolCall, *, key: bytes | None = None
) -> str:
    """The approval asked for the ``ordinal``-th time in a turn, for exactly ``call``.

    Derived, never random: a turn rerun after a crash asks the same calls in the same
    order and finds the cards (and decisions) it already has. With ``key`` (a sealed
    journal's, `Sealing.id_key`) it is an HMAC under it: the principal, the turn and the
    ordinal are in the clear, so a plain hash would let anyone who reads the database,
    or the homeserver that sees the transaction ids derived from it, confirm a guessed
    call by hashing the guess.
    """
    joined = "\x1f".join((principal_id, turn_id, str(ordinal), call.digest())).encode()
    if key is None:
        return "ap" + hashlib.sha256(joined).hexdigest()[:40]
    return "ap" + hmac.new(key, joined, hashlib.sha256).hexdigest()[:40]


def _call_text(call: ToolCall) -> str:
    return f"{call.name}({call.canonical_arguments()})"


def card_content(
    approval_id: str,
    call: ToolCall,
    approvers: Iterable[str],
    *,
    source_event_id: str,
    thread_id: str | None,
) -> dict[str, Any]:
    """The card: a reply to the asking message (in its thread), naming the exact call."""
    allowed = sorted(approvers)
    relates: dict[str, Any] = {"m.in_reply_to": {"event_id": source_event_id}}
    if thread_id is not None:
        relates.update({"rel_type": "m.thread", "event_id": thread_id, "is_falling_back": False})
    return {
        "msgtype": "m.notice",
        "body": (
            f"Approval needed: {_call_text(call)}\n"
            f'Reply "approve" or "deny" to this message, or react ✅ or ❌ '
            f"({', '.join(allowed)} may decide)."
        ),
        APPROVAL_KEY: {
            "approval_id": approval_id,
            "tool": call.name,
            "arguments": dict(call.arguments),
            "approvers": allowed,
        },
        "m.relates_to": relates,
    }


def resolution_content(
    card_event_id: str,
    approval_id: str,
    call: ToolCall | None,
    decision: Decision,
    *,
    by: str | None,
    reason: str | None,
) -> dict[str, Any]:
    """The card's one edit, showing the decision (a complete edit: never progress).
    ``call`` None: the edit names no call (its writer cannot read the sealed one)."""
    who = f" by {by}" if by else ""
    why = f" ({reason})" if reason else ""
    what = "" if call is None else f": {_call_text(call)}"
    body = f"{_VERDICT[decision]}{who}{why}{what}"
    marker = {"approval_id": approval_id, "decision": decision.value}
    new_content = {"msgtype": "m.notice", "body": body, APPROVAL_KEY: marker}
    return {
        "msgtype": "m.notice",
        "body": f"* {body}",
        "m.new_content": new_content,
        "m.relates_to": {"rel_type": "m.replace", "event_id": card_event_id},
        APPROVAL_KEY: marker,
    }


def _word(text: str) -> str:
    return text.strip().strip(".!,;:").replace("\ufe0f", "").lower()


def decision_of(text: str) -> Decision | None:
    """APPROVED or DENIED when ``text`` (a reply's body, a reaction's key) says so.

    A reply's quoted fallback (lines starting with ``>``) is not the answer; the first
    word of what remains is.
    """
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(">")]
    words = " ".join(lines).split()
    if not words:
        return None
    word = _word(words[0])
    if word in APPROVE_WORDS:
        return Decision.APPROVED
    if word in DENY_WORDS:
        return Decision.DENIED
    return None


@dataclass(frozen=True, slots=True)
class RelatedAnswer:
    """An event that answers another by relation: a reply's text or a reaction's key."""

    target_event_id: str
    text: str  # the reply's body, or the reaction's key
    reaction: bool


def related_answer(event_type: str, content: Mapping[str, Any]) -> RelatedAnswer | None:
    """The event a reply (``m.in_reply_to``) or a reaction (``m.annotation``) is about.

    An edit is no answer: it revises a message rather than saying something new; nor is a
    thread message whose ``m.in_reply_to`` is only the fallback for thread-unaware clients.
    """
    relates = content.get("m.relates_to")
    if not isinstance(relates, Mapping):
        return None
    if event_type == "m.reaction":
        target, key = relates.get("event_id"), relates.get("key")
        if relates.get("rel_type") == "m.annotation" and isinstance(target, str):
            return RelatedAnswer(target, key if isinstance(key, str) else "", reaction=True)
        return None
    if event_type != "m.room.message" or relates.get("rel_type") == "m.replace":
        return None
    if relates.get("rel_type") == "m.thread" and relates.get("is_falling_back") is True:
        return None  # a thread message's fallback names the thread's last event, not a reply
    reply = relates.get("m.in_reply_to")
    target = reply.get("event_id") if isinstance(reply, Mapping) else None
    if not isinstance(target, str):
        return None
    body = content.get("body")
    return RelatedAnswer(target, body if isinstance(body, str) else "", reaction=False)
