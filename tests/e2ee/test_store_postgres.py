"""The e2ee store on PostgreSQL: the shared contract."""

from __future__ import annotations

import pytest

from .store_contract import CryptoStoreContract
from .store_contract_keys import KeyStoreContract

pytestmark = pytest.mark.postgres


class TestPostgresCryptoStore(CryptoStoreContract, KeyStoreContract):
    @pytest.fixture
    def dsn(self, postgres_dsn: str) -> str:
        return postgres_dsn


del CryptoStoreContract, KeyStoreContract
