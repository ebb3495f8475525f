"""bench/meshline_crypto.py --quick runs and prints its JSON figures (keys only, never timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_prints_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "meshline_crypto.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    figures = json.loads(out.stdout)
    for key in (
        "seal_per_s",
        "open_per_s",
        "sync_page_1000_s",
        "sync_page_records",
        "crypto_floor_seal_per_s",
    ):
        assert key in figures
    assert figures["quick"] is True
