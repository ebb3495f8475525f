"""The sync loop and ingestion: each ``/sync`` answer committed with its token, then shown.

:func:`commit_sync` places every joined room's member state, events, gaps and
receipts (through :class:`~gapline.history._sections.Sections`), carries its
thread replies into the thread timelines already kept, and writes
``next_batch`` in the same transaction, so a crash can never persist a token
whose events were lost. :class:`Sync` runs one ``/sync`` at a time from the
stored token, commits it, flushes the open rooms it touched, hands on who is
typing (``m.typing``, never stored), and keeps which rooms the account has
joined (an ``OpenRoom`` of a room never joined fails).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gapline.e2ee import Changes, E2eeError, KeyUpdates, RoomKeyId, save_changes
from gapline.history._cache_store import CacheStore
from gapline.history._commits import Commits
from gapline.history._crypto import EngineCrypto
from gapline.history._failures import describe
from gapline.history._heal_pass import heal_sessions
from gapline.history._healing import index_undecrypted, undecrypted_sessions
from gapline.history._sections import Sections
from gapline.history._updates import Update
from gapline.history._verifying import Verifying
from gapline.matrix import MatrixClient, MatrixError, SyncResponse, UnknownToken
from gapline.storage import StorageError, Tx

__all__ = ["Sync", "commit_sync", "typing_of"]

log = logging.getLogger("gapline.history")

FIRST_RETRY_S = 0.5
LAST_RETRY_S = 30.0


def commit_sync(
    store: CacheStore, tx: Tx, response: SyncResponse
) -> tuple[None, dict[str, list[Update]]]:
    """Commit one sync answer: every joined room's events, gaps and receipts, then its token."""
    out: dict[str, list[Update]] = {}
    for room_id, joined in response.rooms.join.items():
        sections = Sections(store, tx, room_id)
        timeline = joined.timeline
        sections.ingest_state(joined.state.events)
        sections.ingest_sync(
            timeline.events, limited=timeline.limited, prev_batch=timeline.prev_batch
        )
        sections.flush_members()
        sections.ingest_receipts(joined.receipts, joined.fully_read)
        # Queued messages whose events this sync retains leave the send queue with it.
        settled = store.sends.settle(tx, room_id, timeline.events, limited=timeline.limited)
        out[room_id] = [*sections.updates, *settled]
        out.update(sections.extend_threads(timeline.prev_batch))
    store.put_sync_token(tx, response.next_batch)
    return None, out


def commit_encrypted_sync(
    store: CacheStore, tx: Tx, response: SyncResponse, changes: Changes | None
) -> tuple[None, dict[str, list[Update]]]:
    """:func:`commit_sync` of a sync whose encrypted events were decrypted, with the
    crypto machine's changes (Olm state, room keys, to-device delivered: one token, one
    transaction) and its undecryptable events indexed. The retained events its keys
    decrypt heal after it, in chunks (``_heal_pass``)."""
    if changes is not None:
        save_changes(tx, changes)
    _, out = commit_sync(store, tx, response)
    for room_id, joined in response.rooms.join.items():
        index_undecrypted(store, tx, room_id, joined.timeline.events)
    return None, out


def typing_of(response: SyncResponse) -> dict[str, tuple[str, ...]]:
    """Who types in each room whose typing changed in this sync (``m.typing``)."""
    out: dict[str, tuple[str, ...]] = {}
    for room_id, joined in response.rooms.join.items():
        for event in joined.ephemeral.of_type("m.typing"):
            users = event.content.get("user_ids")
            if isinstance(users, list):
                out[room_id] = tuple(u for u in users if isinstance(u, str))
    return out


