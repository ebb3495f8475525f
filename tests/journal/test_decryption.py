"""Decryption failures in the store, on SQLite and PostgreSQL: retained (ciphertext kept,
not pending, not projected), upgraded once in place when the key arrives, refused a
second time, force-settled when a fence came between; and the same with sealing on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from gapline.journal import (
    AdmitOutcome,
    DepartureSource,
    EventKind,
    InboundEvent,
    JournalStore,
    PrincipalJournal,
)
from gapline.journal._sealing import Sealing
from gapline.storage import StoreCipher, open_backend

from .contract import ALICE, BOT, ROOM, message

CIPHERTEXT = {
    "algorithm": "m.megolm.v1.aes-sha2",
    "ciphertext": "AwgAEnAb…",
    "session_id": "SESSION",
    "sender_key": "KEY",
    "device_id": "DEV",
}


def failure(event_id: str, session: str = "SESSION", room: str = ROOM) -> InboundEvent:
    return InboundEvent(
        event_id,
        room,
        None,
        ALICE,
        1000,
        "m.room.encrypted",
        json.dumps({**CIPHERTEXT, "session_id": session}),
        EventKind.DECRYPTION_FAILURE,
    )


@pytest.fixture(params=["sqlite", "postgres", "sqlite-sealed", "postgres-sealed"])
async def journal(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[PrincipalJournal]:
    if request.param.startswith("postgres"):
        dsn = request.getfixturevalue("postgres_dsn")
    else:
        dsn = str(tmp_path / "journal.sqlite3")
    backend = await open_backend(dsn)
    try:
        store = await JournalStore.open(backend)
        sealing = Sealing(StoreCipher(b"s" * 32)) if request.param.endswith("sealed") else None
        yield store.principal(BOT, sealing=sealing)
    finally:
        await backend.close()


async def test_a_failure_is_retained_not_pending_and_not_projected(
    journal: PrincipalJournal,
) -> None:
    assert await journal.admit(failure("$e"), epoch=0) is AdmitOutcome.ADMITTED
    assert await journal.admit(failure("$e"), epoch=0) is AdmitOutcome.DUPLICATE
    assert await journal.pending(10) == ()
    assert (await journal.read_conversation(ROOM, None, 10)).rows == ()
    retained = await journal.undecrypted_events([ROOM])
    assert [e.event_id for e in retained] == ["$e"]
    assert json.loads(retained[0].content)["session_id"] == "SESSION"
    assert await journal.undecrypted_events(None) == retained
    assert await journal.undecrypted_events(["!other:example.org"]) == ()


async def test_the_upgrade_admits_the_event_as_what_it_is_exactly_once(
    journal: PrincipalJournal,
) -> None:
    await journal.admit(message("$before"), epoch=0)
    await journal.settle("$before")
    await journal.admit(failure("$e"), epoch=0)
    decrypted = message("$e", "now readable")
    assert await journal.upgrade_decrypted(decrypted) is AdmitOutcome.ADMITTED
    pending = await journal.pending(10)
    assert [(p.event.event_id, p.event.kind) for p in pending] == [("$e", EventKind.ACTIONABLE)]
    assert json.loads(pending[0].event.content)["body"] == "now readable"
    assert pending[0].seq > 1  # its own receipt order, kept from the failure's admission
    rows = (await journal.read_conversation(ROOM, None, 10)).rows
    assert [(r.event_id, r.body) for r in rows] == [("$before", "hello"), ("$e", "now readable")]
    assert await journal.undecrypted_events([ROOM]) == ()
    # A second key, a redelivered sync, a restart: nothing happens again.
    assert await journal.upgrade_decrypted(decrypted) is AdmitOutcome.DUPLICATE
    assert await journal.admit(decrypted, epoch=0) is AdmitOutcome.DUPLICATE
    assert len(await journal.pending(10)) == 1


async def test_a_context_upgrade_is_projected_and_settled(journal: PrincipalJournal) -> None:
    await journal.admit(failure("$e"), epoch=0)
    context = message("$e", "history", kind=EventKind.CONTEXT_ONLY)
    assert await journal.upgrade_decrypted(context) is AdmitOutcome.ADMITTED
    assert await journal.pending(10) == ()
    assert [r.body for r in (await journal.read_conversation(ROOM, None, 10)).rows] == ["history"]


async def test_a_failure_from_before_the_join_is_healed_into_context_only(
    journal: PrincipalJournal,
) -> None:
    # The joining sync's timeline before our join: ingress admits its failures marked.
    await journal.admit(replace(failure("$said-before"), before_join=True), epoch=0)
    await journal.admit(failure("$said-after", session="LATER"), epoch=0)
    retained = await journal.undecrypted_events([ROOM])
    assert [e.event_id for e in retained] == ["$said-before", "$said-after"]
    assert await journal.undecrypted_events(None) == retained
    # The key comes late and the event decrypts to a message that would be answered:
    # it is what was said before we came, so it is context (projected, never pending).
    before = message("$said-before", "an old question?", ts=900)
    assert await journal.upgrade_decrypted(before) is AdmitOutcome.ADMITTED
    assert await journal.pending(10) == ()
    rows = (await journal.read_conversation(ROOM, None, 10)).rows
    assert [(r.event_id, r.body) for r in rows] == [("$said-before", "an old question?")]
    assert await journal.upgrade_decrypted(before) is AdmitOutcome.DUPLICATE
    # A failure from after the join, healed, is answered as usual.
    after = message("$said-after", "a new question?")
    assert await journal.upgrade_decrypted(after) is AdmitOutcome.ADMITTED
    assert [p.event.event_id for p in await journal.pending(10)] == ["$said-after"]
    assert await journal.undecrypted_events(None) == ()


async def test_an_upgrade_after_a_fence_is_recorded_but_never_answered(
    journal: PrincipalJournal,
) -> None:
    await journal.admit(failure("$e"), epoch=0)
    await journal.fence_departure(ROOM, source=DepartureSource.REPORTED, report_id="$leave")
    assert await journal.undecrypted_events([ROOM])  # a fence does not retire failures
    outcome = await journal.upgrade_decrypted(message("$e", "too late"))
    assert outcome is AdmitOutcome.STALE_EPOCH
    assert await journal.pending(10) == ()
    assert (await journal.read_conversation(ROOM, None, 10)).rows == ()
    assert await journal.upgrade_decrypted(message("$e", "too late")) is AdmitOutcome.DUPLICATE


async def test_an_upgrade_needs_the_events_own_kind(journal: PrincipalJournal) -> None:
    await journal.admit(failure("$e"), epoch=0)
    with pytest.raises(ValueError, match="own kind"):
        await journal.upgrade_decrypted(replace(failure("$e"), type="m.room.message"))
