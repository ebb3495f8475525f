"""`WaysOut`: a stop signal ends a program through its own path, or, when that path is
stuck, through the watcher thread; a terminal that went away counts as SIGHUP.

Each case runs a small program as a child process: it installs `WaysOut` with a
teardown that writes a marker file, says "ready", then either waits politely (its task
can be cancelled) or blocks its only thread on a lock, as a Textual app does once its
terminal is gone and its output queue is full."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.terminal import TerminalChild

pytestmark = pytest.mark.timeout(120)

PROGRAM = """
import asyncio, sys, threading
from pathlib import Path
from gapline.tui._ways_out import WaysOut

marker, how, watch = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "watch"

lock = threading.Lock()
done = []

def teardown():
    # Idempotent and locked, as a real teardown must be; "slow" takes twice the grace.
    with lock:
        if done:
            return
        if how == "slow":
            threading.Event().wait(2.0)
        with marker.open("a") as f:
            f.write("removed\\n")
        done.append(True)

async def main():
    ways = WaysOut(teardown, grace=1.0)
    with ways.installed(terminal=0 if watch else None):
        try:
            print("ready", flush=True)
            if how == "stuck":
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()  # never returns: the event loop runs no callback again
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ways.task.uncancel()
            return ways.status
        finally:
            ways.teardown()

sys.exit(asyncio.run(main()))
"""


def start(tmp_path: Path, how: str, watch: str = "no-watch") -> tuple[subprocess.Popen[str], Path]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(marker), how, watch],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc, marker


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_program_through_its_own_teardown(
    tmp_path: Path, signum: signal.Signals
) -> None:
    proc, marker = start(tmp_path, "polite")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert marker.read_text() == "removed\n"  # once, by the program itself
    assert out == "" and "Traceback" not in err


def test_a_burst_of_signals_still_ends_the_program(tmp_path: Path) -> None:
    # On a busy machine a SIGHUP to the job of `make demo` reached the demo twice at
    # once: a handler that ran inside another and took the lock that one held would
    # wait for itself for ever (and a long burst would nest handlers without end).
    proc, marker = start(tmp_path, "polite")
    sent = 0
    while proc.poll() is None and sent < 20_000:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGHUP)
        sent += 1
    _, err = proc.communicate(timeout=60)
    # After the block the default handling is back: a late one ends the process itself.
    assert proc.returncode in (128 + signal.SIGHUP, -signal.SIGHUP), err
    assert marker.read_text() == "removed\n"
    assert "Traceback" not in err


def test_a_stuck_program_is_torn_down_by_the_watcher(tmp_path: Path) -> None:
    proc, marker = start(tmp_path, "stuck")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert marker.read_text() == "removed\n"
    assert out == "stopped by SIGTERM; removed everything after 1 s of waiting\n"


def test_a_teardown_slower_than_the_grace_is_not_claimed_by_the_watcher(tmp_path: Path) -> None:
    # The program's own teardown outlasts the grace (a homeserver still starting on a
    # busy machine): the watcher waits for it and says nothing of its own.
    proc, marker = start(tmp_path, "slow")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert marker.read_text() == "removed\n"
    assert out == "" and "Traceback" not in err


# A session leader that ignores SIGHUP and waits for its child, as make does: when the
# terminal closes, the child gets no signal at all.
LEADER = (
    "import signal, subprocess, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    "sys.exit(subprocess.call(sys.argv[1:]))"
)


@pytest.mark.parametrize("how", ["polite", "stuck"])
def test_a_terminal_that_went_away_is_a_sighup(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "marker"
    child = TerminalChild(
        [sys.executable, "-c", LEADER, sys.executable, "-c", PROGRAM, str(marker), how, "watch"]
    )
    try:
        child.wait_for("ready")
        child.hang_up()
        code = child.wait(timeout=60)
    finally:
        child.close()
    assert code == 128 + signal.SIGHUP
    assert marker.read_text() == "removed\n"
