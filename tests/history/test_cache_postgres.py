"""The history cache on PostgreSQL: the shared contract, on a fresh database per test.

The PostgreSQL schema is the SQLite one with ``BYTEA`` for ``BLOB`` and
ordinary tables for ``WITHOUT ROWID`` ones; every statement is the same text.
"""

from __future__ import annotations

import pytest

from tests.history.cache_contract import CacheStoreContract

pytestmark = pytest.mark.postgres


class TestPostgresCacheStore(CacheStoreContract):
    @pytest.fixture
    def dsn(self, postgres_dsn: str) -> str:
        return postgres_dsn


del CacheStoreContract
