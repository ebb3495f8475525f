"""Pilot tests of the send queue in the TUI: a pending row is visibly pending, a failed row
says why and offers retry (R) and discard (d), and the status line counts the queue."""

from __future__ import annotations

from msgspec.structs import replace
from textual.widgets import Static

from gapline.history import (
    CancelSend,
    RedactEvent,
    RetrySend,
    SendQueueChanged,
    SendState,
)
from tests.tui.fake_engine import ROOM, message
from tests.tui.support import make_app, until

ME = "@alice:example.org"


def echo(n: int, body: str, state: SendState):
    return replace(
        message(n, sender=ME), id=f"echo:t{n}", event_id=f"echo:t{n}", body=body, send_state=state
    )


PENDING = echo(50, "on its way", SendState.PENDING)
FAILED = echo(51, "far too long", SendState.failed("the message is too large for the homeserver"))


def row_text(app, row_id: str) -> str:
    return str(app.timeline.row(row_id).render())


def status(app) -> str:
    return str(app.query_one("#status", Static).render())


async def test_pending_and_failed_rows_say_where_they_stand() -> None:
    app, fake = make_app([message(1), PENDING, FAILED])
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 3, "the rows")
        pending = row_text(app, PENDING.id)
        assert "on its way" in pending and "… sending" in pending
        failed = row_text(app, FAILED.id)
        assert "far too long" in failed  # the text is kept
        assert "✗ not sent: the message is too large for the homeserver" in failed
        assert "R to retry" in failed and "d to discard" in failed
        assert "sending" not in row_text(app, "e1") and "not sent" not in row_text(app, "e1")
        await fake.publish(SendQueueChanged(pending=1, failed=1))
        await until(pilot, lambda: "1 message queued · 1 not sent" in status(app), "the count")
        await fake.publish(SendQueueChanged(pending=0, failed=0))
        await until(pilot, lambda: "queued" not in status(app), "the count gone")


async def test_r_retries_and_d_discards_a_message_not_sent() -> None:
    app, fake = make_app([message(1), PENDING, FAILED])
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 3, "the rows")
        app.timeline.focus()
        app.timeline.select(FAILED.id)
        await pilot.press("R")
        await until(pilot, lambda: RetrySend(ROOM, FAILED.id) in fake.commands, "retry")
        await pilot.press("d")
        await until(pilot, lambda: CancelSend(ROOM, FAILED.id) in fake.commands, "discard")
        # A pending row can be discarded too, but not retried; a sent message is redacted.
        app.timeline.select(PENDING.id)
        await pilot.press("R")
        await until(pilot, lambda: any("not sent can be retried" in n for n in app.notices), "no")
        assert RetrySend(ROOM, PENDING.id) not in fake.commands
        app.timeline.select("e1")
        await pilot.press("d")
        await until(pilot, lambda: RedactEvent(ROOM, "$e1") in fake.commands, "redact")
        assert not any(isinstance(c, CancelSend) and c.id == "e1" for c in fake.commands)
