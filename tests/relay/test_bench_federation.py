"""bench/relay_federation.py --quick runs and prints one JSON object with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_federation_bench_quick_prints_the_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "relay_federation.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["same_relay"]["sends"] == figures["cross_relay"]["sends"] > 0
    assert figures["bare_round_trip"]["calls"] > 0
    for key in ("per_delivery_ratio", "cross_over_bare", "cross_over_same"):
        assert figures[key] > 0, key
    assert set(figures["notify_latency_ms"]) >= {"p50", "p99"}
    assert len(figures["route_resolution_ms"]) == 2
    assert "met" in figures and "machine" in figures
