"""bench/relay.py --quick runs and prints one JSON object with the expected keys (the send
rates, latencies, the grant-against-plain sends and route lookups against relay.info)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Bench smoke runs: in `make test`, deselect with `pytest -m 'not bench'`.
pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.postgres
def test_bench_quick_prints_the_figures(postgres_cluster: object) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "relay.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    for scenario in ("sqlite", "postgres"):
        data = figures[scenario]
        for key in (
            "sends_per_second",
            "sends",
            "clients",
            "processes",
            "notify_latency_ms",
            "sync_latency_ms",
            "cpu",
            "websocket",
        ):
            assert key in data, (scenario, key)
        assert set(data["sync_latency_ms"]) >= {"p50", "p99"}
        for arm in ("without_authorization", "with_grant"):
            assert data["authorization"][arm]["requests"] > 0, (scenario, arm)
        assert data["authorization"]["grant_slowdown"] > 0
        for arm in ("relay.info", "account.route.resolve"):
            assert data["route_lookup"][arm]["requests"] > 0, (scenario, arm)
        assert data["route_lookup"]["resolve_over_info"] > 0
        assert set(data["cpu"]) >= {"relay_ms_per_send", "client_ms_per_send"}
    assert figures["postgres"]["processes"] == 2
    assert "targets" in figures and "machine" in figures
    assert "sends_per_second" in figures["synapse"] or "error" in figures["synapse"]
    abuse = figures["abuse"]
    for key in ("slow_clients_throughput_ratio", "flood_cpu_per_send_ratio", "fds_rss", "met"):
        assert key in abuse, key
    assert abuse["slow_clients"]["during"]["fds_max"] >= abuse["slow_clients"]["slow_clients"]
    assert set(abuse["fds_rss"]["after"]) == {"fds", "rss_kib"}
