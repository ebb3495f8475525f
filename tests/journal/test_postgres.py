"""The journal contract on PostgreSQL, on a database whose collation is not byte order.

Every contract test runs on a database created with ICU ``en-US`` as its default
collation (``'a' < 'B'``), so an ordered text key that forgot ``COLLATE "C"`` would
order differently from SQLite and fail the pagination tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from gapline.journal import JournalStore
from gapline.storage import Backend, open_backend
from tests.journal.contract import ROOM, JournalContract, message

pytestmark = pytest.mark.postgres


class TestPostgresJournal(JournalContract):
    @pytest.fixture
    def journal_dsn(self, make_postgres_dsn: Callable[..., str]) -> str:
        return make_postgres_dsn(icu_locale="en-US")

    @pytest.fixture
    async def journal_backend(self, journal_dsn: str) -> AsyncIterator[Backend]:
        backend = await open_backend(journal_dsn)
        try:
            yield backend
        finally:
            await backend.close()

    async def test_database_collation_is_not_byte_order(self, journal_backend: Backend) -> None:
        """Guards the premise of this module: the server's own order differs from bytes."""
        rows = await journal_backend.read(
            lambda tx: tx.all("SELECT x FROM (VALUES ('a'), ('B')) AS t(x) ORDER BY x")
        )
        assert [r[0] for r in rows] == ["a", "B"]  # byte order would put 'B' first

    async def test_conversation_order_is_byte_order(self, store: JournalStore) -> None:
        bot = store.principal("@bot:example.org")
        ids = ["$a", "$B", "$_x", "$Z", "$b", "$A"]
        for event_id in ids:
            await bot.admit(message(event_id, ts=7), epoch=0)
        page = await bot.read_conversation(ROOM, None, 3)
        rest = await bot.read_conversation(ROOM, None, 3, before=page.next_before)
        got = [r.event_id for r in rest.rows + page.rows]
        assert got == sorted(ids, key=lambda s: s.encode())


del JournalContract
