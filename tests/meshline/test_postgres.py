"""The Meshline client store's contract on PostgreSQL (a fresh database per test)."""

from __future__ import annotations

import pytest

from tests.meshline.store_contract import MeshlineStoreContract

pytestmark = pytest.mark.postgres


class TestMeshlineStorePostgres(MeshlineStoreContract):
    @pytest.fixture
    def store_dsn(self, postgres_dsn: str) -> str:
        return postgres_dsn


del MeshlineStoreContract
