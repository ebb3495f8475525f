"""The journal store's contract, run unchanged on every backend.

``JournalContract`` is not collected itself (no ``Test`` prefix); ``test_sqlite.py``
and ``test_postgres.py`` subclass it with a ``journal_backend`` fixture. Each rule of
the store (admission, projection, redaction, epochs, fences, replay) is its own test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import pytest

from gapline.journal import (
    AckOutcome,
    AdmitOutcome,
    ChunkOutcome,
    ConsumerClaim,
    ConversationKey,
    Cursor,
    DeliveryRequest,
    DeliveryStage,
    DepartureOutcome,
    DepartureSource,
    EnqueueOutcome,
    EventKind,
    InboundEvent,
    JournalStore,
    PrincipalJournal,
    Provenance,
    Revision,
    TurnNotCompleted,
    TurnState,
    _membership,
    decode_thread_id,
    encode_thread_id,
    transaction_id,
)
from gapline.storage import Backend

ROOM = "!room:example.org"
BOT = "@bot:example.org"
ALICE = "@alice:example.org"
MALLORY = "@mallory:example.org"
REPO = Path(__file__).resolve().parents[2]


def message(
    event_id: str,
    body: str = "hello",
    *,
    sender: str = ALICE,
    ts: int = 1000,
    thread: str | None = None,
    kind: EventKind = EventKind.ACTIONABLE,
    room: str = ROOM,
    extra: dict[str, Any] | None = None,
    resolved_text: str | None = None,
) -> InboundEvent:
    content: dict[str, Any] = {"msgtype": "m.text", "body": body, **(extra or {})}
    return InboundEvent(
        event_id,
        room,
        thread,
        sender,
        ts,
        "m.room.message",
        json.dumps(content),
        kind,
        resolved_text=resolved_text,
    )


def edit(
    event_id: str,
    target: str,
    body: str,
    *,
    sender: str = ALICE,
    ts: int = 2000,
    kind: EventKind = EventKind.CONTEXT_ONLY,
    new_content_extra: dict[str, Any] | None = None,
    resolved_text: str | None = None,
) -> InboundEvent:
    content = {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body, **(new_content_extra or {})},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }
    return InboundEvent(
        event_id,
        ROOM,
        None,
        sender,
        ts,
        "m.room.message",
        json.dumps(content),
        kind,
        resolved_text=resolved_text,
    )


def redaction(event_id: str, target: str, *, ts: int = 3000, sender: str = ALICE) -> InboundEvent:
    return InboundEvent(
        event_id,
        ROOM,
        None,
        sender,
        ts,
        "m.room.redaction",
        json.dumps({"redacts": target}),
        EventKind.REDACTION,
    )


async def bodies(
    bot: PrincipalJournal, thread: str | None = None, limit: int = 100
) -> dict[str, str]:
    page = await bot.read_conversation(ROOM, thread, limit)
    return {row.event_id: row.body for row in page.rows}


async def raw(backend: Backend, sql: str, params: tuple = ()) -> list[tuple]:
    return await backend.read(lambda tx: tx.all(sql, params))


@contextlib.contextmanager
def advance_that_raises(monkeypatch: pytest.MonkeyPatch) -> Generator[None]:
    """While it lasts, every epoch advance runs its statements and then raises, so the
    fence's transaction rolls back whole."""
    original = _membership.advance_epoch

    def failing(tx: Any, p: str, room_id: str, seal: Any = None) -> int:
        original(tx, p, room_id, *(() if seal is None else (seal,)))
        raise RuntimeError("injected failure after the advance statements")

    monkeypatch.setattr(_membership, "advance_epoch", failing)
    try:
        yield
    finally:
        monkeypatch.setattr(_membership, "advance_epoch", original)


class JournalFixtures:
    """The store and the bound principal over an abstract backend, for every contract."""

    @pytest.fixture
    async def journal_backend(self, tmp_path: Path) -> AsyncIterator[Backend]:
        raise NotImplementedError
        yield  # pragma: no cover

    @pytest.fixture
    def journal_dsn(self, tmp_path: Path) -> str:
        """A DSN the backend was opened on (for child processes and reopening)."""
        raise NotImplementedError

    @pytest.fixture
    async def store(self, journal_backend: Backend) -> JournalStore:
        return await JournalStore.open(journal_backend)

    @pytest.fixture
    def bot(self, store: JournalStore) -> PrincipalJournal:
        return store.principal(BOT)


