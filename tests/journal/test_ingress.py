"""Sync ingress: provenance from the sync answer, token after commit, lifecycle rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gapline.journal import (
    STREAM_STATUS_KEY,
    AdmitOutcome,
    DepartureOutcome,
    DepartureSource,
    EventKind,
    EventRole,
    InboundEvent,
    Ingress,
    IngressPolicy,
    Provenance,
    RuntimeState,
    room_member_sync_state_plan,
)
from gapline.matrix import JoinedRoom
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import Backend, open_backend

BOT = "@bot:example.org"


class RecordingJournal:
    """Ingress's four views, recording calls (and able to break on demand): no card or
    interactive message is known, and recorded history gaps are kept."""

    def __init__(self) -> None:
        self.admitted: list[InboundEvent] = []
        self.fences: list[tuple[str, DepartureSource]] = []
        self.fail_on: str | None = None
        self.owed: dict[str, int] = {}
        self.gaps: list[str] = []
        self.reports: set[str] = set()

    @property
    def principal_id(self) -> str:
        return BOT

    async def epoch(self, room_id: str) -> int:
        return 0

    async def admit(self, event: InboundEvent, *, epoch: int) -> AdmitOutcome:
        if event.event_id == self.fail_on:
            raise RuntimeError("disk full")
        if any(e.event_id == event.event_id for e in self.admitted):
            return AdmitOutcome.DUPLICATE
        self.admitted.append(event)
        return AdmitOutcome.ADMITTED

    async def undecrypted_events(
        self, room_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> tuple[InboundEvent, ...]:
        return ()  # no crypto store here: nothing is ever upgraded

    async def upgrade_decrypted(self, event: InboundEvent) -> AdmitOutcome:
        return AdmitOutcome.DUPLICATE

    async def fence_departure(
        self, room_id: str, *, source: DepartureSource, report_id: str | None = None
    ) -> DepartureOutcome:
        # As the store does: a report is applied once per reporting event.
        if report_id is not None and report_id in self.reports:
            return DepartureOutcome.ALREADY_REPORTED
        if report_id is not None:
            self.reports.add(report_id)
        self.fences.append((room_id, source))
        return DepartureOutcome.ADVANCED

    async def rooms_owing_departure_reports(self, limit: int = 1000) -> tuple[str, ...]:
        return tuple(self.owed)

    async def retire_owed_departure_reports(self, room_id: str) -> int:
        return self.owed.pop(room_id, 0)

    async def event_role(self, room_id: str, event_id: str) -> EventRole | None:
        return None

    async def record_history_gap(self, room_id: str) -> int:
        self.gaps.append(room_id)
        return 0


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncGenerator[Backend]:
    opened = await open_backend(str(tmp_path / "j.sqlite3"))
    try:
        yield opened
    finally:
        await opened.close()


async def sync_once(ingress: Ingress, client: Any) -> None:
    since = await ingress.state.sync_token()
    response = await client.sync(
        since=since, timeout_ms=0, filter={"room": {"timeline": {"limit": 5}}}
    )
    await ingress.process(response, initial=since is None, since=since)
    await ingress.state.save_sync_token(response.next_batch)


def by_id(journal: RecordingJournal) -> dict[str, InboundEvent]:
    return {e.event_id: e for e in journal.admitted}


async def test_provenance_is_what_the_sync_answer_says(backend: Backend) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    before = fake.send_text(alice, room, "before the first sync")
    journal = RecordingJournal()
    state = await RuntimeState.open(backend, BOT)
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, state)
        await sync_once(ingress, client)  # initial: everything is history
        live = fake.send_text(alice, room, "live")
        await sync_once(ingress, client)
        burst = fake.send_messages(alice, room, [f"burst {i}" for i in range(8)])
        await sync_once(ingress, client)  # more than the limit of 5: limited
    seen = by_id(journal)
    assert seen[before].provenance is Provenance.HISTORY
    assert seen[before].kind is EventKind.CONTEXT_ONLY
    assert seen[live].provenance is Provenance.LIVE
    assert seen[live].kind is EventKind.ACTIONABLE
    # The limited sync's timeline and the gap before it, recovered in the room's order.
    recovered = [e for e in journal.admitted if e.event_id in burst]
    assert [e.event_id for e in recovered] == burst
    assert all(e.provenance is Provenance.RECOVERED for e in recovered)
    assert all(e.kind is EventKind.ACTIONABLE for e in recovered)


async def test_the_token_moves_only_after_every_event_is_committed(backend: Backend) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    journal = RecordingJournal()
    state = await RuntimeState.open(backend, BOT)
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, state)
        await sync_once(ingress, client)
        token = await state.sync_token()
        ids = fake.send_messages(alice, room, ["a", "b", "c"])
        journal.fail_on = ids[1]
        with pytest.raises(RuntimeError):
            await sync_once(ingress, client)
        assert await state.sync_token() == token  # not moved: the batch is redelivered
        journal.fail_on = None
        await sync_once(ingress, client)
    assert [e.event_id for e in journal.admitted if e.event_id in ids] == ids


async def test_own_progress_edits_are_never_admitted(backend: Backend) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    journal = RecordingJournal()
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, await RuntimeState.open(backend, BOT))
        await sync_once(ingress, client)
        answer = fake.send_text(BOT, room, "…")
        ids = {}
        for status in ("streaming", "complete"):
            ids[status] = fake.send_event(
                BOT,
                room,
                "m.room.message",
                {
                    "msgtype": "m.text",
                    "body": "* x",
                    "m.new_content": {"msgtype": "m.text", "body": "x", STREAM_STATUS_KEY: status},
                    "m.relates_to": {"rel_type": "m.replace", "event_id": answer},
                },
            )
        await sync_once(ingress, client)
    seen = by_id(journal)
    assert ids["streaming"] not in seen
    assert ids["complete"] in seen and seen[answer].kind is EventKind.CONTEXT_ONLY


async def test_a_reported_leave_is_fenced_once_even_when_redelivered(backend: Backend) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    journal = RecordingJournal()
    state = await RuntimeState.open(backend, BOT)
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, state)
        await sync_once(ingress, client)
        token = await state.sync_token()
        fake.kick(alice, room, BOT)
        await sync_once(ingress, client)
        await state.save_sync_token(token or "")  # as if the crash came before the token
        await sync_once(ingress, client)
    assert journal.fences == [(room, DepartureSource.REPORTED)]


async def test_a_first_sync_retires_reports_owed_by_a_lost_position(backend: Backend) -> None:
    fake = FakeHomeserver()
    journal = RecordingJournal()
    journal.owed = {"!gone:example.org": 2}
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, await RuntimeState.open(backend, BOT), IngressPolicy())
        assert await ingress.retire_reports_of_lost_position() == 2
    assert journal.owed == {}


async def test_runtime_state_is_per_principal(backend: Backend) -> None:
    a = await RuntimeState.open(backend, "@a:x")
    b = await RuntimeState.open(backend, "@b:x")
    assert await a.claim_device_id("DEVA") == "DEVA"
    await a.save_sync_token("s1")
    await a.save_sync_token("s2")
    assert (await a.device_id(), await a.sync_token()) == ("DEVA", "s2")
    assert (await b.device_id(), await b.sync_token()) == (None, None)


@pytest.mark.parametrize(
    "dialect", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_racing_first_starts_claim_one_device_id(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two first starts (two backends on one database, as two processes would hold) that
    both found no device id agree on the first one stored."""
    dsn = request.getfixturevalue("postgres_dsn") if dialect == "postgres" else str(tmp_path / "r")
    one, two = await open_backend(dsn), await open_backend(dsn)
    try:
        first = await RuntimeState.open(one, "@a:x")
        second = await RuntimeState.open(two, "@a:x")
        assert (await first.device_id(), await second.device_id()) == (None, None)
        claimed = await asyncio.gather(
            first.claim_device_id("DEV1"), second.claim_device_id("DEV2")
        )
        assert claimed[0] == claimed[1]
        assert claimed[0] in {"DEV1", "DEV2"}
        assert await second.device_id() == claimed[0]
        assert await first.claim_device_id("DEV3") == claimed[0]  # a later start keeps it
    finally:
        await one.close()
        await two.close()