class Sync:
    """One account's ``/sync``: single calls, ingestion of any answer, and the loop."""

    def __init__(
        self,
        store: CacheStore,
        client: MatrixClient | None,
        commits: Commits,
        flush_room: Callable[[str], Awaitable[None]],
        *,
        timeline_limit: int | None,
        timeout_ms: int,
        typing: Callable[[str, tuple[str, ...]], Awaitable[None]] | None = None,
        crypto: EngineCrypto | None = None,
        after_ingest: Callable[[], Awaitable[None]] | None = None,
        verifying: Verifying | None = None,
    ) -> None:
        self._crypto = crypto
        self._verifying = verifying
        self._store = store
        self._client = client
        self._commits = commits
        self._flush_room = flush_room
        self._typing = typing
        self._after_ingest = after_ingest
        self._swept = False
        self._filter: dict[str, Any] | None = (
            None if timeline_limit is None else {"room": {"timeline": {"limit": timeline_limit}}}
        )
        self._timeout_ms = timeout_ms
        self.joined: set[str] | None = None  # None until a sync told us
        self._synced = asyncio.Condition()
        self.count = 0
        self.error: str | None = None

    async def once(
        self, *, timeout_ms: int = 0, since: str | None = None, initial: bool = False
    ) -> SyncResponse:
        """One ``/sync`` from the stored token (or ``since``; ``initial``: from nothing),
        committed and flushed to the open timelines."""
        assert self._client is not None
        token = since if since is not None else await self._store.sync_token()
        if initial:
            token = None
        response = await self._client.sync(since=token, timeout_ms=timeout_ms, filter=self._filter)
        await self.ingest(response, initial=token is None)
        return response

    async def ingest(self, response: SyncResponse, *, initial: bool = False) -> None:
        """Commit one sync answer (see :func:`commit_sync`) and show it in the open rooms;
        with encryption, decrypted first and committed with the machine's changes."""
        crypto = self._crypto
        healed: list[str] = []
        # The start-up sweep runs once, at the first sync after the machine is open,
        # whoever opened it (a page load may have done so before any sync).
        if crypto is not None and not self._swept and await crypto.ensure() is not None:
            self._swept = True
            await self._sweep(crypto)
        if crypto is not None and crypto.ready:
            healed = await self._ingest_encrypted(crypto, response, initial=initial)
        else:
            await self._commits.run(lambda tx: commit_sync(self._store, tx, response))
        self._after(response)
        for room_id in dict.fromkeys([*response.rooms.join, *healed]):
            await self._flush_room(room_id)
        if crypto is not None and crypto.ready:
            sent = await crypto.send_outgoing()
            if self._verifying is not None:
                self._verifying.receive_to_device(sent.to_device)
            await self.after_keys(crypto, sent)
            await crypto.back_up()
            if self._verifying is not None:
                await self._verifying.settle()
        await self._announce(response)

    async def _ingest_encrypted(
        self, crypto: EngineCrypto, response: SyncResponse, *, initial: bool
    ) -> list[str]:
        """The encrypted path of :meth:`ingest`; returns the rooms whose rows healed."""
        store = self._store
        async with crypto.lock:
            response, updates = await crypto.prepare_sync(response, initial=initial)
            if self._verifying is not None:  # a finished flow's marks commit with the sync
                self._verifying.receive_sync(response, updates)
            changes = crypto.take_changes()
            try:
                await self._commits.run(
                    lambda tx: commit_encrypted_sync(store, tx, response, changes)
                )
            except Exception:
                await crypto.reopen()  # the machine is ahead of what is durable
                raise
            return await self._heal(crypto, updates.room_keys)

    async def after_keys(self, crypto: EngineCrypto, updates: KeyUpdates) -> None:
        """Heal the retained events of the keys a request's answer delivered (a waiting
        to-device payload handled once its sender's keys were known)."""
        if not updates.room_keys:
            return
        async with crypto.lock:
            changes = crypto.take_changes()
            if changes is not None:
                try:
                    await self._commits.run(lambda tx: (save_changes(tx, changes), {}))
                except Exception:
                    await crypto.reopen()
                    raise
            await self._heal(crypto, updates.room_keys)

    async def _heal(self, crypto: EngineCrypto, keys: Sequence[RoomKeyId]) -> list[str]:
        """Heal what these (committed) keys decrypt, chunk by chunk; a failed write
        reloads the machine and leaves the rest to the next sweep."""
        if not keys:
            return []
        try:
            return await heal_sessions(self._store, crypto, self._commits, keys, self._flush_room)
        except Exception:
            await crypto.reopen()
            self._swept = False  # the next sync sweeps again
            raise

    async def _sweep(self, crypto: EngineCrypto) -> None:
        """At start: heal what a key saved before a crash (or in another process) can
        decrypt, since the step that would have healed it may not have committed."""
        store = self._store
        sessions = await store.backend.read(lambda tx: undecrypted_sessions(store, tx))
        assert crypto.driver is not None
        inbound = crypto.driver.machine.inbound
        keys = tuple(RoomKeyId(r, s) for r, s in sessions if inbound.has_session(r, s))
        await self.after_keys(crypto, KeyUpdates(room_keys=keys))

    def _after(self, response: SyncResponse) -> None:
        joined = set(response.rooms.join)
        self.joined = (
            joined if self.joined is None else (self.joined | joined) - set(response.rooms.leave)
        )

    async def _announce(self, response: SyncResponse) -> None:
        if self._typing is not None:
            for room_id, users in typing_of(response).items():
                await self._typing(room_id, users)
        if self._after_ingest is not None:
            await self._after_ingest()
        async with self._synced:
            self.count += 1
            self._synced.notify_all()

    async def wait(self, count: int) -> None:
        """Wait until ``count`` syncs were committed in total."""
        async with self._synced:
            await self._synced.wait_for(lambda: self.count >= count)

    async def run(self) -> None:
        """Sync until cancelled; back off on failures, stop for good on a revoked session."""
        delay = FIRST_RETRY_S
        while True:
            try:
                await self.once(timeout_ms=self._timeout_ms)
                delay = FIRST_RETRY_S
                self.error = None
            except UnknownToken as exc:
                self.error = describe(exc)
                log.error("sync stopped: %s", self.error)
                return
            except E2eeError as exc:
                # The crypto store belongs to another device, or will not open: syncing on
                # would show encrypted rooms without their keys. The cache stays readable.
                self.error = f"end-to-end encryption cannot start: {exc}"
                log.error("sync stopped: %s", self.error)
                return
            except (MatrixError, StorageError) as exc:
                self.error = describe(exc)
                log.warning("sync failed, retrying in %.1fs: %s", delay, self.error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, LAST_RETRY_S)
