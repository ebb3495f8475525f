"""The journal contracts on PostgreSQL, on a database whose collation is not byte order.

Every contract test runs on a database created with ICU ``en-US`` as its default
collation (``'a' < 'B'``), so an ordered text key that forgot ``COLLATE "C"`` would
order differently from SQLite and fail the pagination tests.
"""

from __future__ import annotations

import pytest

from gapline.journal import JournalStore
from gapline.storage import Backend
from tests.journal.backends import PostgresJournalBackend
from tests.journal.contract import ROOM, JournalContract, message
from tests.journal.contract_approvals import ApprovalContract
from tests.journal.contract_audience import AudienceContract
from tests.journal.contract_runtime import RuntimeContract

pytestmark = pytest.mark.postgres


class TestPostgresApprovals(PostgresJournalBackend, ApprovalContract):
    pass


class TestPostgresRuntime(PostgresJournalBackend, RuntimeContract):
    pass


class TestPostgresJournal(PostgresJournalBackend, JournalContract):
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


class TestPostgresAudience(PostgresJournalBackend, AudienceContract):
    pass


del JournalContract, ApprovalContract, RuntimeContract, AudienceContract
