"""The delivery worker: claim before I/O, same txn id on retry, acknowledge after."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gapline.journal import (
    DeliveryRequest,
    DeliveryStage,
    DeliveryWorker,
    EventKind,
    JournalStore,
    PrincipalJournal,
    Provenance,
    TurnState,
    transaction_id,
)
from gapline.journal._ingress import inbound_event
from gapline.journal._worker import edit_content, placeholder_content
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import Backend, open_backend

BOT = "@bot:example.org"


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncGenerator[Backend]:
    opened = await open_backend(str(tmp_path / "j.sqlite3"))
    try:
        yield opened
    finally:
        await opened.close()


async def turn_with_initial(fake: FakeHomeserver, journal: PrincipalJournal) -> tuple[str, str]:
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    source = fake.send_text(alice, room, "hi")
    (event,) = [e for e in fake.events(room) if e.event_id == source]
    await journal.admit(
        inbound_event(room, event, kind=EventKind.ACTIONABLE, provenance=Provenance.LIVE), epoch=0
    )
    turn = await journal.begin_turn(source)
    await journal.enqueue(
        DeliveryRequest(
            turn_id=turn.turn_id,
            delivery_id=turn.turn_id,
            stage=DeliveryStage.INITIAL,
            room_id=room,
            thread_id=None,
            event_type="m.room.message",
            content=msgspec.json.encode(placeholder_content(source, None)),
        )
    )
    return room, source


async def test_a_failed_send_is_retried_with_the_same_transaction_id(backend: Backend) -> None:
    fake = FakeHomeserver()
    journal = (await JournalStore.open(backend)).principal(BOT)
    room, source = await turn_with_initial(fake, journal)
    # The server stores the event but the answer is lost: the outcome is unknown.
    fake.disconnect("send", times=4)
    acked: list[str] = []
    async with fake.client(fake.register("bot", device_id="BOTDEVICE")) as client:
        worker = DeliveryWorker(journal, client, lambda d, e: acked.append(e))
        assert await worker.run_once() is False
        worker._backoff.clear()  # retry now rather than after the backoff
        assert await worker.run_once() is True
    sends = [r for r in fake.requests if r.endpoint == "send"]
    txn = transaction_id(BOT, source, DeliveryStage.INITIAL)
    assert len(sends) >= 2 and all(r.path.endswith("/" + txn) for r in sends)
    placeholders = [e for e in fake.events(room) if e.sender == BOT and e.type == "m.room.message"]
    assert [e.event_id for e in placeholders] == acked
    turn = await journal.turn(source)
    assert turn is not None and turn.initial_event_id == acked[0]


class CheckingSender:
    """A sender that looks at the outbox row while the send is in flight."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.attempted_during_send: list[int] = []

    async def send_event(
        self, room_id: str, event_type: str, content: Mapping[str, Any], txn_id: str | None = None
    ) -> str:
        row = await self.backend.read(
            lambda tx: tx.one("SELECT attempted FROM journal_outbox WHERE txn_id = ?", (txn_id,))
        )
        assert row is not None
        self.attempted_during_send.append(int(row[0]))
        return "$sent:example.org"


async def test_the_claim_commits_attempted_before_any_network_io(backend: Backend) -> None:
    fake = FakeHomeserver()
    journal = (await JournalStore.open(backend)).principal(BOT)
    await turn_with_initial(fake, journal)
    sender = CheckingSender(backend)
    assert await DeliveryWorker(journal, sender).run_once() is True
    assert sender.attempted_during_send == [1]


async def test_the_final_acknowledgement_is_the_terminal_turn_record(backend: Backend) -> None:
    fake = FakeHomeserver()
    journal = (await JournalStore.open(backend)).principal(BOT)
    room, source = await turn_with_initial(fake, journal)
    async with fake.client(fake.register("bot")) as client:
        worker = DeliveryWorker(journal, client)
        await worker.run_once()
        turn = await journal.record_result(source, b"echo: hi")
        assert turn.initial_event_id is not None
        await journal.enqueue(
            DeliveryRequest(
                turn_id=source,
                delivery_id=source,
                stage=DeliveryStage.FINAL,
                room_id=room,
                thread_id=None,
                event_type="m.room.message",
                content=msgspec.json.encode(
                    edit_content(turn.initial_event_id, "echo: hi", status="complete")
                ),
            ),
            settle_source=True,
        )
        assert await worker.run_once() is True
        assert await worker.run_once() is False  # nothing left
    turn = await journal.turn(source)
    assert turn is not None and turn.state is TurnState.DELIVERED
    assert turn.final_event_id in fake.event_ids(room)
    assert source not in [p.event.event_id for p in await journal.pending(10)]
