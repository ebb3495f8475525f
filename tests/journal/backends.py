"""The journal's two backends as fixture mixins for the contract classes.

A test module subclasses a contract (``JournalContract``, ``ApprovalContract``,
``RuntimeContract``) together with one of these, mixin first, so its
``journal_backend`` and ``journal_dsn`` replace the contract's abstract ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gapline.storage import Backend, open_backend

__all__ = ["PostgresJournalBackend", "SQLiteJournalBackend"]


class _OpenedOnItsDsn:
    @pytest.fixture
    async def journal_backend(self, journal_dsn: str) -> AsyncIterator[Backend]:
        backend = await open_backend(journal_dsn)
        try:
            yield backend
        finally:
            await backend.close()


class SQLiteJournalBackend(_OpenedOnItsDsn):
    @pytest.fixture
    def journal_dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "journal.sqlite3")


class PostgresJournalBackend(_OpenedOnItsDsn):
    """A database whose default collation is ICU ``en-US`` (``'a' < 'B'``), so an ordered
    text key that forgot ``COLLATE "C"`` orders differently from SQLite and fails."""

    @pytest.fixture
    def journal_dsn(self, make_postgres_dsn: Callable[..., str]) -> str:
        return make_postgres_dsn(icu_locale="en-US")