class JournalContract(JournalFixtures):
    # -- principal ownership and conversation identity --------------------------------

    def test_thread_id_helper_round_trips(self) -> None:
        assert encode_thread_id(None) == ""
        assert decode_thread_id("") is None
        assert encode_thread_id("$root") == "$root"
        assert decode_thread_id("$root") == "$root"
        with pytest.raises(ValueError):
            encode_thread_id("")

    async def test_unthreaded_is_empty_string_in_storage(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(message("$main"), epoch=0)
        await bot.admit(message("$threaded", thread="$root", ts=1001), epoch=0)
        rows = await raw(
            journal_backend,
            "SELECT logical_event_id, thread_id FROM journal_messages ORDER BY logical_event_id",
        )
        assert rows == [("$main", ""), ("$threaded", "$root")]
        assert (await bot.read_conversation(ROOM, None, 10)).rows[0].thread_id is None
        assert [r.event_id for r in (await bot.read_conversation(ROOM, "$root", 10)).rows] == [
            "$threaded"
        ]

    async def test_principal_isolation(self, store: JournalStore, bot: PrincipalJournal) -> None:
        other = store.principal("@other:example.org")
        await bot.admit(message("$mine", "secret"), epoch=0)
        await bot.fence_departure("!left:x", source=DepartureSource.LOCAL)
        # The other principal sees nothing of the bot's rows ...
        assert (await other.read_conversation(ROOM, None, 10)).rows == ()
        assert await other.message(ROOM, "$mine") is None
        assert await other.pending(10) == ()
        assert await other.rooms_owing_departure_reports() == ()
        assert await other.epoch("!left:x") == 0
        # ... and can never settle them.
        assert await other.settle("$mine") is False
        assert [p.event.event_id for p in await bot.pending(10)] == ["$mine"]
        # The same event id is a separate row for another principal (dedup is per principal).
        assert await other.admit(message("$mine", "theirs"), epoch=0) is AdmitOutcome.ADMITTED
        assert await bodies(bot) == {"$mine": "secret"}
        assert await bodies(other) == {"$mine": "theirs"}

    # -- durable admission -------------------------------------------------------------

    async def test_admit_deduplicates_by_event_id(self, bot: PrincipalJournal) -> None:
        assert await bot.admit(message("$a", "first"), epoch=0) is AdmitOutcome.ADMITTED
        assert await bot.admit(message("$a", "second"), epoch=0) is AdmitOutcome.DUPLICATE
        assert [p.event.event_id for p in await bot.pending(10)] == ["$a"]
        assert await bodies(bot) == {"$a": "first"}

    async def test_concurrent_admitters_admit_exactly_once(self, bot: PrincipalJournal) -> None:
        events = [message(f"$c{i % 16}", ts=i % 16) for i in range(64)]
        outcomes = await asyncio.gather(*(bot.admit(e, epoch=0) for e in events))
        assert outcomes.count(AdmitOutcome.ADMITTED) == 16
        assert outcomes.count(AdmitOutcome.DUPLICATE) == 48
        assert len(await bot.pending(100)) == 16

    async def test_admit_refuses_epoch_mismatch(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ADVANCED
        )
        assert await bot.epoch(ROOM) == 1
        assert await bot.admit(message("$late"), epoch=0) is AdmitOutcome.STALE_EPOCH
        assert await raw(journal_backend, "SELECT event_id FROM journal_events") == []
        assert await bot.admit(message("$late"), epoch=1) is AdmitOutcome.ADMITTED

    async def test_context_only_payload_is_compacted(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        assert await bot.admit(
            message("$ctx", "context", kind=EventKind.CONTEXT_ONLY), epoch=0
        ) is (AdmitOutcome.ADMITTED)
        assert await bodies(bot) == {"$ctx": "context"}  # projected ...
        rows = await raw(
            journal_backend,
            "SELECT source, resolved_text, settled FROM journal_events WHERE event_id = ?",
            ("$ctx",),
        )
        assert rows == [(None, None, 1)]  # ... then only its identity remains
        assert await bot.pending(10) == ()
        # The identity still deduplicates.
        assert await bot.admit(message("$ctx", "again", kind=EventKind.CONTEXT_ONLY), epoch=0) is (
            AdmitOutcome.DUPLICATE
        )

    async def test_actionable_keeps_exact_replay_input_until_settled(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        content = b'{"body":"exact  bytes \\u00e9","msgtype":"m.text"}'
        event = InboundEvent(
            "$act",
            ROOM,
            "$root",
            ALICE,
            5,
            "m.room.message",
            content,
            EventKind.ACTIONABLE,
            Provenance.RECOVERED,
        )
        await bot.admit(event, epoch=0)
        (pending,) = await bot.pending(10)
        assert pending.event == event
        assert pending.epoch == 0
        assert await bot.settle("$act") is True
        rows = await raw(journal_backend, "SELECT source, settled FROM journal_events")
        assert rows == [(None, 1)]

    async def test_pending_pages_in_receipt_order(self, bot: PrincipalJournal) -> None:
        # Receipt order, not timestamp order.
        for i, ts in enumerate([50, 10, 40, 20, 30]):
            await bot.admit(message(f"$p{i}", ts=ts), epoch=0)
        first = await bot.pending(2)
        assert [p.event.event_id for p in first] == ["$p0", "$p1"]
        rest = await bot.pending(10, after=first[-1].seq)
        assert [p.event.event_id for p in rest] == ["$p2", "$p3", "$p4"]
        assert [p.seq for p in first + rest] == sorted(p.seq for p in first + rest)

    async def test_admission_wakes_the_pending_channel(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        updates = aiter(journal_backend.subscribe(bot.pending_channel))
        await bot.admit(message("$ctx", kind=EventKind.CONTEXT_ONLY), epoch=0)  # never pending
        await bot.admit(message("$wake"), epoch=0)
        payload = await asyncio.wait_for(anext(updates), timeout=30)
        (pending,) = await bot.pending(10)
        assert payload == str(pending.seq)

    async def test_settle_is_terminal(self, bot: PrincipalJournal) -> None:
        await bot.admit(message("$s"), epoch=0)
        assert await bot.settle("$s") is True
        assert await bot.settle("$s") is False
        assert await bot.settle("$unknown") is False
        assert await bot.pending(10) == ()
        assert await bot.admit(message("$s"), epoch=0) is AdmitOutcome.DUPLICATE
        assert await bot.pending(10) == ()

    async def test_limits_must_be_positive(self, bot: PrincipalJournal) -> None:
        for limit in (0, -1):
            with pytest.raises(ValueError):
                await bot.read_conversation(ROOM, None, limit)
            with pytest.raises(ValueError):
                await bot.pending(limit)
            with pytest.raises(ValueError):
                await bot.claim(limit)

    @pytest.mark.slow
    async def test_crash_leaves_events_pending(
        self, journal_dsn: str, journal_backend: Backend
    ) -> None:
        """SIGKILL a process mid-way, reopen: every committed admission is there and
        every event not reported settled is offered again (there is no running state)."""
        await JournalStore.open(journal_backend)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.journal.contract_crash_child",
            journal_dsn,
            BOT,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
        )
        lines: list[tuple[str, str]] = []
        try:
            assert child.stdout is not None
            while len(lines) < 30:
                line = (await child.stdout.readline()).decode()
                assert line, "the child exited before the kill"
                op, event_id = line.split()
                lines.append((op, event_id))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
        assert child.returncode == -signal.SIGKILL
        admitted = {eid for op, eid in lines if op == "admitted"}
        settled = {eid for op, eid in lines if op == "settled"}
        bot = (await JournalStore.open(journal_backend)).principal(BOT)
        pending = {p.event.event_id for p in await bot.pending(1000)}
        everything = {
            r[0] for r in await raw(journal_backend, "SELECT event_id FROM journal_events")
        }
        assert admitted <= everything
        assert pending.isdisjoint(settled)
        assert admitted - settled <= pending
        # Settling what the crash left pending still works.
        for event_id in pending:
            assert await bot.settle(event_id) is True

    # -- the projection: edits ------------------------------------------------------------

    async def test_edit_replaces_only_when_newer_by_ts_then_id(self, bot: PrincipalJournal) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(edit("$e2", "$o", "v2", ts=300), epoch=0)
        await bot.admit(edit("$e1", "$o", "v1", ts=200), epoch=0)  # older ts: ignored
        assert await bodies(bot) == {"$o": "v2"}
        # Equal timestamp: the event id breaks the tie.
        await bot.admit(edit("$e3", "$o", "v3", ts=300), epoch=0)
        assert await bodies(bot) == {"$o": "v3"}
        await bot.admit(edit("$e0", "$o", "v0b", ts=300), epoch=0)  # '$e0' < '$e3'
        assert await bodies(bot) == {"$o": "v3"}
        row = await bot.message(ROOM, "$o")
        assert row is not None and row.edited and row.revision_event_id == "$e3"

    async def test_edit_by_another_sender_never_changes_a_message(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$o", "mine", ts=100), epoch=0)
        await bot.admit(edit("$evil", "$o", "pwned", sender=MALLORY, ts=999), epoch=0)
        row = await bot.message(ROOM, "$o")
        assert row is not None and row.body == "mine" and not row.edited

    async def test_held_edit_applies_when_its_original_arrives(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(edit("$e2", "$o", "latest", ts=300), epoch=0)
        await bot.admit(
            edit("$e1", "$o", "older", ts=200), epoch=0
        )  # one latest per (target, sender)
        held = await raw(journal_backend, "SELECT edit_event_id FROM journal_held_edits")
        assert held == [("$e2",)]
        await bot.admit(message("$o", "original", ts=100), epoch=0)
        assert await bodies(bot) == {"$o": "latest"}
        assert await raw(journal_backend, "SELECT edit_event_id FROM journal_held_edits") == []

    async def test_attacker_held_edit_cannot_evict_the_author(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(edit("$author", "$o", "author edit", ts=200), epoch=0)
        # An earlier (and a later) edit by another sender, both before the original.
        await bot.admit(edit("$evil1", "$o", "evil early", sender=MALLORY, ts=150), epoch=0)
        await bot.admit(edit("$evil2", "$o", "evil late", sender=MALLORY, ts=900), epoch=0)
        held = await raw(
            journal_backend, "SELECT sender, edit_event_id FROM journal_held_edits ORDER BY sender"
        )
        assert held == [(ALICE, "$author"), (MALLORY, "$evil2")]
        await bot.admit(message("$o", "original", ts=100), epoch=0)
        assert await bodies(bot) == {"$o": "author edit"}
        assert await raw(journal_backend, "SELECT sender FROM journal_held_edits") == []

    async def test_only_other_senders_held_edits_leave_the_original_unedited(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(edit("$evil", "$o", "evil", sender=MALLORY, ts=200), epoch=0)
        await bot.admit(message("$o", "original", ts=100), epoch=0)
        row = await bot.message(ROOM, "$o")
        assert row is not None and row.body == "original" and not row.edited

    async def test_self_streaming_progress_edits_are_not_projected(
        self, store: JournalStore, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$answer", "…", sender=BOT, ts=100), epoch=0)
        for i, status in enumerate(["pending", "streaming"]):
            progress = edit(
                f"$prog{i}",
                "$answer",
                f"partial {i}",
                sender=BOT,
                ts=200 + i,
                new_content_extra={"io.gapline.stream_status": status},
            )
            assert await bot.admit(progress, epoch=0) is AdmitOutcome.ADMITTED
        assert await bodies(bot) == {"$answer": "…"}
        final = edit(
            "$final",
            "$answer",
            "done",
            sender=BOT,
            ts=300,
            new_content_extra={"io.gapline.stream_status": "complete"},
        )
        await bot.admit(final, epoch=0)
        assert await bodies(bot) == {"$answer": "done"}
        # A user's edit carrying the marker still reduces normally.
        await bot.admit(message("$u", "x", ts=400), epoch=0)
        await bot.admit(
            edit(
                "$ue",
                "$u",
                "user edit",
                ts=500,
                new_content_extra={"io.gapline.stream_status": "streaming"},
            ),
            epoch=0,
        )
        assert (await bodies(bot))["$u"] == "user edit"

    # -- the projection: redactions ---------------------------------------------------------

    async def test_redacting_the_original_tombstones_the_message(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(message("$o", "gone soon", ts=100), epoch=0)
        await bot.admit(edit("$e", "$o", "edited", ts=200), epoch=0)
        await bot.admit(redaction("$r", "$o"), epoch=0)
        assert await bodies(bot) == {}
        assert await bot.message(ROOM, "$o") is None
        # Neither a replayed original nor a later edit resurrects it.
        await bot.admit(edit("$e9", "$o", "back?", ts=900), epoch=0)
        assert await bodies(bot) == {}
        assert await raw(journal_backend, "SELECT event_id FROM journal_tombstones") == [("$o",)]

    async def test_redacting_the_visible_revision_clears_body_and_owes_refresh(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(edit("$e1", "$o", "v1", ts=200), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        (seq,) = (
            r[0]
            for r in await raw(
                journal_backend, "SELECT seq FROM journal_events WHERE event_id = ?", ("$r",)
            )
        )
        page = await bot.read_conversation(ROOM, None, 10)
        assert page.rows == ()  # a non-strict read never serves a body-cleared row
        assert [(d.logical_event_id, d.refresh_token) for d in page.owing_refresh] == [
            ("$o", f"r{seq}")
        ]
        assert await bot.message(ROOM, "$o") is None
        stored = await raw(journal_backend, "SELECT body, refresh_token FROM journal_messages")
        assert stored == [(None, f"r{seq}")]  # cleared in the same transaction
        debt = await bot.refresh_debt(ROOM, "$o")
        assert debt is not None and debt.refresh_token == f"r{seq}"

    async def test_redacting_a_superseded_revision_changes_nothing(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(edit("$e1", "$o", "v1", ts=200), epoch=0)
        await bot.admit(edit("$e2", "$o", "v2", ts=300), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        page = await bot.read_conversation(ROOM, None, 10)
        assert [r.body for r in page.rows] == ["v2"] and page.owing_refresh == ()

    async def test_tombstone_before_original_prevents_resurrection(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(redaction("$r", "$o"), epoch=0)
        await bot.admit(message("$o", "should not appear", ts=100), epoch=0)
        await bot.admit(edit("$e", "$o", "nor this", ts=200), epoch=0)
        assert await bodies(bot) == {}

    async def test_redacted_edit_arriving_after_its_redaction_never_applies(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        await bot.admit(edit("$e1", "$o", "redacted text", ts=200), epoch=0)
        assert await bodies(bot) == {"$o": "v0"}

    async def test_redacted_held_edit_never_applies(self, bot: PrincipalJournal) -> None:
        await bot.admit(edit("$e1", "$o", "redacted text", ts=200), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        assert await bodies(bot) == {"$o": "v0"}

    async def test_redaction_event_stays_pending_for_cleanup(self, bot: PrincipalJournal) -> None:
        await bot.admit(redaction("$r", "$x"), epoch=0)
        assert [p.event.event_id for p in await bot.pending(10)] == ["$r"]

    # -- sidecar facts and the point refetch ------------------------------------------------

    async def test_unresolved_sidecar_preview_is_a_refresh_debt(
        self, bot: PrincipalJournal
    ) -> None:
        sidecar = {"io.gapline.sidecar": {"url": "mxc://x/y"}}
        await bot.admit(message("$big", "preview…", ts=100, extra=sidecar), epoch=0)
        await bot.admit(
            message("$big2", "preview…", ts=200, extra=sidecar, resolved_text="the full text"),
            epoch=0,
        )
        page = await bot.read_conversation(ROOM, None, 10)
        assert [(r.event_id, r.body) for r in page.rows] == [("$big2", "the full text")]
        assert [d.logical_event_id for d in page.owing_refresh] == ["$big"]

    async def test_install_refetched_requires_matching_token_and_epoch(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(edit("$e1", "$o", "v1", ts=200), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        debt = await bot.refresh_debt(ROOM, "$o")
        assert debt is not None
        server = Revision("$o", 100, json.dumps({"msgtype": "m.text", "body": "v0"}))
        assert not await bot.install_refetched(
            ROOM, "$o", server, expected_epoch=0, expected_refresh_token="r-stale"
        )
        assert not await bot.install_refetched(
            ROOM, "$o", server, expected_epoch=7, expected_refresh_token=debt.refresh_token
        )
        assert await bot.install_refetched(
            ROOM, "$o", server, expected_epoch=0, expected_refresh_token=debt.refresh_token
        )
        row = await bot.message(ROOM, "$o")
        assert row is not None and row.body == "v0" and not row.edited
        assert await bot.refresh_debt(ROOM, "$o") is None
        # Success cleared the token: the same install cannot apply twice.
        assert not await bot.install_refetched(
            ROOM, "$o", server, expected_epoch=0, expected_refresh_token=debt.refresh_token
        )

    async def test_newer_edit_defeats_an_in_flight_refetch(self, bot: PrincipalJournal) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(edit("$e1", "$o", "v1", ts=200), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        debt = await bot.refresh_debt(ROOM, "$o")
        assert debt is not None
        await bot.admit(edit("$e2", "$o", "v2", ts=300), epoch=0)
        stale = Revision("$o", 100, json.dumps({"body": "v0"}))
        assert not await bot.install_refetched(
            ROOM, "$o", stale, expected_epoch=0, expected_refresh_token=debt.refresh_token
        )
        assert await bodies(bot) == {"$o": "v2"}

    async def test_refetch_finding_no_revision_tombstones(self, bot: PrincipalJournal) -> None:
        await bot.admit(message("$o", "v0", ts=100), epoch=0)
        await bot.admit(edit("$e1", "$o", "v1", ts=200), epoch=0)
        await bot.admit(redaction("$r", "$e1"), epoch=0)
        debt = await bot.refresh_debt(ROOM, "$o")
        assert debt is not None
        assert await bot.install_refetched(
            ROOM, "$o", None, expected_epoch=0, expected_refresh_token=debt.refresh_token
        )
        page = await bot.read_conversation(ROOM, None, 10)
        assert page.rows == () and page.owing_refresh == ()
        await bot.admit(message("$o", "replayed", ts=100), epoch=0)
        assert await bodies(bot) == {}

    # -- bounded reads ------------------------------------------------------------------------

    async def test_cursor_pagination_with_equal_timestamps(self, bot: PrincipalJournal) -> None:
        # 7 messages share one timestamp; pages of 3 must cut through them.
        ids = [f"$m{i}" for i in range(10)]
        for i, event_id in enumerate(ids):
            await bot.admit(
                message(event_id, f"b{i}", ts=100 if 1 <= i <= 7 else i * 1000), epoch=0
            )
        expected = sorted(
            ((100 if 1 <= i <= 7 else i * 1000, e) for i, e in enumerate(ids)), reverse=True
        )
        seen: list[tuple[int, str]] = []
        cursor: Cursor | None = None
        pages = 0
        while True:
            page = await bot.read_conversation(ROOM, None, 3, before=cursor)
            pages += 1
            assert list(page.rows) == sorted(page.rows, key=lambda r: (r.created_ts, r.event_id))
            seen.extend((r.created_ts, r.event_id) for r in reversed(page.rows))
            if page.next_before is None:
                break
            assert page.next_before == page.rows[0].cursor
            cursor = Cursor.parse(str(page.next_before))
        assert seen == expected
        assert pages == 4  # 3 + 3 + 3 + 1

    async def test_exact_multiple_ends_with_an_empty_page(self, bot: PrincipalJournal) -> None:
        for i in range(4):
            await bot.admit(message(f"$x{i}", ts=5), epoch=0)
        first = await bot.read_conversation(ROOM, None, 2)
        second = await bot.read_conversation(ROOM, None, 2, before=first.next_before)
        assert second.next_before is not None
        third = await bot.read_conversation(ROOM, None, 2, before=second.next_before)
        assert third.rows == () and third.next_before is None
        assert {r.event_id for r in first.rows + second.rows} == {f"$x{i}" for i in range(4)}

    def test_cursor_string_form(self) -> None:
        cursor = Cursor(1700000000000, "$abc:example.org")
        assert str(cursor) == "1700000000000:$abc:example.org"
        assert Cursor.parse(str(cursor)) == cursor
        for bad in ("", "12", "x:$a", ":$a", "12:"):
            with pytest.raises(ValueError):
                Cursor.parse(bad)

    # -- hydration ----------------------------------------------------------------------------

    async def test_hydration_chunks_are_epoch_checked_and_coverage_published(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        chunk = [
            edit("$h2", "$h1", "edited in history", ts=20, kind=EventKind.CONTEXT_ONLY),
            message("$h1", "history", ts=10, kind=EventKind.CONTEXT_ONLY),
        ]
        assert await bot.project_chunk(ROOM, chunk, expected_epoch=0) is ChunkOutcome.PROJECTED
        assert await bodies(bot) == {"$h1": "edited in history"}
        # Hydration does not journal: a later sync delivery is still admitted and dispatched.
        assert await raw(journal_backend, "SELECT event_id FROM journal_events") == []
        assert await bot.admit(message("$h1", "history", ts=10), epoch=0) is AdmitOutcome.ADMITTED
        key = ConversationKey(ROOM)
        assert await bot.coverage(key) is None
        assert await bot.publish_coverage(key, reached_start=True, messages=1, expected_epoch=0)
        coverage = await bot.coverage(key)
        assert coverage is not None and coverage.reached_start and coverage.messages == 1
        await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
        assert await bot.coverage(key) is None
        assert await bot.project_chunk(ROOM, chunk, expected_epoch=0) is ChunkOutcome.STALE_EPOCH
        assert not await bot.publish_coverage(key, reached_start=True, messages=1, expected_epoch=0)
        assert await bodies(bot) == {}

    async def test_hydration_chunks_are_bounded(self, bot: PrincipalJournal) -> None:
        chunk = [message(f"$b{i}", ts=i, kind=EventKind.CONTEXT_ONLY) for i in range(1001)]
        with pytest.raises(ValueError):
            await bot.project_chunk(ROOM, chunk, expected_epoch=0)
        assert (
            await bot.project_chunk(ROOM, chunk[:1000], expected_epoch=0) is ChunkOutcome.PROJECTED
        )
        page = await bot.read_conversation(ROOM, None, 1)
        assert [r.event_id for r in page.rows] == ["$b999"]

    async def test_hydration_refuses_self_progress_edits(self, bot: PrincipalJournal) -> None:
        chunk = [
            message("$a", "…", sender=BOT, ts=10),
            edit(
                "$p",
                "$a",
                "partial",
                sender=BOT,
                ts=11,
                new_content_extra={"io.gapline.stream_status": "streaming"},
            ),
        ]
        await bot.project_chunk(ROOM, chunk, expected_epoch=0)
        assert await bodies(bot) == {"$a": "…"}

    # -- membership fences ---------------------------------------------------------------------

    async def test_local_leave_then_echo_advances_once(self, bot: PrincipalJournal) -> None:
        assert await bot.fence_departure(ROOM, source=DepartureSource.LOCAL) is (
            DepartureOutcome.ADVANCED_OWING_REPORT
        )
        assert await bot.rooms_owing_departure_reports() == (ROOM,)
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ECHO_RETIRED
        )
        assert await bot.epoch(ROOM) == 1
        assert await bot.rooms_owing_departure_reports() == ()
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ADVANCED
        )
        assert await bot.epoch(ROOM) == 2

    async def test_two_leaves_before_one_echo(self, bot: PrincipalJournal) -> None:
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        assert await bot.epoch(ROOM) == 2
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ECHO_RETIRED
        )
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ECHO_RETIRED
        )
        assert await bot.epoch(ROOM) == 2
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ADVANCED
        )

    async def test_owed_reports_survive_a_restart(
        self, journal_backend: Backend, bot: PrincipalJournal
    ) -> None:
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        await bot.fence_departure("!b:x", source=DepartureSource.LOCAL)
        reopened = (await JournalStore.open(journal_backend)).principal(BOT)
        assert await reopened.rooms_owing_departure_reports() == tuple(sorted([ROOM, "!b:x"]))
        assert await reopened.retire_owed_departure_reports("!b:x") == 1
        assert await reopened.rooms_owing_departure_reports() == (ROOM,)
        assert await reopened.fence_departure(ROOM, source=DepartureSource.REPORTED) is (
            DepartureOutcome.ECHO_RETIRED
        )

    async def test_an_advance_that_raises_leaves_nothing_owed(
        self, bot: PrincipalJournal, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        await bot.admit(message("$kept", ts=1), epoch=0)
        with advance_that_raises(monkeypatch), pytest.raises(RuntimeError):
            await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        assert await bot.epoch(ROOM) == 0
        assert await bot.rooms_owing_departure_reports() == ()
        assert await bodies(bot) == {"$kept": "hello"}
        # The echo of that leave is therefore a real departure, fenced exactly once.
        assert (
            await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
            is DepartureOutcome.ADVANCED
        )
        assert await bot.epoch(ROOM) == 1

    async def test_a_report_is_applied_once_per_reporting_event(
        self, bot: PrincipalJournal, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        reported = DepartureSource.REPORTED
        assert await bot.fence_departure(ROOM, source=reported, report_id="$kick") is (
            DepartureOutcome.ADVANCED
        )
        assert await bot.fence_departure(ROOM, source=reported, report_id="$kick") is (
            DepartureOutcome.ALREADY_REPORTED
        )
        assert await bot.epoch(ROOM) == 1
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        assert await bot.fence_departure(ROOM, source=reported, report_id="$leave") is (
            DepartureOutcome.ECHO_RETIRED
        )
        assert await bot.fence_departure(ROOM, source=reported, report_id="$leave") is (
            DepartureOutcome.ALREADY_REPORTED
        )
        assert (await bot.epoch(ROOM), await bot.rooms_owing_departure_reports()) == (2, ())
        with pytest.raises(ValueError):
            await bot.fence_departure(ROOM, source=DepartureSource.LOCAL, report_id="$x")
        # The record rides in the fence's transaction: an advance that raises records
        # nothing, so the redelivered report is applied then.
        with advance_that_raises(monkeypatch), pytest.raises(RuntimeError):
            await bot.fence_departure(ROOM, source=reported, report_id="$ban")
        assert await bot.fence_departure(ROOM, source=reported, report_id="$ban") is (
            DepartureOutcome.ADVANCED
        )
        assert await bot.epoch(ROOM) == 3

    async def test_advance_drops_projection_and_sweeps_turn_backed_events(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(message("$turn", "ask", ts=1), epoch=0)
        await bot.admit(redaction("$red", "$zzz"), epoch=0)
        await bot.admit(
            InboundEvent("$react", ROOM, None, ALICE, 3, "m.reaction", "{}", EventKind.REACTION),
            epoch=0,
        )
        await bot.admit(
            InboundEvent("$claimed", ROOM, None, ALICE, 4, "m.reaction", "{}", EventKind.REACTION),
            epoch=0,
        )
        assert await bot.claim_consumer("$claimed", "interactive_reaction") is ConsumerClaim.CLAIMED
        await bot.admit(message("$elsewhere", ts=5, room="!other:x"), epoch=0)
        await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
        assert await bodies(bot) == {}
        pending = {p.event.event_id for p in await bot.pending(10)}
        assert pending == {"$red", "$react", "$elsewhere"}
        rows = await raw(
            journal_backend,
            "SELECT event_id, settled, source FROM journal_events WHERE event_id IN (?, ?)",
            ("$turn", "$claimed"),
        )
        assert sorted(rows) == [
            ("$claimed", 2, None),
            ("$turn", 2, None),
        ]  # rows kept, input cleared

    async def test_claim_after_departure_is_rejected_and_settled(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(
            InboundEvent("$react", ROOM, None, ALICE, 3, "m.reaction", "{}", EventKind.REACTION),
            epoch=0,
        )
        await bot.fence_departure(ROOM, source=DepartureSource.REPORTED)
        assert (
            await bot.claim_consumer("$react", "interactive_reaction") is ConsumerClaim.STALE_EPOCH
        )
        assert await bot.pending(10) == ()
        assert (
            await bot.claim_consumer("$react", "interactive_reaction")
            is ConsumerClaim.ALREADY_SETTLED
        )

    # -- turns and the outbox ------------------------------------------------------------------

    @staticmethod
    def request(turn_id: str, stage: DeliveryStage, body: str, room: str = ROOM) -> DeliveryRequest:
        return DeliveryRequest(
            turn_id, f"d-{turn_id}", stage, room, None, "m.room.message", json.dumps({"body": body})
        )

    async def test_enqueue_creates_then_updates_only_unattempted_rows(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$q", ts=1), epoch=0)
        turn = await bot.begin_turn("$q")
        assert turn.state is TurnState.OPEN and turn.epoch == 0
        assert (
            await bot.enqueue(self.request("$q", DeliveryStage.INITIAL, "v1"))
            is EnqueueOutcome.CREATED
        )
        assert (
            await bot.enqueue(self.request("$q", DeliveryStage.INITIAL, "v2"))
            is EnqueueOutcome.UPDATED
        )
        (claimed,) = await bot.claim(10)
        assert json.loads(claimed.content) == {"body": "v2"}
        assert claimed.txn_id == transaction_id(BOT, "d-$q", DeliveryStage.INITIAL)
        assert (
            await bot.enqueue(self.request("$q", DeliveryStage.INITIAL, "v3"))
            is EnqueueOutcome.FROZEN
        )
        # Offered again, unacknowledged: the same frozen payload and transaction id.
        (again,) = await bot.claim(10)
        assert again == claimed
        assert await bot.acknowledge(again, "$sent") is AckOutcome.ACKNOWLEDGED
        assert await bot.claim(10) == ()
        assert (
            await bot.enqueue(self.request("$q", DeliveryStage.INITIAL, "v4"))
            is EnqueueOutcome.ACKNOWLEDGED
        )
        turn2 = await bot.turn("$q")
        assert turn2 is not None and turn2.initial_event_id == "$sent"

    def test_transaction_ids_are_deterministic_per_principal_delivery_stage(self) -> None:
        a = transaction_id(BOT, "d1", DeliveryStage.INITIAL)
        assert a == transaction_id(BOT, "d1", DeliveryStage.INITIAL)
        assert (
            len(
                {
                    a,
                    transaction_id(BOT, "d1", DeliveryStage.FINAL),
                    transaction_id(BOT, "d2", DeliveryStage.INITIAL),
                    transaction_id("@other:x", "d1", DeliveryStage.INITIAL),
                }
            )
            == 4
        )

    async def test_final_enqueue_needs_a_durable_result_and_settles_the_source(
        self, bot: PrincipalJournal
    ) -> None:
        await bot.admit(message("$q", ts=1), epoch=0)
        await bot.begin_turn("$q")
        with pytest.raises(TurnNotCompleted):
            await bot.enqueue(self.request("$q", DeliveryStage.FINAL, "answer"), settle_source=True)
        assert [p.event.event_id for p in await bot.pending(10)] == ["$q"]  # nothing written
        turn = await bot.record_result("$q", b"answer")
        assert turn.state is TurnState.COMPLETED and turn.result == b"answer"
        # The first result wins: a rerun does not replace what the completed call produced.
        assert (await bot.record_result("$q", b"other")).result == b"answer"
        assert await bot.enqueue(
            self.request("$q", DeliveryStage.FINAL, "answer"), settle_source=True
        ) is (EnqueueOutcome.CREATED)
        assert await bot.pending(10) == ()  # handed off in the same transaction

    async def test_enqueue_refuses_a_turn_from_an_older_epoch(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        await bot.admit(message("$q", ts=1), epoch=0)
        await bot.begin_turn("$q")
        await bot.record_result("$q", b"late answer")
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        assert await bot.enqueue(
            self.request("$q", DeliveryStage.FINAL, "late"), settle_source=True
        ) is (EnqueueOutcome.STALE_EPOCH)
        assert await raw(journal_backend, "SELECT seq FROM journal_outbox") == []
        assert await bot.pending(10) == ()  # the fence already force-settled the source

    async def test_advance_removes_unattempted_and_keeps_attempted_deliveries(
        self, bot: PrincipalJournal
    ) -> None:
        for source in ("$a", "$b"):
            await bot.admit(message(source, ts=1), epoch=0)
            await bot.begin_turn(source)
        await bot.enqueue(self.request("$a", DeliveryStage.INITIAL, "attempted"))
        (attempted,) = await bot.claim(10)
        await bot.enqueue(self.request("$b", DeliveryStage.INITIAL, "never sent"))
        await bot.fence_departure(ROOM, source=DepartureSource.LOCAL)
        (survivor,) = await bot.claim(10)
        assert survivor == attempted  # same frozen payload and txn id: a retry collapses
        assert await bot.acknowledge(survivor, "$ev") is AckOutcome.ACKNOWLEDGED

    async def test_acknowledgement_loser_writes_neither_row(self, bot: PrincipalJournal) -> None:
        await bot.admit(message("$q", ts=1), epoch=0)
        await bot.begin_turn("$q")
        await bot.record_result("$q", b"r")
        await bot.enqueue(self.request("$q", DeliveryStage.FINAL, "final"), settle_source=True)
        (delivery,) = await bot.claim(1)
        outcomes = await asyncio.gather(
            bot.acknowledge(delivery, "$winner?1"), bot.acknowledge(delivery, "$winner?2")
        )
        assert sorted(o.value for o in outcomes) == ["acknowledged", "lost"]
        winner = "$winner?1" if outcomes[0] is AckOutcome.ACKNOWLEDGED else "$winner?2"
        turn = await bot.turn("$q")
        assert (
            turn is not None and turn.state is TurnState.DELIVERED and turn.final_event_id == winner
        )
        assert await bot.acknowledge(delivery, "$late") is AckOutcome.LOST
        assert (await bot.turn("$q")) == turn

    async def test_another_principal_cannot_claim_or_acknowledge(
        self, store: JournalStore, bot: PrincipalJournal
    ) -> None:
        other = store.principal("@other:example.org")
        await bot.admit(message("$q", ts=1), epoch=0)
        await bot.begin_turn("$q")
        await bot.enqueue(self.request("$q", DeliveryStage.INITIAL, "x"))
        assert await other.claim(5) == ()
        (delivery,) = await bot.claim(1)
        assert await other.acknowledge(delivery, "$x") is AckOutcome.LOST
        assert await bot.acknowledge(delivery, "$ok") is AckOutcome.ACKNOWLEDGED
