"""The durable send queue: a message is committed before it is sent, shown at once, sent
once.

:meth:`SendQueue.enqueue` writes the message to the store (``history_send``,
see ``_send_store``) with its transaction id and publishes its local echo row
(``send_state: Pending``) before it returns; it never waits on the homeserver.
:meth:`SendQueue.run` (a task of the engine's ``TaskGroup``) sends the queue in
order, one request at a time, so each room receives its messages in the order
they were queued:

- a network failure, a 5xx, a rate limit or an unreadable answer leaves the
  message pending and the worker backs off (0.5 s doubling to 10 s), waking
  early when a sync succeeds or a message is queued; the retry is the same
  request (same transaction id), which the homeserver deduplicates;
- any other refusal is permanent: the row turns ``Failed`` with a readable
  reason, its text kept; ``RetrySend`` queues it again, ``CancelSend`` drops it;
- an answer commits the event id on the row (the echo stays ``Pending`` until
  the sync brings the event, which then takes the row's place).

What is sent is decided in one call, :meth:`SendQueue.outgoing` (queued
message in, ``(event_type, content)`` out): an encrypting layer wraps that one
call. Crash safety needs nothing more than the order of these steps: the row
is durable before the request, and the row is deleted only in the transaction
that retains the event, so a restart either resends (and the homeserver
answers the first event id) or finds the event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gapline.history._cache_store import CacheStore, thread_key
from gapline.history._commits import Commits
from gapline.history._crypto import EngineCrypto
from gapline.history._echoes import ECHO_PREFIX, echo_update
from gapline.history._encrypted_send import CannotEncrypt, seal
from gapline.history._failures import describe
from gapline.history._send_store import QueuedSend
from gapline.history._types import (
    Answer,
    EventNotFound,
    Failed,
    Invalid,
    Ok,
    SendQueueChanged,
)
from gapline.history._updates import EchoRemoved, EchoSettled, Update
from gapline.matrix import (
    MatrixClient,
    MatrixError,
    MatrixHTTPError,
    MatrixProtocolError,
    MatrixUnavailable,
    RateLimited,
    UnknownToken,
)
from gapline.storage import StorageError, Tx

__all__ = ["Outgoing", "SendQueue", "permanent_reason"]

log = logging.getLogger("gapline.history")

BATCH = 32  # pending rows the worker reads ahead in one read

Outgoing = Callable[[QueuedSend], Awaitable[tuple[str, dict[str, Any]]]]
"""Turns a queued message into what is sent: ``(event_type, content)``."""


def permanent_reason(exc: MatrixHTTPError) -> str:
    """Why the homeserver refused a message for good, in words a user can act on."""
    if exc.errcode == "M_TOO_LARGE" or exc.status == 413:
        return (
            "the message is too large for the homeserver (M_TOO_LARGE); "
            "shorten it and send it again"
        )
    if exc.status == 403 or exc.errcode == "M_FORBIDDEN":
        detail = f": {exc.error}" if exc.error else ""
        return f"the homeserver does not let you send in this room{detail}"
    return describe(exc)


def _transient(exc: Exception) -> bool:
    """Failures after which the same request may succeed later (the queue waits)."""
    if isinstance(exc, MatrixUnavailable | RateLimited | MatrixProtocolError | UnknownToken):
        return True
    return isinstance(exc, MatrixHTTPError) and exc.status >= 500


class SendQueue:
    """One store's send queue and its worker (see the module docstring)."""

    def __init__(
        self,
        store: CacheStore,
        client: MatrixClient | None,
        commits: Commits,
        flush: Callable[[str], Awaitable[None]],
        publish: Callable[[SendQueueChanged], Awaitable[None]],
        *,
        backoff: tuple[float, float] = (0.5, 10.0),
        crypto: EngineCrypto | None = None,
    ) -> None:
        self._crypto = crypto
        self._store = store
        self._client = client
        self._commits = commits
        self._flush = flush
        self._publish = publish
        self._first_delay, self._last_delay = backoff
        self._wake = asyncio.Event()
        self._cursor = 0  # queue position the worker has looked at
        self._batch: deque[QueuedSend] = deque()  # pending rows read ahead, in order
        self._in_flight: str | None = None
        self._cancelled: set[str] = set()
        self._acked: set[str] = set()  # answered, the answer not committed yet
        self._settled_seen = 0
        self._counts: tuple[int, int] | None = None
        self.error: str | None = None
        """Why the last attempt did not reach the homeserver (``None`` once one did)."""
        self.sent = 0
        """Messages the homeserver acknowledged since the engine opened (tests, benches)."""
        self.failed = 0
        """Messages the homeserver refused for good since the engine opened."""
        self._progress = asyncio.Condition()

    # -- what is sent ----------------------------------------------------------------------

    async def outgoing(self, queued: QueuedSend) -> tuple[str, dict[str, Any]]:
        """What the homeserver receives for a queued message (the one call an encrypting
        layer wraps): sealed for an encrypted room, never in the clear there.

        Each attempt seals anew (a new Megolm index); the fixed transaction id makes
        the homeserver keep the first attempt that reached it and drop the others."""
        if self._crypto is None or self._client is None:
            return queued.event_type, queued.content
        sealed = await seal(
            self._crypto,
            self._store,
            self._client,
            queued.room_id,
            queued.event_type,
            queued.content,
        )
        return sealed.event_type, sealed.content

    # -- commands --------------------------------------------------------------------------

    async def enqueue(
        self,
        room_id: str,
        event_type: str,
        content: dict[str, Any],
        *,
        thread_root: str | None = None,
        redacts: str | None = None,
    ) -> Answer:
        """Commit the message to the queue and publish its ``Pending`` row (a reaction,
        an edit or a redaction, ``redacts`` naming the event it deletes, is queued the
        same way but shows no row while it waits)."""
        txn_id = "gl" + uuid.uuid4().hex
        now = int(time.time() * 1000)

        def op(tx: Tx) -> tuple[QueuedSend, dict[str, list[Update]]]:
            queued = self._store.sends.enqueue(
                tx,
                txn_id=txn_id,
                room_id=room_id,
                event_type=event_type,
                content=content,
                created_ts=now,
                thread_root=thread_root,
                redacts=redacts,
            )
            return queued, {_key(queued): [echo_update(queued, self._store.me)]}

        await self._commits.run(op)
        await self._flush(room_id)
        self._wake.set()
        await self._recount()
        return Ok()

    async def retry(self, room_id: str, row_id: str) -> Answer:
        """``RetrySend``: a failed message goes back to ``Pending`` (same transaction id)."""
        txn_id = _txn_of(row_id)
        if txn_id is None:
            return Invalid(f"not a queued message's row id: {row_id!r}")

        def op(tx: Tx) -> tuple[Answer | QueuedSend, dict[str, list[Update]]]:
            queued = self._store.sends.get(tx, txn_id)
            if queued is None or queued.room_id != room_id:
                return EventNotFound(), {}
            again = self._store.sends.retry(tx, txn_id)
            if again is None:
                return Invalid("only a failed message can be retried"), {}
            return again, {_key(again): [echo_update(again, self._store.me)]}

        outcome = await self._commits.run(op)
        if not isinstance(outcome, QueuedSend):
            return outcome
        self._rewind(outcome.seq)
        await self._flush(room_id)
        self._wake.set()
        await self._recount()
        return Ok()

    async def cancel(self, room_id: str, row_id: str) -> Answer:
        """``CancelSend``: drop a pending or failed message (its row goes)."""
        txn_id = _txn_of(row_id)
        if txn_id is None:
            return Invalid(f"not a queued message's row id: {row_id!r}")
        if self._in_flight == txn_id:
            return Failed("the message is being sent and can no longer be cancelled")
        self._cancelled.add(txn_id)  # the worker skips it even if it read it already

        def op(tx: Tx) -> tuple[Answer, dict[str, list[Update]]]:
            queued = self._store.sends.get(tx, txn_id)
            if queued is None or queued.room_id != room_id:
                return EventNotFound(), {}
            dropped = self._store.sends.cancel(tx, txn_id)
            if dropped is None:
                return Failed("the homeserver already has the message"), {}
            return Ok(), {_key(dropped): [EchoRemoved(txn_id)]}

        answer = await self._commits.run(op)
        await self._flush(room_id)
        await self._recount()
        return answer

    # -- the worker ------------------------------------------------------------------------

    async def run(self) -> None:
        """Send the queue until cancelled (a task of the engine's ``TaskGroup``)."""
        delay = self._first_delay
        async with asyncio.TaskGroup() as tg:
            last_commit: asyncio.Task[None] | None = None
            while True:
                if not self._batch:
                    try:
                        rows, self._cursor = await self._store.backend.read(
                            lambda tx: self._store.sends.pending_batch(tx, self._cursor, BATCH)
                        )
                    except StorageError as exc:
                        log.error("send queue: the store failed: %s", exc)
                        await self._pause(delay)
                        delay = min(delay * 2, self._last_delay)
                        continue
                    if not rows:
                        self._cursor = 0  # nothing left after it: the next look starts over
                        await self._wake.wait()
                        self._wake.clear()
                        continue
                    self._batch.extend(rows)
                queued = self._batch.popleft()
                if queued.txn_id in self._cancelled or queued.txn_id in self._acked:
                    continue  # dropped, or answered and its answer still being committed
                self._in_flight = queued.txn_id
                try:
                    event_id = await self._send(queued)
                except MatrixError as exc:
                    self._in_flight = None
                    if _transient(exc):
                        self.error = describe(exc)
                        log.warning("send queue: %s; retrying in %.1fs", self.error, delay)
                        self._rewind(queued.seq)  # the same message, next time
                        await self._pause(delay)
                        delay = min(delay * 2, self._last_delay)
                        continue
                    reason = (
                        permanent_reason(exc) if isinstance(exc, MatrixHTTPError) else describe(exc)
                    )
                    await self._fail(queued, reason)
                    continue
                except CannotEncrypt as exc:
                    self._in_flight = None
                    log.warning("send queue: message %s not sent: %s", queued.txn_id, exc)
                    await self._fail(queued, str(exc))
                    continue
                except Exception as exc:
                    # Preparing the content failed (an encrypting layer refusing, say):
                    # the message cannot go as it is, and the row says why.
                    self._in_flight = None
                    log.exception("send queue: message %s cannot be sent", queued.txn_id)
                    await self._fail(queued, describe(exc))
                    continue
                self._in_flight = None
                self.error = None
                delay = self._first_delay
                # The next request goes out while this answer commits; commits stay in
                # order (each waits for the one before), and a crash before this one
                # lands only means the same request is made again after restart.
                previous = last_commit
                self._acked.add(queued.txn_id)
                last_commit = tg.create_task(self._commit_sent(queued, event_id, previous))

    def _rewind(self, seq: int) -> None:
        """Look again from queue position ``seq`` (rows read ahead are read again)."""
        self._cursor = min(self._cursor, seq - 1)
        self._batch.clear()

    async def _send(self, queued: QueuedSend) -> str:
        if self._client is None:
            raise MatrixUnavailable("no homeserver client")
        if queued.redacts is not None:
            reason = queued.content.get("reason")
            return await self._client.redact(
                queued.room_id,
                queued.redacts,
                reason=reason if isinstance(reason, str) else None,
                txn_id=queued.txn_id,
            )
        event_type, content = await self.outgoing(queued)
        return await self._client.send_event(
            queued.room_id, event_type, content, txn_id=queued.txn_id
        )

    async def _commit_sent(
        self, queued: QueuedSend, event_id: str, previous: asyncio.Task[None] | None
    ) -> None:
        try:
            await self._record_sent(queued, event_id, previous)
        finally:
            self._acked.discard(queued.txn_id)

    async def _record_sent(
        self, queued: QueuedSend, event_id: str, previous: asyncio.Task[None] | None
    ) -> None:
        if previous is not None:
            await previous

        def op(tx: Tx) -> tuple[None, dict[str, list[Update]]]:
            sent = self._store.sends.mark_sent(tx, queued.txn_id, event_id)
            if sent is None:  # the room has the event already
                return None, {_key(queued): [EchoSettled(queued.txn_id, event_id)]}
            return None, {_key(sent): [echo_update(sent, self._store.me)]}

        try:
            await self._commits.run(op)
        except StorageError as exc:
            # Not recorded: the same request goes out again (the homeserver answers the
            # same event id), and its answer is committed then.
            log.error("send queue: recording the answer for %s failed: %s", queued.txn_id, exc)
            self._rewind(queued.seq)
            self._wake.set()
            return
        await self._flush(queued.room_id)
        async with self._progress:
            self.sent += 1
            self._progress.notify_all()

    async def _fail(self, queued: QueuedSend, why: str) -> None:
        log.warning("send queue: message %s failed: %s", queued.txn_id, why)

        def op(tx: Tx) -> tuple[None, dict[str, list[Update]]]:
            failed = self._store.sends.mark_failed(tx, queued.txn_id, why)
            if failed is None:
                return None, {}
            return None, {_key(failed): [echo_update(failed, self._store.me)]}

        await self._commits.run(op)
        await self._flush(queued.room_id)
        await self._recount()
        async with self._progress:
            self.failed += 1
            self._progress.notify_all()

    async def _pause(self, delay: float) -> None:
        """Back off for ``delay``, or less if a sync succeeds or a message is queued."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._wake.wait()

    # -- counts ----------------------------------------------------------------------------

    async def synced(self) -> None:
        """After a sync committed: the homeserver is reachable (retry now), and rows it
        settled change the counts."""
        self._wake.set()
        if self._store.sends.settled != self._settled_seen:
            self._settled_seen = self._store.sends.settled
            await self._recount()

    async def announce(self) -> None:
        """At open: what the queue holds from earlier runs (nothing is published for an
        empty queue, which is what a reader assumes before any count)."""
        counts = await self._store.backend.read(self._store.sends.counts)
        self._counts = counts
        if counts != (0, 0):
            await self._publish(SendQueueChanged(pending=counts[0], failed=counts[1]))

    async def _recount(self) -> None:
        counts = await self._store.backend.read(self._store.sends.counts)
        if counts != self._counts:
            self._counts = counts
            await self._publish(SendQueueChanged(pending=counts[0], failed=counts[1]))

    async def wait_sent(self, count: int) -> None:
        """Wait until ``count`` messages were acknowledged and committed (tests, benches)."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.sent >= count)

    async def wait_failed(self, count: int) -> None:
        """Wait until ``count`` messages were refused for good (tests)."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.failed >= count)


def _key(queued: QueuedSend) -> str:
    root = queued.thread_root
    return queued.room_id if root is None else thread_key(queued.room_id, root)


def _txn_of(row_id: str) -> str | None:
    if not isinstance(row_id, str) or not row_id.startswith(ECHO_PREFIX):
        return None
    txn = row_id[len(ECHO_PREFIX) :]
    return txn or None
