"""A command on a pseudo-terminal of its own, as a person's shell runs it.

The child is the leader of a new session whose controlling terminal is the
pseudo-terminal, so the terminal's keys reach it (Ctrl-C as a key in raw mode,
or as SIGINT at a prompt) and closing the terminal (`hang_up`) makes the kernel
send it SIGHUP, exactly as closing a terminal window does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["TerminalChild", "processes_mentioning"]

# CSI and other escape sequences a terminal application writes between its words.
_ESCAPES = re.compile(
    rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]"
)


def _become_terminal_owner() -> None:  # runs in the child, after setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class TerminalChild:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        size: tuple[int, int] = (30, 100),
    ) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        self.proc = subprocess.Popen(
            list(argv),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env={**(env or os.environ), "TERM": "xterm-256color"},
            start_new_session=True,
            preexec_fn=_become_terminal_owner,
        )
        os.close(slave)
        self._master: int | None = master
        self._output = bytearray()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="terminal-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # select with a timeout, never a blocking read: a read in progress would keep the
        # terminal open after `hang_up` closed it, and the kernel would send no SIGHUP.
        master = self._master
        assert master is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([master], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process on the terminal has gone
                data = b""
            with self._changed:
                if data:
                    self._output.extend(data)
                self._changed.notify_all()
            if not data:
                return

    def text(self) -> str:
        """Everything the terminal showed, escape sequences removed."""
        with self._changed:
            raw = bytes(self._output)
        return _ESCAPES.sub(b"", raw).decode(errors="replace")

    def wait_for(self, needle: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while needle not in self.text():
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"the terminal never showed {needle!r}; it showed:\n{self.text()[-3000:]}"
                    )
                self._changed.wait(min(left, 0.5))
        return self.text()

    def type(self, keys: bytes) -> None:
        assert self._master is not None, "the terminal was hung up"
        os.write(self._master, keys)

    def hang_up(self) -> None:
        """Close the terminal, as closing its window does: the child gets SIGHUP."""
        self._stop.set()
        self._reader.join()
        if self._master is not None:
            os.close(self._master)
            self._master = None

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # What a hang looks like from outside, for the one who reads the failure.
            session = "\n".join(processes_in_session(self.proc.pid)) or "(none)"
            raise AssertionError(
                f"{self.proc.args!r} still ran {timeout:g} s later; the terminal showed:\n"
                f"{self.text()[-3000:]}\nprocesses in its session:\n{session}"
            ) from None
        self._stop.set()
        self._reader.join()
        return code

    def close(self) -> None:
        """Stop the child if it still runs (a failed test) and release the terminal."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.hang_up()


def _processes() -> Iterator[tuple[str, str, str]]:
    """(pid, /proc stat line, command line) of each running process (Linux /proc); one
    that exits while it is read is left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        yield entry.name, stat, cmdline


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the running processes that contain ``text`` (Linux /proc)."""
    me = str(os.getpid())
    return [f"{pid} {cmdline}" for pid, _, cmdline in _processes() if text in cmdline and pid != me]


def processes_in_session(sid: int) -> list[str]:
    """``pid state command line`` of each running process in session ``sid`` (Linux /proc)."""
    found = []
    for pid, stat, cmdline in _processes():
        fields = stat[stat.rindex(")") + 2 :].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid:
            found.append(f"{pid} {fields[0]} {cmdline}")
    return found


def kill_mentioning(text: str) -> None:
    """SIGKILL every process whose command line contains ``text`` (what a failed test left)."""
    for line in processes_mentioning(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)
