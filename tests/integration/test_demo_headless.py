"""`gapline demo --headless` end to end: its own throwaway Synapse, the story, the fill.

Runs the command as a user would (a child process) and checks its exit status
and what it printed: the gap row before the fill, the fill's reports, the
sections joined after it, and everything torn down.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from gapline.matrix.devserver import synapse_available
from tests.fixtures.synapse import OWN_HOMESERVER

pytestmark = [pytest.mark.synapse, pytest.mark.slow, OWN_HOMESERVER]


def test_demo_headless_finds_and_fills_the_gap() -> None:
    if not synapse_available() and os.environ.get("CI", "").lower() != "true":
        pytest.skip("matrix-synapse is not installed")
    done = subprocess.run(
        [sys.executable, "-m", "gapline.cli", "demo", "--headless"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TZ": "UTC"},
    )
    out = done.stdout
    assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr}"
    before, _, after = out.partition("filling the gap")
    assert "── gap in history · f to fill ──" in before
    assert "early message 40" in before and "later message 300" in before
    assert "later message 1\n" not in before  # the gap hides the first later messages
    reports = re.findall(r"fill report: phase=(\w+) pages=(\d+) events=(\d+)(.*)", after)
    assert reports[0][:3] == ("Bridging", "0", "0")
    assert reports[-1][0] == "Ready" and "continuity=Verified" in reports[-1][3]
    filled = re.search(r"gap filled: (\d+) events, continuity Verified", after)
    assert filled is not None and int(filled.group(1)) == sum(int(r[2]) for r in reports)
    around = after.split("where the gap was:")[1].splitlines()[1:5]
    bodies = [line.split(": ", 1)[1] for line in around]
    assert bodies[1:3] == ["early message 40", "later message 1"]
    assert "gap in history" not in after.split("after the fill:")[1]
    assert out.rstrip().endswith("demo homeserver stopped; everything removed")
