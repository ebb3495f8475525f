"""Relay fixtures: a DSN per backend, so every timeline rule runs on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def relay_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("postgres_dsn")
    return str(tmp_path / "relay.db")


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return str(tmp_path / "relay.db")
