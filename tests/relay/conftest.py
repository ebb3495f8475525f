"""Relay fixtures. The backend contracts get their ``relay_dsn`` from the per-backend
modules (``test_sqlite.py``, ``test_postgres.py``); transport tests use SQLite;
``two_relays`` is two `gapline relay serve` processes on one PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gapline.meshline.testing import TEST_CONTEXT
from gapline.relay.devserver import RelayProcess


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return str(tmp_path / "relay.db")


@pytest.fixture
def two_relays(postgres_dsn: str) -> Iterator[tuple[RelayProcess, RelayProcess]]:
    args = [
        "--network-context",
        str(TEST_CONTEXT),
        "--rate",
        "1000000",
        "--burst",
        "1000000",
        "--log-level",
        "warning",
    ]
    first = RelayProcess.start(postgres_dsn, extra_args=args)
    try:
        second = RelayProcess.start(postgres_dsn, extra_args=args)
        try:
            yield first, second
        finally:
            assert second.stop() == 0, second.log_tail()
    finally:
        assert first.stop() == 0, first.log_tail()
