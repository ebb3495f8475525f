"""The walk driver's order of work: a page's flush, the next page's statements, its COMMIT.

The driver runs a real flow (`backwards_walk`) over a fake fetch and a fake commit that
runs its "statements" on a thread, as the store does, calls ``stored`` there and then
waits (its "COMMIT"). What it records is the order the driver did things in.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from gapline.history._drive import drive
from gapline.history._fill import Commit, WalkEnd, backwards_walk
from gapline.history._walk_state import PageResult, WalkState
from gapline.matrix import MessagesResponse, Request
from tests.history.test_fill_flow import page


class Recorder:
    """A fetch that answers at once or after ``fetch_delay``, and a commit whose COMMIT
    takes ``commit_wait`` on its thread, recording what happened in which order."""

    def __init__(
        self, *, fetch_delay: float = 0.0, commit_wait: float = 0.2, statements: float = 0.0
    ) -> None:
        self.log: list[str] = []
        self.fetch_delay = fetch_delay
        self.commit_wait = commit_wait
        self.statements = statements
        self.commits = 0
        self.fetched = 0
        self.started = asyncio.Event()  # a commit was handed over

    async def fetch(self, request: Request) -> MessagesResponse:
        del request
        self.fetched += 1
        n = self.fetched
        self.log.append(f"fetching {n}")
        if self.fetch_delay:
            await asyncio.sleep(self.fetch_delay)
        self.log.append(f"fetched {n}")
        return page(2, f"t{n}")

    def commit(
        self, at: WalkState, effect: Commit, stored: Callable[[], None]
    ) -> asyncio.Future[PageResult]:
        del effect
        self.commits += 1
        self.started.set()
        n = self.commits

        def on_thread() -> PageResult:
            if self.statements:
                threading.Event().wait(self.statements)
            self.log.append(f"statements {n}")
            stored()
            # The COMMIT: long enough for the loop to flush the page before beside it.
            threading.Event().wait(self.commit_wait)
            self.log.append(f"committed {n}")
            return PageResult(at, 2, False, False, None)

        async def write() -> PageResult:
            return await asyncio.to_thread(on_thread)

        return asyncio.create_task(write())  # owned by the driver: awaited on every path

    async def flush(self) -> None:
        self.log.append(f"flush after {self._last_committed()}")

    def _last_committed(self) -> int:
        done = [int(e.split()[1]) for e in self.log if e.startswith("committed")]
        return max(done, default=0)


async def _walk(recorder: Recorder, budget: int):
    flow = backwards_walk("!r:x", "t0", page_size=2, budget=budget)
    return await drive(
        flow, WalkState(), fetch=recorder.fetch, commit=recorder.commit, flush=recorder.flush
    )


async def test_a_page_is_flushed_while_the_next_page_commits() -> None:
    """With the next page already fetched, page N is flushed after page N+1's statements
    ran and before its COMMIT ended; the last page is left to the caller."""
    recorder = Recorder()
    outcome = await _walk(recorder, budget=3)
    assert outcome.end is WalkEnd.Budget and outcome.pages == 3
    log = recorder.log
    flushes = [i for i, e in enumerate(log) if e.startswith("flush")]
    assert len(flushes) == 2, log  # pages 1 and 2; page 3 is the caller's
    for n, at in zip((1, 2), flushes, strict=True):
        assert log.index(f"committed {n}") < at, log
        assert log.index(f"statements {n + 1}") < at < log.index(f"committed {n + 1}"), log


async def test_a_page_is_flushed_at_once_when_the_next_has_not_arrived() -> None:
    """A slow server: the committed page is shown before the driver waits for the next."""
    recorder = Recorder(fetch_delay=0.3, commit_wait=0.01)
    outcome = await _walk(recorder, budget=2)
    assert outcome.pages == 2
    log = recorder.log
    assert log.index("flush after 1") < log.index("fetched 2"), log
    assert log.count("flush after 1") == 1 and "flush after 2" not in log, log


async def test_a_walk_cancelled_mid_commit_counts_the_page() -> None:
    """Cancelling the driving task while a page commits: the page lands and is counted,
    and the outcome says the walk was cancelled."""
    recorder = Recorder(fetch_delay=0.3)
    task = asyncio.create_task(_walk(recorder, budget=5))
    await recorder.started.wait()
    task.cancel()
    outcome = await task
    assert outcome.end is WalkEnd.Cancelled
    assert outcome.pages == 1 and "committed 1" in recorder.log


async def test_a_server_answering_at_once_is_asked_once_the_statements_ran() -> None:
    """Answers faster than the statements: from the second page on, the next request goes
    out beside the COMMIT, after page N's statements ran (its work, which takes the GIL,
    does not slow them down) and before its COMMIT ended."""
    recorder = Recorder(statements=0.03)
    outcome = await _walk(recorder, budget=4)
    assert outcome.pages == 4
    log = recorder.log
    for n in (2, 3):  # page N's commit announces page N+1's request
        at = log.index(f"fetching {n + 1}")
        assert log.index(f"statements {n}") < at < log.index(f"committed {n}"), log


async def test_a_slow_server_is_asked_while_the_statements_run() -> None:
    """Answers that take longer than twice the statements (a server across a network):
    from the second page on (once both were measured), the next request goes out at
    once, its round trip hidden behind the whole commit."""
    recorder = Recorder(fetch_delay=0.2, statements=0.03, commit_wait=0.05)
    outcome = await _walk(recorder, budget=4)
    assert outcome.pages == 4
    log = recorder.log
    assert log.index("statements 1") < log.index("fetching 2"), log
    for n in (2, 3):
        assert log.index(f"fetching {n + 1}") < log.index(f"statements {n}"), log


async def test_a_page_whose_write_fails_asks_for_no_next_page() -> None:
    """A write that fails before its statements ran: the walk ends failed, and the next
    page it announced is never requested."""
    from gapline.storage import StorageError

    recorder = Recorder()

    def failing(
        at: WalkState, effect: Commit, stored: Callable[[], None]
    ) -> asyncio.Future[PageResult]:
        del at, effect, stored

        async def write() -> PageResult:
            raise StorageError("disk full")

        return asyncio.create_task(write())

    flow = backwards_walk("!r:x", "t0", page_size=2, budget=3)
    outcome = await drive(
        flow, WalkState(), fetch=recorder.fetch, commit=failing, flush=recorder.flush
    )
    assert outcome.end is WalkEnd.Failed and outcome.pages == 0
    assert recorder.log == ["fetching 1", "fetched 1"], recorder.log
