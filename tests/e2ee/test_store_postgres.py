"""The e2ee store on PostgreSQL: the shared contract."""

from __future__ import annotations

import pytest

from .store_contract import CryptoStoreContract

pytestmark = pytest.mark.postgres


class TestPostgresCryptoStore(CryptoStoreContract):
    @pytest.fixture
    def dsn(self, postgres_dsn: str) -> str:
        return postgres_dsn


del CryptoStoreContract
