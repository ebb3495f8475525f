"""The write path shared by both backends: a writer thread per connection, group commit.

Why a thread that owns the connection, fed by a ``queue.SimpleQueue``: an
operation is synchronous driver work, so it must run off the event loop; a
single writer serialises writes without any lock in the database, and a
thread that blocks on a C-level queue costs one call per enqueued write and no
executor hop per batch. While the writer is busy committing (fsync), new writes
pile up in the queue; the next turn drains up to ``max_batch`` of them into one
transaction. Each operation runs inside its own SAVEPOINT, so one that raises
is rolled back alone. Every caller's future is resolved only after the COMMIT
holding its write has returned, with one ``call_soon_threadsafe`` per batch.

Every ``except BaseException`` in the loop is deliberate: whatever an
operation or the driver raises is handed to the waiting caller, and the writer
thread itself must survive it.

A *batched* write (``write_batched(fn, item)``) goes further: consecutive queued
items of the same batch function reach it as one list, ``fn(tx, items)``, inside
one savepoint. The point is the number of driver calls: on SQLite every
statement drops and re-takes the GIL, and under load each re-take waits for the
event loop, so a write costs what its statement count costs. A batch function
answers N items with a handful of multi-row statements. It returns one outcome
per item (a value, or an exception for an item that wrote nothing); if it
raises, its savepoint is rolled back and each item is run again alone, so one
bad item costs its neighbours a retry, never their result.

The driver-specific part is a :class:`WriterSession` (begin / savepoint /
commit statements and the error mapper); the loop here knows no driver.
SQLite has exactly one writer session; PostgreSQL may have several
(``writers=N``), each thread taking the next batch from the shared queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import CoroutineType
from typing import Any, Protocol, TypeVar

from gapline.storage._errors import BackendClosed, OperationalError, StorageError
from gapline.storage._notify import NotificationHub

__all__ = ["BatchFn", "GroupCommitWriter", "ReaderPool", "ReaderSession", "WriterSession"]

T = TypeVar("T")
ItemT = TypeVar("ItemT")

# fn(tx, items) -> one outcome per item: a value, or an exception that item raises (the
# function guarantees such an item wrote nothing).
BatchFn = Callable[[Any, list[ItemT]], Sequence[T | BaseException]]


class _Batched:
    """A queued item of a batch function (what ``write_batched`` puts in the queue)."""

    __slots__ = ("fn", "item")

    def __init__(self, fn: BatchFn[Any, Any], item: Any) -> None:
        self.fn = fn
        self.item = item


# (op, future, loop): a write waiting in the queue.
_Item = tuple["Callable[[Any], Any] | _Batched", "asyncio.Future[Any]", asyncio.AbstractEventLoop]
# (future, ok, value-or-exception): the outcome of one write, resolved on its loop.
_Outcome = tuple["asyncio.Future[Any]", bool, Any]


class WriterSession(Protocol):
    """One writer connection and its transaction statements."""

    tx: Any  # the Tx handed to operations; exposes notes_mark/notes_truncate/take_notes, hooks

    def begin(self, grouped: bool) -> None:
        """Open the transaction; ``grouped``: savepoints follow (a session may defer it)."""
        ...

    def savepoint(self) -> None: ...
    def release(self) -> None: ...
    def rollback_to(self) -> None: ...
    def commit(self, chain: bool) -> None:
        """Commit; ``chain``: another batch is already queued, so a session may open
        the next transaction in the same round trip (PostgreSQL ``COMMIT; BEGIN``)."""
        ...

    def rollback(self) -> None: ...
    def ensure_open(self) -> None:
        """Reconnect if the connection was lost (no-op for SQLite)."""
        ...

    def map_error(self, exc: BaseException) -> BaseException: ...
    def close(self) -> None: ...


class ReaderSession(Protocol):
    def run(self, op: Callable[[Any], T]) -> T: ...
    def close(self) -> None: ...


def _refuse_coroutine(result: CoroutineType[Any, Any, Any]) -> None:
    result.close()  # its body never ran, so the transaction holds nothing of it
    raise TypeError(
        "a storage operation must be a plain function op(tx) -> T, not an async def: "
        "it runs on a database thread inside the transaction"
    )


def _resolve(outcomes: list[_Outcome]) -> None:
    for fut, ok, value in outcomes:
        if fut.done():  # the caller was cancelled while its op ran: it stopped waiting
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


class GroupCommitWriter:
    """Runs write operations, ``max_batch`` per transaction, one thread per session.

    With one session (SQLite always; PostgreSQL by default) writes commit in
    the order they were submitted. With several (PostgreSQL ``writers=N``),
    each thread takes the next batch from the one queue when it is free, so
    batches run and commit concurrently: writes awaited in sequence still
    commit in order, but writes submitted together without awaiting may
    commit in any order.
    """

    def __init__(
        self,
        sessions: Sequence[WriterSession],
        hub: NotificationHub | None,
        *,
        max_batch: int,
        group_commit: bool,
        name: str,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not sessions:
            raise ValueError("at least one writer session is needed")
        self._hub = hub
        self._max_batch = max_batch if group_commit else 1
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closing = False
        self._done = threading.Event()
        self._alive = len(sessions)
        self._alive_lock = threading.Lock()
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(session,),
                name=name if len(sessions) == 1 else f"{name}-{i}",
                daemon=True,
            )
            for i, session in enumerate(sessions)
        ]
        for thread in self._threads:
            thread.start()

    async def write(self, op: Callable[[Any], T]) -> T:
        if self._closing:
            raise BackendClosed("the backend is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((op, fut, loop))
        return await fut

    async def write_batched(self, fn: BatchFn[ItemT, T], item: ItemT) -> T:
        if self._closing:
            raise BackendClosed("the backend is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((_Batched(fn, item), fut, loop))
        return await fut

    async def close(self) -> None:
        """Stop accepting writes; wait until every queued write has committed."""
        if not self._closing:
            self._closing = True
            for _ in self._threads:  # one stop mark per thread
                self._queue.put(None)
        await asyncio.to_thread(self._done.wait)

    # -- writer thread -------------------------------------------------------

    def _run(self, session: WriterSession) -> None:
        get, get_nowait, max_batch = self._queue.get, self._queue.get_nowait, self._max_batch
        try:
            while True:
                first = get()
                if first is None:
                    break
                batch = [first]
                stop = False
                while len(batch) < max_batch:
                    try:
                        item = get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        stop = True
                        break
                    batch.append(item)
                try:
                    self._run_batch(session, batch)
                except BaseException as exc:  # noqa: BLE001 - a bug here must not hang callers
                    self._fail_all(batch, OperationalError(f"the writer failed: {exc!r}"))
                if stop:
                    break
        finally:
            self._closing = True
            with contextlib.suppress(Exception):
                session.close()
            self._finish()

    def _finish(self) -> None:
        with self._alive_lock:
            self._alive -= 1
            if self._alive:
                return  # draining now would steal the stop marks of the other threads
        # Anything still queued (only if a loop above died) is refused, not lost silently.
        leftovers: list[_Item] = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item is not None:
                    leftovers.append(item)
        if leftovers:
            self._fail_all(leftovers, BackendClosed("the backend is closed"))
        self._done.set()

    def _run_batch(self, session: WriterSession, batch: list[_Item]) -> None:
        # A caller cancelled before its batch started is skipped; from here on it runs.
        live = [item for item in batch if not item[1].cancelled()]
        if not live:
            return
        outcomes: list[_Outcome] = []
        first_op = live[0][0]
        solo = first_op if len(live) == 1 and not isinstance(first_op, _Batched) else None
        try:
            session.ensure_open()
            session.begin(solo is None)
        except BaseException as exc:  # noqa: BLE001 - it belongs to the caller
            self._fail_all(live, session.map_error(exc))
            return
        tx = session.tx
        hooks = tx.hooks
        # (first, end, callers): the hooks each op (or batch call) registered, by index.
        owners: list[tuple[int, int, list[asyncio.Future[Any]]]] = []
        if solo is not None:
            # Alone in its transaction: no savepoint needed, a failure rolls back everything.
            fut = live[0][1]
            try:
                result = solo(tx)
                if type(result) is CoroutineType:
                    _refuse_coroutine(result)
            except BaseException as exc:  # noqa: BLE001 - it belongs to the caller
                with contextlib.suppress(BaseException):
                    session.rollback()
                tx.take_notes()
                hooks.take()
                self._deliver([(fut, False, exc)], live)
                return
            outcomes.append((fut, True, result))
            owners.append((0, hooks.mark(), [fut]))
        else:
            try:
                for fn, group in _groups(live):
                    first = hooks.mark()
                    if fn is not None:
                        self._run_batched(session, fn, group, outcomes)
                    else:
                        op, fut, _loop = group[0]
                        assert not isinstance(op, _Batched)
                        ok, value = self._run_isolated(session, op)
                        outcomes.append((fut, ok, value))
                    owners.append((first, hooks.mark(), [item[1] for item in group]))
            except _ConnectionBroken as broken:
                self._abort(live, session, broken.error)
                return
        try:
            # Checked after the ops ran: under load the next batch is already waiting.
            session.commit(not self._queue.empty())
        except BaseException as exc:  # noqa: BLE001 - it belongs to the caller
            self._abort(live, session, exc)
            return
        notes = tx.take_notes()
        if notes and self._hub is not None:
            self._hub.publish(notes)
        ran = hooks.take()
        if ran:
            outcomes = _run_hooks(ran, owners, outcomes)
        self._deliver(outcomes, live)

    @staticmethod
    def _run_isolated(session: WriterSession, call: Callable[[Any], Any]) -> tuple[bool, Any]:
        """``call(tx)`` inside its own savepoint: (True, result) or (False, its exception),
        with exactly its changes and notifications rolled back on failure. Raises
        :class:`_ConnectionBroken` when the savepoint statements themselves fail."""
        tx = session.tx
        mark, hooks_mark = tx.notes_mark(), tx.hooks.mark()
        try:
            session.savepoint()
        except BaseException as exc:
            raise _ConnectionBroken(exc) from exc
        try:
            result = call(tx)
            if type(result) is CoroutineType:
                _refuse_coroutine(result)
        except BaseException as exc:  # noqa: BLE001 - it belongs to the caller
            try:
                session.rollback_to()
                session.release()
            except BaseException as broken:
                raise _ConnectionBroken(broken) from broken
            tx.notes_truncate(mark)
            tx.hooks.truncate(hooks_mark)
            return False, exc
        try:
            session.release()
        except BaseException as exc:
            raise _ConnectionBroken(exc) from exc
        return True, result

    def _run_batched(
        self,
        session: WriterSession,
        fn: BatchFn[Any, Any],
        group: list[_Item],
        outcomes: list[_Outcome],
    ) -> None:
        """One call of the batch function for the whole group; if it raises, each item
        alone (so an item's exception reaches only its own caller)."""
        items = [op.item for op, _fut, _loop in group if isinstance(op, _Batched)]
        ok, value = self._run_isolated(session, partial(_call_batch, fn, items))
        if ok:
            for (_op, fut, _loop), outcome in zip(group, value, strict=True):
                if isinstance(outcome, BaseException):
                    outcomes.append((fut, False, outcome))
                else:
                    outcomes.append((fut, True, outcome))
            return
        if len(group) == 1:
            outcomes.append((group[0][1], False, value))
            return
        for item, (_op, fut, _loop) in zip(items, group, strict=True):
            ok, value = self._run_isolated(session, partial(_call_batch, fn, [item]))
            if ok:
                (outcome,) = value
                ok = not isinstance(outcome, BaseException)
                value = outcome
            outcomes.append((fut, ok, value))

    def _abort(self, live: list[_Item], session: WriterSession, exc: BaseException) -> None:
        with contextlib.suppress(BaseException):
            session.rollback()
        session.tx.take_notes()
        session.tx.hooks.take()
        self._fail_all(live, session.map_error(exc))

    def _fail_all(self, live: list[_Item], exc: BaseException) -> None:
        self._deliver([(fut, False, _copy_error(exc)) for _op, fut, _loop in live], live)

    @staticmethod
    def _deliver(outcomes: list[_Outcome], live: list[_Item]) -> None:
        loop = live[0][2]
        if all(item[2] is loop for item in live):
            _call_soon(loop, outcomes)
            return
        per_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for outcome in outcomes:
            per_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
        for target, group in per_loop.items():
            _call_soon(target, group)


class _ConnectionBroken(Exception):
    """A savepoint statement failed: the connection, not an operation, is at fault."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _groups(live: list[_Item]) -> list[tuple[BatchFn[Any, Any] | None, list[_Item]]]:
    """Consecutive items of one batch function together (with that function); every
    plain op alone (with None).

    Only neighbours are merged, so the transaction applies writes in queue order."""
    groups: list[tuple[BatchFn[Any, Any] | None, list[_Item]]] = []
    for item in live:
        op = item[0]
        fn = op.fn if isinstance(op, _Batched) else None
        if fn is not None and groups and groups[-1][0] is fn:
            groups[-1][1].append(item)
        else:
            groups.append((fn, [item]))
    return groups


def _call_batch(fn: BatchFn[Any, Any], items: list[Any], tx: Any) -> Sequence[Any]:
    outcomes = fn(tx, items)
    if type(outcomes) is CoroutineType:
        _refuse_coroutine(outcomes)
    if len(outcomes) != len(items):
        raise TypeError(
            f"a batch function must return one outcome per item: got {len(outcomes)} "
            f"for {len(items)}"
        )
    return outcomes


def _run_hooks(
    hooks: list[Callable[[], None]],
    owners: list[tuple[int, int, list[asyncio.Future[Any]]]],
    outcomes: list[_Outcome],
) -> list[_Outcome]:
    """Run a committed transaction's hooks in order; an op whose hook raised gets that
    exception as its outcome (its write stays committed)."""
    failed: dict[asyncio.Future[Any], BaseException] = {}
    for first, end, callers in owners:
        for hook in hooks[first:end]:
            try:
                hook()
            except BaseException as exc:  # noqa: BLE001 - it belongs to the caller
                for fut in callers:
                    failed.setdefault(fut, exc)
    if not failed:
        return outcomes
    return [(fut, False, failed[fut]) if fut in failed else (fut, ok, v) for fut, ok, v in outcomes]


def _call_soon(loop: asyncio.AbstractEventLoop, outcomes: list[_Outcome]) -> None:
    with contextlib.suppress(RuntimeError):  # loop closed: its callers are gone
        loop.call_soon_threadsafe(_resolve, outcomes)


def _copy_error(exc: BaseException) -> BaseException:
    """One exception object per waiting caller, so tracebacks do not interleave."""
    if isinstance(exc, StorageError):
        clone = type(exc)(*exc.args)
        clone.__cause__ = exc.__cause__ or exc
        return clone
    return exc


class ReaderPool:
    """A few reader threads, each with its own connection (created on first use)."""

    def __init__(self, connect: Callable[[], ReaderSession], size: int, name: str) -> None:
        self._connect = connect
        self._executor = ThreadPoolExecutor(max_workers=max(1, size), thread_name_prefix=name)
        self._local = threading.local()
        self._sessions: list[ReaderSession] = []
        self._lock = threading.Lock()
        self._closing = False

    async def read(self, op: Callable[[Any], T]) -> T:
        if self._closing:
            raise BackendClosed("the backend is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, op)

    def _run(self, op: Callable[[Any], T]) -> T:
        session: ReaderSession | None = getattr(self._local, "session", None)
        if session is None:
            session = self._connect()
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        result = session.run(op)
        if type(result) is CoroutineType:
            _refuse_coroutine(result)
        return result

    async def close(self) -> None:
        """Stop accepting reads, wait for the running ones, close the connections."""
        self._closing = True
        await asyncio.to_thread(self._executor.shutdown, True)
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            with contextlib.suppress(Exception):
                session.close()