# -- contract 11: our own member events in the state block ---------------------------------


def room_with_the_bot() -> tuple[FakeHomeserver, str, str]:
    """A fake homeserver, alice, and her room the bot is a member of."""
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    return fake, alice, fake.create_room(alice, members=[BOT])


def _member(event_id: str, membership: str, prev: str | None) -> dict[str, Any]:
    unsigned = {} if prev is None else {"prev_content": {"membership": prev}}
    return {
        "event_id": event_id,
        "type": "m.room.member",
        "sender": BOT,
        "state_key": BOT,
        "origin_server_ts": 1,
        "content": {"membership": membership},
        "unsigned": unsigned,
    }


def _joined(limited: bool, *state: dict[str, Any]) -> JoinedRoom:
    other = {**_member("$someone", "join", None), "state_key": "@alice:example.org"}
    return msgspec.convert(
        {"timeline": {"events": [], "limited": limited}, "state": {"events": [*state, other]}},
        JoinedRoom,
    )


def test_the_state_plan_chooses_dispatch_or_baseline_and_labels_nothing() -> None:
    def plan(room: JoinedRoom, *, initial: bool = False) -> tuple[list[str], list[str]]:
        got = room_member_sync_state_plan(room, principal_id=BOT, initial=initial)
        return [e.event_id for e in got.dispatch], [e.event_id for e in got.record]

    # A first sync, or a timeline that is not limited: where this journal starts.
    assert plan(_joined(True, _member("$j", "join", "invite")), initial=True) == ([], ["$j"])
    assert plan(_joined(False, _member("$l", "leave", "join"))) == ([], ["$l"])
    # Limited: a departure inside the gap is dispatched (not an invite's rejection) ...
    assert plan(_joined(True, _member("$kick", "leave", "join"))) == (["$kick"], [])
    assert plan(_joined(True, _member("$ban", "ban", None))) == (["$ban"], [])
    assert plan(_joined(True, _member("$reject", "leave", "invite"))) == ([], [])
    # ... a membership that began inside it is a baseline record; a profile change asks nothing.
    assert plan(_joined(True, _member("$j", "join", "invite"))) == ([], ["$j"])
    assert plan(_joined(True, _member("$j", "join", None))) == ([], ["$j"])
    assert plan(_joined(True, _member("$p", "join", "join"))) == ([], [])


