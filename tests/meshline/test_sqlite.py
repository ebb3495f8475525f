"""The Meshline client store's contract on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.meshline.store_contract import MeshlineStoreContract


class TestMeshlineStoreSQLite(MeshlineStoreContract):
    @pytest.fixture
    def store_dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "meshline.db")


del MeshlineStoreContract
