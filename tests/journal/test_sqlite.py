"""The journal contracts on SQLite."""

from __future__ import annotations

from tests.journal.backends import SQLiteJournalBackend
from tests.journal.contract import JournalContract
from tests.journal.contract_approvals import ApprovalContract
from tests.journal.contract_audience import AudienceContract
from tests.journal.contract_runtime import RuntimeContract


class TestSQLiteJournal(SQLiteJournalBackend, JournalContract):
    pass


class TestSQLiteApprovals(SQLiteJournalBackend, ApprovalContract):
    pass


class TestSQLiteRuntime(SQLiteJournalBackend, RuntimeContract):
    pass


class TestSQLiteAudience(SQLiteJournalBackend, AudienceContract):
    pass


del JournalContract, ApprovalContract, RuntimeContract, AudienceContract
