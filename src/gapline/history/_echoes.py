"""Local echo rows: how a queued message shows in its timeline until the server's event
replaces it.

An echo's row id is ``echo:<transaction id>``; it stays the row's id after the
server's event takes the row's place (a ``Set`` diff), for as long as the
timeline is loaded, so a selection or a reader holding the row keeps it. Until
the server answers, the row's ``event_id`` is that same placeholder: nothing
can relate to an event that does not exist yet.
"""

from __future__ import annotations

from gapline.history._items import EventItem, SendState
from gapline.history._send_store import QueuedSend, SendRow
from gapline.history._updates import EchoPlaced

__all__ = ["ECHO_ORD", "ECHO_PREFIX", "echo_item", "echo_placed", "is_echo_id"]

ECHO_PREFIX = "echo:"
ECHO_ORD = 2**62
"""Echo rows sort after every event (section numbers never come near this)."""


def is_echo_id(row_id: str) -> bool:
    return row_id.startswith(ECHO_PREFIX)


def echo_item(queued: QueuedSend, me: str | None) -> EventItem:
    """The row of a queued message (``Pending``, or ``Failed`` with why)."""
    row_id = ECHO_PREFIX + queued.txn_id
    state = (
        SendState.failed(queued.failure or "the homeserver refused the message")
        if queued.state is SendRow.FAILED
        else SendState.PENDING
    )
    return EventItem(
        id=row_id,
        event_id=queued.event_id or row_id,
        sender=me or "@unknown:invalid",
        origin_server_ts=queued.created_ts,
        event_type=queued.event_type,
        body=queued.body,
        send_state=state,
    )


def echo_placed(queued: QueuedSend, me: str | None) -> EchoPlaced:
    return EchoPlaced(queued.seq, queued.txn_id, echo_item(queued, me))
