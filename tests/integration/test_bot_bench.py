"""bench/bot.py --quick runs against the session's Synapse and prints its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gapline.matrix.devserver import SynapseServer

pytestmark = [pytest.mark.bench, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bot.py"


def test_bot_bench_quick_prints_its_figures(synapse: SynapseServer, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--senders",
            "2",
            "--messages",
            "2",
            "--homeserver",
            synapse.base_url,
            "--store",
            str(tmp_path / "bench.sqlite3"),
        ],
        capture_output=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    figures = json.loads(out.stdout)
    for key in (
        "answers_per_s",
        "e2e_ms",
        "journal_ms",
        "homeserver_and_wait_ms",
        "admission_to_enqueue_ms",
        "admission_to_enqueue_journal_ms",
        "claim_to_ack_ms",
        "claim_to_ack_journal_ms",
        "journal_share",
        "target_met",
    ):
        assert key in figures
    assert figures["answers"] == 4


JOURNAL_BENCH = BENCH.parent / "journal.py"


def test_journal_bench_quick_measures_approval_round_trips(
    synapse: SynapseServer, tmp_path: Path
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(JOURNAL_BENCH),
            "--quick",
            "--no-anchor",
            "--backends",
            "sqlite",
            "--homeserver",
            synapse.base_url,
        ],
        capture_output=True,
        timeout=240,
        check=False,
        cwd=JOURNAL_BENCH.parents[1],
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    approvals = json.loads(out.stdout)["approvals"]
    assert approvals["approvals"] == 3
    assert set(approvals["round_trip_ms"]) == {"p50", "p95", "min"}
    assert approvals["round_trip_ms"]["p50"] > 0
