"""The journal contract with its contents sealed (a bot with a passphrase), on SQLite
and PostgreSQL: sealing changes what is on disk, never what the journal does."""

from __future__ import annotations

import pytest

from gapline.journal import JournalStore, PrincipalJournal
from gapline.journal._sealing import Sealing
from gapline.storage import StoreCipher
from tests.journal.backends import PostgresJournalBackend, SQLiteJournalBackend
from tests.journal.contract import BOT, ROOM, JournalContract, message


class _Sealed:
    @pytest.fixture
    def bot(self, store: JournalStore) -> PrincipalJournal:
        return store.principal(BOT, sealing=Sealing(StoreCipher(b"k" * 32)))

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


del JournalContract