async def test_a_departure_only_the_state_block_shows_is_fenced_once(backend: Backend) -> None:
    fake, alice, room = room_with_the_bot()
    journal = RecordingJournal()
    state = await RuntimeState.open(backend, BOT)
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, state)
        await sync_once(ingress, client)
        token = await state.sync_token()
        fake.kick(alice, room, BOT)
        while_out = fake.send_messages(alice, room, [f"while out {i}" for i in range(6)])
        fake.join(BOT, room)
        after = fake.send_text(alice, room, "welcome back")
        # The timeline (limit 5) starts after the kick: only the state block holds it.
        await sync_once(ingress, client)
        await state.save_sync_token(token or "")  # redelivered, as after a crash
        await sync_once(ingress, client)
    assert journal.fences == [(room, DepartureSource.REPORTED)]
    seen = by_id(journal)
    assert seen[after].kind is EventKind.ACTIONABLE
    # What the timeline holds from before our rejoin is context, and the gap is not
    # completed: it predates the membership.
    assert all(seen[e].kind is EventKind.CONTEXT_ONLY for e in while_out if e in seen)
    assert while_out[0] not in seen


async def test_a_gap_the_completion_could_not_fetch_is_recorded(backend: Backend) -> None:
    fake, alice, room = room_with_the_bot()
    journal = RecordingJournal()
    state = await RuntimeState.open(backend, BOT)
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, state)
        await sync_once(ingress, client)
        burst = fake.send_messages(alice, room, [f"burst {i}" for i in range(8)])
        fake.fail("messages", status=403, errcode="M_FORBIDDEN", times=None)
        await sync_once(ingress, client)
        # Completed within its budget, nothing is recorded.
        fake.clear_faults()
        more = fake.send_messages(alice, room, [f"more {i}" for i in range(8)])
        await sync_once(ingress, client)
    assert journal.gaps == [room]
    seen = by_id(journal)
    assert [e for e in burst if e in seen] == burst[-5:]  # the timeline, not the gap
    assert all(e in seen for e in more)


async def test_a_rejoin_inside_the_gap_still_completes_it(backend: Backend) -> None:
    """The state block shows only the join; the completion still pages the gap back: the
    departure before the join is fenced, what preceded the join is context, and what
    came after it is recovered and answered."""
    fake, alice, room = room_with_the_bot()
    journal = RecordingJournal()
    async with fake.client(fake.register("bot")) as client:
        ingress = Ingress(journal, client, await RuntimeState.open(backend, BOT))
        await sync_once(ingress, client)
        fake.kick(alice, room, BOT)
        while_out = fake.send_messages(alice, room, ["while out 0", "while out 1"])
        fake.join(BOT, room)
        back = fake.send_messages(alice, room, [f"back {i}" for i in range(8)])
        await sync_once(ingress, client)  # limit 5: the kick and the join are in the gap
    assert journal.fences == [(room, DepartureSource.REPORTED)]
    seen = by_id(journal)
    assert [seen[e].kind for e in while_out] == [EventKind.CONTEXT_ONLY] * 2
    assert all(seen[e].kind is EventKind.ACTIONABLE for e in back)
    assert all(seen[e].provenance is Provenance.RECOVERED for e in [*while_out, *back])
