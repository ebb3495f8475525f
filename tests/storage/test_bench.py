"""bench/storage.py runs and reports every figure (the numbers themselves are not asserted)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Bench smoke runs: in `make test`, deselect with `pytest -m 'not bench'`.
pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "storage.py"


@pytest.mark.slow
@pytest.mark.postgres
async def test_storage_bench_quick_run_prints_its_figures(postgres_cluster: object) -> None:
    # postgres_cluster: skip (or, under CI, fail) here when no server can start;
    # the benchmark itself starts its own throwaway cluster.
    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert child.returncode == 0, child.stderr
    out = child.stdout
    figures = json.loads(out)
    assert {"cpu_count", "platform", "python", "sqlite", "fsync_ms_p50"} <= figures[
        "machine"
    ].keys()
    assert figures["date"] and figures["writers"] == 64
    for backend in ("sqlite", "postgres"):
        assert "skipped" not in figures[backend], figures[backend]
        for mode in ("group_commit", "one_tx_per_write"):
            run = figures[backend][mode]
            assert {
                "writes",
                "seconds",
                "writes_per_s",
                "latency_ms_p50",
                "latency_ms_p99",
            } <= run.keys()
            assert run["writes"] > 0
        assert figures[backend]["speedup"] > 0
    assert figures["postgres"]["group_commit_4_writers"]["writes"] > 0
