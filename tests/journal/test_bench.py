"""bench/journal.py runs end to end in its --quick form and reports every figure."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

# Bench smoke runs: in `make test`, deselect with `pytest -m 'not bench'`.
pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]

FIGURES = (
    "admit_sequential_per_s",
    "admit_concurrent64_per_s",
    "settle_sequential_per_s",
    "settle_concurrent64_per_s",
    "walk_messages",
    "walk_seconds",
    "deep_page_ms",
    "floor_empty_write_us",
    "floor_durable_one_row_us",
    "export_messages_per_s",
    "export_markdown_messages_per_s",
)


@pytest.mark.slow
@pytest.mark.postgres
async def test_quick_bench_reports_every_figure(postgres_dsn: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "bench" / "journal.py"),
        "--quick",
        "--no-anchor",
        "--no-synapse",  # the approval figures: tests/integration/test_bot_bench.py
        "--postgres-dsn",
        postgres_dsn,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out)
    for backend in ("sqlite", "postgres"):
        for key in FIGURES:
            assert key in result[backend], (backend, key)
    assert result["sqlite"]["walk_messages"] == 5000
    assert "source" in result["anchor"] and "sqlite" in result["anchor"]
    assert set(result["targets"]) == {"sqlite", "postgres"}
    for backend in ("sqlite", "postgres"):
        assert result[backend]["floor_durable_one_row_us"] > 0
        assert result["targets"][backend]["admit_sequential_ceiling_x"] > 0
    # The on-loop floor times a plain sqlite3 connection: SQLite only.
    assert result["sqlite"]["floor_on_loop_one_row_us"] > 0
    assert "floor_on_loop_one_row_us" not in result["postgres"]
    for backend in ("sqlite", "postgres"):
        assert result[backend]["export_messages"] == 5000
        assert "export_50k_per_s_met" in result["targets"][backend]
    assert "approvals" not in result
