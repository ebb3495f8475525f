"""Relay fixtures. The backend contracts get their ``relay_dsn`` from the per-backend
modules (``test_sqlite.py``, ``test_postgres.py``); transport tests use SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return str(tmp_path / "relay.db")
