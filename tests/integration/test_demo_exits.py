"""`gapline demo` and `make demo` remove everything on every way out.

Each run gets its own ``TMPDIR``, so "everything" is checkable: after the demo
exited, that directory is empty (no ``gapline-demo-*``, store included) and no
process mentions it (the demo's Synapse runs with its config in there).

The TUI runs on a pseudo-terminal the demo owns, as in a terminal window: ``q``
and Ctrl-C are keys, closing the terminal sends SIGHUP, and the crash hook
(`gapline.tui.demo.CRASH_KEY_ENV`) makes the TUI raise as a bug would. The ways
out before the TUI (Synapse starting, the story being written) use
``--headless``, which needs no terminal.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gapline.clikit import Exit
from gapline.matrix.devserver import synapse_available
from gapline.tui.demo import CRASH_KEY_ENV
from tests.fixtures.synapse import OWN_HOMESERVER
from tests.terminal import TerminalChild, kill_mentioning, processes_mentioning

pytestmark = [pytest.mark.synapse, pytest.mark.slow, pytest.mark.timeout(300), OWN_HOMESERVER]

REPO = Path(__file__).resolve().parents[2]
SMALL_STORY = ["--first", "5", "--more", "30"]
TUI_UP = "Fill gap"  # the footer, shown once the app is on the screen


@pytest.fixture(autouse=True)
def needs_synapse() -> None:
    if not synapse_available() and os.environ.get("CI", "").lower() != "true":
        pytest.skip("matrix-synapse is not installed")


@pytest.fixture
def tmpdir_of_the_demo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "tmp"
    path.mkdir()
    yield path
    # A failed test may leave the demo's homeserver running (it has a session of its
    # own): stop it here, so later tests do not share the machine with it.
    kill_mentioning(str(path))


def env_for(tmpdir: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmpdir), "NO_PROXY": "127.0.0.1", **extra}


def assert_everything_removed(tmpdir: Path) -> None:
    assert processes_mentioning(str(tmpdir)) == []
    assert sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith("uv-")) == []


def demo_on_a_terminal(tmpdir: Path, **env: str) -> TerminalChild:
    return TerminalChild(
        [sys.executable, "-m", "gapline.cli", "demo", *SMALL_STORY], env=env_for(tmpdir, **env)
    )


@pytest.mark.parametrize(
    ("way", "status"),
    [
        ("q", Exit.OK),
        ("ctrl-c", Exit.OK),
        ("sigterm", 128 + signal.SIGTERM),
        ("terminal closed", 128 + signal.SIGHUP),
        ("crash", 1),
    ],
)
def test_every_way_out_of_the_tui_removes_everything(
    tmpdir_of_the_demo: Path, way: str, status: int
) -> None:
    child = demo_on_a_terminal(tmpdir_of_the_demo, **{CRASH_KEY_ENV: "x"})
    try:
        child.wait_for(TUI_UP)
        assert list(tmpdir_of_the_demo.glob("gapline-demo-*/store"))  # the store exists now
        match way:
            case "q":
                child.type(b"q")
            case "ctrl-c":
                child.type(b"\x03")
            case "sigterm":
                child.send_signal(signal.SIGTERM)
            case "terminal closed":
                child.hang_up()
            case "crash":
                child.type(b"x")
        code = child.wait()
    finally:
        child.close()
    assert code == status, child.text()[-3000:]
    if way == "crash":
        assert "the demo TUI crashed on purpose" in child.text()
    assert_everything_removed(tmpdir_of_the_demo)


@pytest.mark.parametrize(
    ("when", "signum"),
    [
        ("starting a throwaway Synapse", signal.SIGTERM),
        ("writes 5 messages", signal.SIGINT),
        ("writes 30 more messages", signal.SIGHUP),
    ],
)
def test_a_signal_before_the_tui_removes_everything(
    tmpdir_of_the_demo: Path, when: str, signum: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gapline.cli", "demo", "--headless", *SMALL_STORY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(tmpdir_of_the_demo),
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        while not seen or when not in seen[-1]:
            line = proc.stdout.readline()
            assert line, f"the demo ended before {when!r}: {seen}"
            seen.append(line)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert out.rstrip().endswith(
        f"stopped by {signal.Signals(signum).name}\ndemo homeserver stopped; everything removed"
    )
    assert "Traceback" not in err
    assert_everything_removed(tmpdir_of_the_demo)


def _uv() -> str | None:
    return shutil.which("uv") or next(
        (
            str(p)
            for p in (REPO / ".tools/bin/uv", Path(sys.prefix).parent / ".tools/bin/uv")
            if p.exists()
        ),
        None,
    )


@pytest.mark.parametrize("way", ["shell hangs up", "terminal closed under make", "sigterm to make"])
def test_make_demo_removes_everything(tmpdir_of_the_demo: Path, way: str) -> None:
    """`make demo` runs make -> uv -> gapline demo. Closing a terminal window makes the shell
    send SIGHUP to the whole job; when make itself owns the terminal (``ssh -t host make
    demo``) only make gets it, and make waits for its children without telling them, so the
    demo watches its terminal. SIGTERM to make alone reaches the demo through make and uv."""
    uv = _uv()
    if uv is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("make demo needs uv, and none was found under CI=true")
        pytest.skip("uv is not installed here")
    child = TerminalChild(
        ["make", "--no-print-directory", "demo", f"UV={uv}", f"DEMO_ARGS={' '.join(SMALL_STORY)}"],
        env=env_for(tmpdir_of_the_demo),
        cwd=REPO,
    )
    try:
        child.wait_for(TUI_UP, timeout=240)
        match way:
            case "shell hangs up":
                os.killpg(child.proc.pid, signal.SIGHUP)
            case "terminal closed under make":
                child.hang_up()
            case "sigterm to make":
                child.send_signal(signal.SIGTERM)
        child.wait()
    finally:
        child.close()
    assert_everything_removed(tmpdir_of_the_demo)
