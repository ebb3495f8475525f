"""The driver of a backwards walk: the I/O around :func:`gapline.history._fill.backwards_walk`.

The flow decides; :func:`drive` carries out its effects with the two functions
it is given, ``fetch`` (a ``/messages`` page) and ``commit`` (a page into the
store), and keeps the :class:`~gapline.history._walk_state.WalkState` from one
committed page to the next. What the driver guarantees:

- while a page commits, the next page (the flow's ``prefetch``) is already
  being fetched, so a walk costs about its round trips; a prefetch the flow
  does not ask for (the walk ended) is cancelled. When it is sent depends on
  the server (:class:`_Pace`): at once when its answers take longer than
  twice the page's statements (a server across a network: the round trip
  hides behind the commit), else, and for the walk's first page, once the
  store's thread says the statements ran, beside the COMMIT. A server that
  answers at once (on this machine) costs only loop work (building the
  request, reading the answer), which then overlaps the fsync (it holds no
  GIL) instead of taking the GIL from the statements and leaving the fsync
  to overlap nothing;
- a failed fetch or commit is thrown into the flow as :class:`WalkFailed`,
  with a message a user can read, and the flow settles its outcome;
- cancelling the driving task is thrown into the flow as
  :class:`WalkCancelled` and becomes an outcome, not an error; a page whose
  commit was under way still lands and is counted first;
- every committed page is flushed to the room's timeline before the page
  after it commits: at once when the next page has not arrived yet (the loop
  would only wait for it), else while the next page's COMMIT is on disk. The
  store's thread calls the commit's ``stored`` once the page's statements
  ran; the loop, idle while the writer runs them (a busy loop keeps the GIL
  from the writer), then flushes during the fsync, which holds no GIL.
  Flushing before handing the next page over would leave the writer waiting
  for the loop and the fsync overlapping nothing. The two threads still race
  for the GIL between that call and the COMMIT: when the loop wins, the flush
  runs first, as it did before. The last page is flushed by the caller, as
  it settles the walk. Nothing a commit computes reads the timeline: a page
  is placed from the store, and the timeline applies updates in commit
  order whenever it flushes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gapline.history._commits import StatementsRan
from gapline.history._failures import describe
from gapline.history._fill import Commit, Fetch, WalkCancelled, WalkFailed, WalkFlow, WalkOutcome
from gapline.history._operations import uncancel
from gapline.history._walk_state import PageResult, WalkState
from gapline.matrix import MatrixError, MessagesResponse, Request
from gapline.storage import StorageError

__all__ = ["CommitPage", "FetchPage", "drive"]

FetchPage = Callable[[Request], Coroutine[Any, Any, MessagesResponse]]
"""Send one ``/messages`` request; raises ``MatrixError`` when the server fails."""

CommitPage = Callable[[WalkState, Commit, Callable[[], None]], asyncio.Future[PageResult]]
"""Start committing one page from where the walk stands: its future, which raises
``StorageError`` when the store fails, and is owned by whoever started it (the page lands
whether or not the driver still waits). The third argument (``stored``) is to be called
from the store's thread once the page's statements ran, before its COMMIT."""


class _Pace:
    """How long the walk's last answer and last page's statements took (loop seconds):
    whether the next request goes out while the page's statements run, or after."""

    __slots__ = ("fetch", "statements")

    def __init__(self) -> None:
        self.fetch: float | None = None
        self.statements: float | None = None

    def early(self) -> bool:
        """Send at once when answers take more than twice the statements (their round
        trip is worth overlapping). Not before both were measured: the first page's
        request waits for its statements, so a write that fails asks for nothing."""
        if self.fetch is None or self.statements is None:
            return False
        return self.fetch > 2 * self.statements


async def _discard(task: asyncio.Task[MessagesResponse]) -> None:
    """Cancel a prefetch nobody will read, and wait until it is gone."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, MatrixError):
        await task


async def drive(
    flow: WalkFlow,
    state: WalkState,
    *,
    fetch: FetchPage,
    commit: CommitPage,
    flush: Callable[[], Awaitable[None]],
) -> WalkOutcome:
    """Run a walk: fetch each page, commit it, flush it; cancellation becomes an outcome."""
    # The prefetched request and its task. Owned here: it is read by the next
    # Fetch, or cancelled and awaited (a stale one at once, the last one on exit).
    ahead: tuple[Request, asyncio.Task[MessagesResponse]] | None = None
    unflushed = False  # the last committed page is not flushed yet
    loop = asyncio.get_running_loop()
    pace = _Pace()

    async def timed(request: Request) -> MessagesResponse:
        started = loop.time()
        page = await fetch(request)
        pace.fetch = loop.time() - started
        return page

    try:
        effect = next(flow)
        while True:
            try:
                if isinstance(effect, Fetch):
                    arrived = ahead is not None and ahead[0] == effect.request and ahead[1].done()
                    if unflushed and not arrived:
                        unflushed = False
                        await flush()
                    try:
                        if ahead is not None and ahead[0] == effect.request:
                            task, ahead = ahead[1], None
                            page = await task
                        else:
                            if ahead is not None:
                                stale, ahead = ahead[1], None
                                await _discard(stale)
                            page = await timed(effect.request)
                    except MatrixError as exc:
                        effect = flow.throw(WalkFailed(describe(exc)))
                        continue
                    effect = flow.send(page)
                else:
                    assert isinstance(effect, Commit)
                    # Awaited on every path, through the shield and, when this task
                    # is cancelled meanwhile, once more below. The prefetch starts
                    # now or once the statements ran (see the module's docstring).
                    ran = StatementsRan()
                    handed = loop.time()
                    committing = commit(state, effect, ran)
                    prefetch = effect.prefetch
                    if prefetch is not None and pace.early():
                        ahead, prefetch = (prefetch, asyncio.create_task(timed(prefetch))), None
                    try:
                        await ran.wait(committing)
                        pace.statements = loop.time() - handed
                        if prefetch is not None:
                            ahead = (prefetch, asyncio.create_task(timed(prefetch)))
                        if unflushed:
                            unflushed = False
                            await flush()
                        result = await asyncio.shield(committing)
                    except asyncio.CancelledError:
                        # The page is committed whatever happens: count it, then stop.
                        result = await committing
                        state = result.state
                        try:
                            flow.send(result)
                        except StopIteration as stop:
                            uncancel()
                            return stop.value
                        raise
                    except StorageError as exc:
                        effect = flow.throw(WalkFailed(describe(exc)))
                        continue
                    state = result.state
                    # The flow counts the page before anything else can be cancelled.
                    unflushed = True
                    effect = flow.send(result)
            except asyncio.CancelledError:
                uncancel()
                try:
                    flow.throw(WalkCancelled())
                except StopIteration as stop:
                    return stop.value
                raise AssertionError("a walk must end when it is cancelled") from None
    except StopIteration as stop:
        return stop.value
    finally:
        if ahead is not None:
            await _discard(ahead[1])
