"""Local echo rows: how a queued message shows in its timeline until the server's event
replaces it.

An echo's row id is ``echo:<transaction id>``; it stays the row's id after the
server's event takes the row's place (a ``Set`` diff), for as long as the
timeline is loaded, so a selection or a reader holding the row keeps it. Until
the server answers, the row's ``event_id`` is that same placeholder: nothing
can relate to an event that does not exist yet.

A queued reaction, edit or redaction is not a row while it waits: what it does
shows when the sync brings it, through the relation rules. Only once the
homeserver refused it for good does it become a row, so that the refusal is
seen and can be retried or discarded; its body says what it was ("reaction 👍",
"edit: new text", "deletion of a message").
"""

from __future__ import annotations

from gapline.history._items import EventItem, SendState
from gapline.history._render import formatting_of
from gapline.history._send_store import QueuedSend, SendRow
from gapline.history._updates import EchoPlaced, EchoRemoved

__all__ = ["ECHO_ORD", "ECHO_PREFIX", "echo_item", "echo_placed", "echo_update", "is_echo_id"]

ECHO_PREFIX = "echo:"
ECHO_ORD = 2**62
"""Echo rows sort after every event (section numbers never come near this)."""


def is_echo_id(row_id: str) -> bool:
    return row_id.startswith(ECHO_PREFIX)


def _what(queued: QueuedSend) -> str | None:
    if queued.is_message:
        return queued.body
    if queued.event_type == "m.room.redaction":
        return "deletion of a message"
    relates = queued.content.get("m.relates_to")
    if queued.event_type == "m.reaction" and isinstance(relates, dict):
        return f"reaction {relates.get('key', '')}"
    new = queued.content.get("m.new_content")
    if isinstance(new, dict) and isinstance(new.get("body"), str):
        return f"edit: {new['body']}"
    return queued.event_type


def echo_item(queued: QueuedSend, me: str | None) -> EventItem:
    """The row of a queued message (``Pending``, or ``Failed`` with why), or of a refused
    reaction, edit or redaction."""
    row_id = ECHO_PREFIX + queued.txn_id
    state = (
        SendState.failed(queued.failure or "the homeserver refused the message")
        if queued.state is SendRow.FAILED
        else SendState.PENDING
    )
    msgtype, html = formatting_of(queued.content) if queued.is_message else (None, None)
    return EventItem(
        id=row_id,
        event_id=queued.event_id or row_id,
        sender=me or "@unknown:invalid",
        origin_server_ts=queued.created_ts,
        event_type=queued.event_type,
        body=_what(queued),
        send_state=state,
        msgtype=msgtype,
        formatted_body=html,
    )


def echo_placed(queued: QueuedSend, me: str | None) -> EchoPlaced:
    return EchoPlaced(queued.seq, queued.txn_id, echo_item(queued, me))


def echo_update(queued: QueuedSend, me: str | None) -> EchoPlaced | EchoRemoved:
    """What the timeline shows of a queued row now: its echo, or (a reaction, edit or
    redaction that is not refused) no row."""
    if queued.is_message or queued.state is SendRow.FAILED:
        return echo_placed(queued, me)
    return EchoRemoved(queued.txn_id)
