"""The meshline benchmarks run with --quick and print their JSON figures (keys only, never
timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Bench smoke runs: in `make test`, deselect with `pytest -m 'not bench'`.
pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


def _quick(script: str) -> dict[str, Any]:
    """The JSON a bench script prints in its --quick form."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    return json.loads(out.stdout)


def test_bench_quick_prints_figures() -> None:
    figures = _quick("meshline_crypto.py")
    for key in (
        "seal_per_s",
        "open_per_s",
        "sync_page_1000_s",
        "sync_page_records",
        "crypto_floor_seal_per_s",
        "crypto_floor_seal_cryptography_per_s",
    ):
        assert key in figures
    assert figures["quick"] is True


def test_crypto_primitives_quick_prints_figures() -> None:
    figures = _quick("crypto_primitives.py")
    assert figures["quick"] is True
    assert set(figures["versions"]) == {"cryptography", "pynacl"}
    assert set(figures["primitives"]) == {
        "x25519_keygen",
        "x25519_exchange",
        "x25519_exchange_parse",
        "ed25519_sign",
        "ed25519_verify",
    }
    for row in figures["primitives"].values():
        assert set(row) == {"cryptography_us", "libsodium_us", "faster", "speedup"}
