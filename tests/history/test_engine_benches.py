"""The history benchmarks run (``--quick``) and print the figures they promise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow]


def run_bench(path: str) -> dict:
    done = subprocess.run(
        [sys.executable, path, "--quick"], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout)


def test_history_open_bench_quick():
    figures = run_bench("bench/history_open.py")
    for key in (
        "open_ms_small",
        "open_ms_large",
        "open_ratio",
        "ingest_events_per_s",
        "ingest_cpu_events_per_s",
        "generate_events_per_s",
        "open_relations_ratio",
        "rss_growth_mb",
        "rows_held",
    ):
        assert key in figures, key
    assert figures["quick"] is True


def test_gap_fill_bench_quick():
    figures = run_bench("bench/gap_fill.py")
    for key in (
        "fake_overhead_ms_per_page",
        "fake_total_ms_per_page",
        "fake_overhead_cpu_ms_per_page",
        "bare_commit_ms_per_page",
        "fake_overhead_beyond_commit_ms_per_page",
        "fake_overhead_relations_ms_per_page",
        "relations_overhead_ratio",
        "relations_overhead_cpu_ratio",
        "plain_overhead_over_bare_commit",
        "synapse_fill_ms",
        "synapse_raw_ms",
        "synapse_ratio",
    ):
        assert key in figures, key


def test_send_queue_bench_quick():
    figures = run_bench("bench/send_queue.py")
    for key in (
        "echo_ms_p50",
        "echo_ms_p99",
        "commit_ms_p50",
        "commit_ms_p99",
        "echo_over_commit_p99_ms",
        "queue_sends_per_s",
        "raw_sends_per_s",
        "queue_slowdown",
        "room_list_ms_p50",
        "room_list_ms_p99",
    ):
        assert key in figures, key
    assert figures["quick"] is True and figures["echo_samples"] == 50
