"""bench/e2ee_engine.py runs and reports every figure (the numbers themselves are not asserted)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "e2ee_engine.py"


async def test_engine_e2ee_bench_quick_run_prints_its_figures() -> None:
    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert child.returncode == 0, child.stderr
    figures = json.loads(child.stdout)
    assert figures["quick"] is True and figures["machine"]["cpu_count"]
    ingest = figures["ingest"]
    assert ingest["events"] == 200 and ingest["target_ratio"] == 1.25
    assert (
        ingest["encrypted_ms"] > 0 and ingest["plaintext_ms"] > 0 and ingest["bare_decrypt_ms"] > 0
    )
    heal = figures["heal"]
    assert heal["events"] == 500 and heal["target_ratio"] == 1.5 and heal["heal_ms"] > 0
    assert heal["set_diffs_published"] == 500  # one Set per healed row that is loaded
