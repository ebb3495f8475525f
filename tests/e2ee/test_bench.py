"""bench/e2ee.py runs and reports every figure (the numbers themselves are not asserted)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "e2ee.py"


async def test_e2ee_bench_quick_run_prints_its_figures() -> None:
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
    megolm = figures["megolm"]
    assert (
        megolm["bare_events_per_s"] > 0
        and megolm["machine_events_per_s"] > 0
        and megolm["ratio"] > 0
    )
    share = figures["share"]
    assert share["devices"] == 20 and share["ms"] > 0 and share["target_ms"] == 200
    heal = figures["heal"]
    assert (
        heal["events"] == 1000
        and heal["bare_ms"] > 0
        and heal["sqlite_commit_of_the_changes_ms"] > 0
    )
    assert set(heal["variants"]) == {"one_call", "batches_of_64_yielding", "thread_batches_of_256"}
    for variant in heal["variants"].values():
        assert (
            variant["ms"] > 0
            and variant["ratio_to_bare"] > 0
            and variant["longest_loop_stall_ms"] >= 0
        )
    fill = figures["recovered_fill"]
    assert fill["events"] == fill["filled_events"] == 200 and fill["pages"] == 4
    assert fill["sessions_fetched_by_the_fill"] == 5  # the newest row's came before the fill
    assert fill["original_ms"] > 0 and fill["ratio_recovered_to_original"] > 0
    assert fill["target_ratio"] == 1.5
