"""The journal contract on SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gapline.storage import Backend, open_backend
from tests.journal.contract import JournalContract


class TestSQLiteJournal(JournalContract):
    @pytest.fixture
    def journal_dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "journal.sqlite3")

    @pytest.fixture
    async def journal_backend(self, journal_dsn: str) -> AsyncIterator[Backend]:
        backend = await open_backend(journal_dsn)
        try:
            yield backend
        finally:
            await backend.close()


del JournalContract
