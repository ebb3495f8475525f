"""The journal and approval contracts with contents sealed (a bot with a passphrase), on
SQLite and PostgreSQL: sealing changes what is on disk, never what the journal does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gapline.journal import (
    ApprovalAnswer,
    Decision,
    DeliveryStage,
    DepartureSource,
    JournalStore,
    PrincipalJournal,
    ToolCall,
    approval_id_for,
)
from gapline.journal._sealing import Sealing
from gapline.storage import Backend, StoreCipher
from tests.journal.backends import PostgresJournalBackend, SQLiteJournalBackend
from tests.journal.contract import ALICE, BOT, ROOM, JournalContract, message, raw
from tests.journal.contract_approvals import (
    COORDINATOR,
    ApprovalContract,
    answer,
    content_of,
    request,
)

KEY = Sealing(StoreCipher(b"k" * 32))
SECRET_CALL = ToolCall("wire_money", {"iban": "DE-SECRET-IBAN", "note": "quarterly bonus"})
SECRETS = ("wire_money", "SECRET-IBAN", "quarterly bonus")


class _SealedBot:
    @pytest.fixture
    def bot(self, store: JournalStore) -> PrincipalJournal:
        return store.principal(BOT, sealing=KEY)


async def asking_turn(bot: PrincipalJournal) -> str:
    await bot.admit(message("$q", "please pay", ts=100), epoch=await bot.epoch(ROOM))
    await bot.begin_turn("$q")
    return "$q"


async def approval_tables(backend: Backend) -> str:
    """Every stored value of the approval tables and the outbox, as one text."""
    found: list[Any] = []
    for table in ("approval_cards", "approval_continuations", "journal_outbox"):
        found += await raw(backend, f"SELECT * FROM {table}")
    return repr(found)


class _SealedApprovals(_SealedBot):
    @staticmethod
    def stored_text(value: str) -> str:
        assert value.startswith("gls1:")
        opened = KEY.open_text(value)
        assert opened is not None
        return opened

    async def test_an_approvals_call_card_and_resolution_are_sealed(
        self, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        turn = await asking_turn(bot)
        req = request(turn, SECRET_CALL)
        opened = await bot.open_approval(req)
        assert opened is not None and opened.call == SECRET_CALL
        (card,) = await bot.claim(10)
        assert content_of(card)["io.gapline.approval"]["tool"] == "wire_money"
        await bot.acknowledge(card, "$card")
        await bot.admit(answer("$yes", "$card", "approve"), epoch=0)
        outcome = await bot.resolve_approval(
            ROOM, "$card", decision=Decision.APPROVED, approver=ALICE, answer_event_id="$yes"
        )
        assert outcome.answer is ApprovalAnswer.RECORDED
        stored = await approval_tables(journal_backend)
        for secret in (*SECRETS, SECRET_CALL.digest()):
            assert secret not in stored
        (resolution,) = await bot.claim(10)
        body = content_of(resolution)["m.new_content"]["body"]
        assert body.startswith(f"Approved by {ALICE}: wire_money(")
        approval = await bot.approval(req.approval_id)
        assert approval is not None and approval.call == SECRET_CALL

    async def test_a_fence_across_principals_seals_what_it_resolves(
        self, store: JournalStore, bot: PrincipalJournal, journal_backend: Backend
    ) -> None:
        # A coordinator with the database's key posts the card of the bot's turn.
        coordinator = store.principal(COORDINATOR, sealing=KEY)
        body = await cancelled_by_departure(store, coordinator, bot, leaver=bot)
        assert body.startswith("Cancelled") and "wire_money(" in body

    async def test_a_fence_without_the_key_cancels_a_sealed_card_naming_no_call(
        self, store: JournalStore, bot: PrincipalJournal
    ) -> None:
        # The bot (sealed) posts the card of a turn of a principal without the key; that
        # principal's departure must still cancel the card, and cannot read its call.
        keyless = store.principal(COORDINATOR)
        body = await cancelled_by_departure(store, bot, keyless, leaver=keyless)
        assert body == "Cancelled (the bot left the room)"


async def cancelled_by_departure(
    store: JournalStore,
    card_holder: PrincipalJournal,
    asker: PrincipalJournal,
    *,
    leaver: PrincipalJournal,
) -> str:
    """A sealed card ``card_holder`` posts for a turn of ``asker``, cancelled by the
    departure of ``leaver``: nothing stored names the call; the resolution's body."""
    req = request(await asking_turn(asker), SECRET_CALL, principal=asker.principal_id)
    opened = await store.open_delegated_approval(
        card_holder.principal_id, asker.principal_id, req, sealing=KEY
    )
    assert opened is not None
    (card,) = await card_holder.claim(10)
    await card_holder.acknowledge(card, "$card")
    await leaver.fence_departure(ROOM, source=DepartureSource.REPORTED)
    decisions = await raw(store.backend, "SELECT decision FROM approval_continuations")
    assert decisions == [(Decision.CANCELLED.value,)]  # (a keyless asker cannot read it)
    stored = await approval_tables(store.backend)
    for secret in (*SECRETS, SECRET_CALL.digest()):
        assert secret not in stored
    (resolution,) = await card_holder.claim(10)
    assert resolution.stage is DeliveryStage.FINAL
    new_content = content_of(resolution)["m.new_content"]
    assert json.dumps(new_content).count(req.approval_id) == 1
    return new_content["body"]


def test_a_sealed_journals_approval_ids_are_keyed() -> None:
    """Under a key the id is an HMAC: the principal, the turn and the ordinal are in the
    clear, so a plain hash would confirm a guessed call; still derived, never random."""
    plain = approval_id_for(BOT, "$q", 0, SECRET_CALL)
    key = KEY.id_key()
    assert key is not None and Sealing().id_key() is None
    keyed = approval_id_for(BOT, "$q", 0, SECRET_CALL, key=key)
    assert keyed.startswith("ap") and len(keyed) == len(plain) and keyed != plain
    assert approval_id_for(BOT, "$q", 0, SECRET_CALL, key=key) == keyed  # a rerun finds it
    other = Sealing(StoreCipher(b"o" * 32)).id_key()
    assert approval_id_for(BOT, "$q", 0, SECRET_CALL, key=other) != keyed
    assert approval_id_for(BOT, "$q", 1, SECRET_CALL, key=key) != keyed


class _Sealed(_SealedBot):
    async def test_what_is_stored_is_sealed_and_reads_back_plain(
        self, bot: PrincipalJournal, store: JournalStore
    ) -> None:
        await bot.admit(message("$m", "a body nobody may read on disk"), epoch=0)
        rows = await store.backend.read(
            lambda tx: tx.all(
                "SELECT m.body, e.source FROM journal_messages m JOIN journal_events e"
                " ON e.event_id = m.logical_event_id WHERE m.logical_event_id = '$m'"
            )
        )
        ((body, source),) = rows
        assert body.startswith("gls1:") and bytes(source).startswith(b"GLS\x01")
        page = await bot.read_conversation(ROOM, None, 10)
        assert [r.body for r in page.rows] == ["a body nobody may read on disk"]
        assert b"nobody" not in bytes(source)


class TestSQLiteSealedJournal(_Sealed, SQLiteJournalBackend, JournalContract):
    pass


class TestPostgresSealedJournal(_Sealed, PostgresJournalBackend, JournalContract):
    pass


class TestSQLiteSealedApprovals(_SealedApprovals, SQLiteJournalBackend, ApprovalContract):
    pass


class TestPostgresSealedApprovals(_SealedApprovals, PostgresJournalBackend, ApprovalContract):
    pass


del JournalContract, ApprovalContract
