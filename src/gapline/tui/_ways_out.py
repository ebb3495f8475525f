"""Every way out of a program that made things it must remove: signals, a closed terminal.

`WaysOut` turns SIGINT, SIGTERM, SIGHUP and a controlling terminal that went away
into one orderly stop. The program's own path comes first: the running app is asked
to exit (it restores the terminal and closes its engine), or else the program's
task is cancelled, and its ``finally`` removes what it made. If that has not
finished within ``grace`` seconds, the watcher thread runs the teardown itself and
ends the process with status 128 + the signal's number. That is not paranoia: a
Textual app whose terminal closed blocks for good once its output queue is full
(its writer thread died on the first failed write), and a blocked event loop runs
no callback, so the handlers are Python-level ones (they run between bytecodes of
the main thread, even while it waits on a lock) and the last resort is a thread.

A handler takes no lock: it can run inside any frame of the main thread, including
another handler's (on a busy machine, a SIGHUP to the job of ``make demo`` reached
the demo twice at once), and a lock that frame holds would then wait for itself for
ever, as a `threading.Event`'s did. So the first handler ignores the stop signals
from then on, sets a flag, writes a byte to a pipe that wakes the watcher, and asks
the loop to end politely through its thread-safe call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Generator
from typing import Any, Protocol

__all__ = ["STOP_SIGNALS", "WaysOut"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Exits(Protocol):
    def exit(self, result: Any = None, return_code: int = 0, message: Any = None) -> None: ...


def _write_stdout(text: str) -> None:
    # Not print(): the main thread may hold stdout's lock while it is stuck; and after
    # SIGHUP the terminal is gone, so a failed write is no reason to stop.
    with contextlib.suppress(OSError):
        os.write(1, (text + "\n").encode())


class WaysOut:
    def __init__(
        self,
        teardown: Callable[[], None],
        *,
        grace: float = 5.0,
        say: Callable[[str], None] = _write_stdout,
    ) -> None:
        self._teardown = teardown  # idempotent and thread-safe: it may run on either thread
        self.grace = grace
        self._say = say
        self.signum: int | None = None
        self.app: _Exits | None = None  # set while the app runs
        self.task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False  # set by stop(); never a lock (see the module's docstring)
        self._wake: tuple[int, int] | None = None  # the watcher's pipe, while installed
        self._done = threading.Event()
        self._torn_down = threading.Event()  # the program's own path finished its teardown

    @property
    def status(self) -> int | None:
        """128 + the signal that stopped the program, or None when none did."""
        return None if self.signum is None else 128 + self.signum

    @contextlib.contextmanager
    def installed(self, *, terminal: int | None = None) -> Generator[WaysOut]:
        """Handle the stop signals (and watch ``terminal``, a file descriptor, when given)
        for the current task, until the block ends."""
        self._loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        wake_r, wake_w = self._wake = os.pipe()
        os.set_blocking(wake_w, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        watcher = threading.Thread(
            target=self._watch, args=(terminal, wake_r), name="ways-out", daemon=True
        )
        watcher.start()
        try:
            yield self
        finally:
            self._done.set()
            self._wake_watcher()
            watcher.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._wake = None
            os.close(wake_r)
            os.close(wake_w)

    def teardown(self) -> None:
        """The program's own teardown, on its way out: once it has run, the watcher no
        longer claims to have removed anything (it may still end a process stuck after)."""
        self._teardown()
        self._torn_down.set()

    def _on_signal(self, signum: int, frame: object) -> None:
        del frame
        # The first signal decides; later ones are not even delivered while the block
        # runs, so a burst cannot nest handlers until the stack overflows.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        self.stop(signum)

    def stop(self, signum: int) -> None:
        """Stop for ``signum``: ask the app to exit, or cancel the task (the first signal
        decides the status); the watcher gives that ``grace`` seconds."""
        if self.signum is None:
            self.signum = signum
        self._wake_watcher()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._end_politely)

    def _wake_watcher(self) -> None:
        self._stopping = True
        wake = self._wake
        if wake is not None:
            # Full (the watcher was woken already) or closed (it is gone): nothing to do.
            with contextlib.suppress(OSError):
                os.write(wake[1], b"\0")

    def _end_politely(self) -> None:
        if self.app is not None:
            self.app.exit(return_code=self.status or 0)
        elif self.task is not None and not self.task.done():
            self.task.cancel()

    def _watch(self, terminal: int | None, wake: int) -> None:
        # A terminal that closed is a SIGHUP even when the kernel sent that signal only to
        # the session's leader: `make demo` run straight from `ssh -t` leaves make as the
        # leader, and make waits for its children without telling them.
        poller = select.poll()  # not select(): a descriptor may be above FD_SETSIZE
        poller.register(wake, select.POLLIN)
        while not self._stopping:
            poller.poll(None if terminal is None else 500)
            if terminal is not None and not self._stopping and not os.isatty(terminal):
                self.stop(signal.SIGHUP)
        if self._done.wait(self.grace):
            return
        # A teardown the program is running holds the teardown's lock: this call waits
        # for it (a start still under way can take longer than the grace on a busy box).
        self._teardown()
        if self._torn_down.is_set():
            # The program removed everything itself and said so; give it the grace
            # again to leave, then end it without a second message.
            if self._done.wait(self.grace):
                return
        else:
            name = signal.Signals(self.signum or signal.SIGTERM).name
            self._say(f"stopped by {name}; removed everything after {self.grace:g} s of waiting")
        os._exit(self.status or 1)
