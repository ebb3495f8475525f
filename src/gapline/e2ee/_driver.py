"""`CryptoDriver`: a thin async shell that runs a `CryptoMachine` over a client and a store.

It owns no rule. It sends the machine's outgoing requests with a
`MatrixClient` (whose one send path owns retries and rate limits), reports
each answer back, and commits the machine's `Changes` with `Backend.write`,
optionally together with the caller's own operation (``also``), so what caused
a step and the state it produced land in one transaction.

If a commit fails, the in-memory machine is ahead of the store; the driver
reopens it from the store before re-raising, so the next step starts from
what is durable. Use ``driver.machine`` (not a reference kept from before).

Decryption of many events (`decrypt_room_events`) runs in batches on the
event loop and yields between batches: vodozemac holds the GIL while it
decrypts, so a worker thread would not let the loop run any sooner, and each
batch is kept short enough (``batch`` events, ~40-70 µs each) not to stall it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gapline.matrix import ClientEvent, MatrixClient, MatrixError
from gapline.storage import Backend, Tx

from ._machine import CryptoMachine, _wall_ms
from ._megolm_worker import RawDecryption
from ._open import open_machine
from ._store import save_changes
from ._types import (
    DecryptedEvent,
    KeyUpdates,
    OutgoingRequest,
    RequestKind,
    ShareReport,
    ShareState,
    UnableToDecrypt,
)

__all__ = ["CryptoDriver", "SendResult", "merge_updates"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SendResult:
    """What sending the outgoing requests delivered, and which requests failed (kept for later)."""

    updates: KeyUpdates
    failed: tuple[tuple[RequestKind, MatrixError], ...] = ()


def merge_updates(*parts: KeyUpdates) -> KeyUpdates:
    def cat(name: str) -> tuple[Any, ...]:
        return tuple(x for p in parts for x in getattr(p, name))

    return KeyUpdates(
        room_keys=tuple(dict.fromkeys(cat("room_keys"))),
        withheld=tuple(dict.fromkeys(cat("withheld"))),
        to_device=cat("to_device"),
        devices_changed=tuple(dict.fromkeys(cat("devices_changed"))),
        refusals=cat("refusals"),
    )


class CryptoDriver:
    def __init__(
        self,
        backend: Backend,
        client: MatrixClient,
        store_key: bytes,
        machine: CryptoMachine,
        *,
        clock: Callable[[], int] = _wall_ms,
    ) -> None:
        self._backend = backend
        self._client = client
        self._store_key = store_key
        self._machine = machine
        self._clock = clock

    @classmethod
    async def open(
        cls,
        backend: Backend,
        client: MatrixClient,
        store_key: bytes,
        *,
        clock: Callable[[], int] = _wall_ms,
    ) -> CryptoDriver:
        """Open (or create) the machine of the client's logged-in device."""
        if client.user_id is None or client.device_id is None:
            raise ValueError("the client must be logged in (user and device known)")
        machine = await open_machine(backend, store_key, user_id=client.user_id,
                                     device_id=client.device_id, clock=clock)  # fmt: skip
        return cls(backend, client, store_key, machine, clock=clock)

    @property
    def machine(self) -> CryptoMachine:
        return self._machine

    @property
    def client(self) -> MatrixClient:
        return self._client

    async def commit(self, also: Callable[[Tx], T] | None = None) -> T | None:
        """Save the machine's pending changes (and ``also``) in one write transaction."""
        changes = self._machine.take_changes()

        def write(tx: Tx) -> T | None:
            save_changes(tx, changes)
            return None if also is None else also(tx)

        try:
            return await self._backend.write(write)
        except BaseException:
            await self._reopen()
            raise

    async def _reopen(self) -> None:
        m = self._machine
        self._machine = await open_machine(self._backend, self._store_key, user_id=m.user_id,
                                           device_id=m.device_id, clock=self._clock)  # fmt: skip

    async def _saved_requests(self) -> list[OutgoingRequest]:
        """The outgoing requests, once every pending change is saved.

        Other steps change the machine while a commit is under way (a fill or a heal
        decrypting marks indexes as seen), so one commit may leave new changes behind;
        commit until none are left, then build the requests with no await between."""
        while self._machine.has_unsaved_changes:
            await self.commit()
        return self._machine.outgoing_requests()

    async def send_outgoing(self, *, max_rounds: int = 8) -> SendResult:
        """Send every outgoing request, report the answers, commit after each answer.

        New requests an answer makes necessary (a top-up after an upload, a query for a
        waiting to-device sender) are sent in further rounds, up to ``max_rounds``. A
        request that fails is dropped for now (the machine builds it again later).
        """
        updates: list[KeyUpdates] = []
        failed: list[tuple[RequestKind, MatrixError]] = []
        tried: set[str] = set()
        for _ in range(max_rounds):
            batch = [r for r in await self._saved_requests() if r.request_id not in tried]
            if not batch:
                break
            for req in batch:
                tried.add(req.request_id)
                try:
                    answer = await self._client.request(req.request, req.response_type)
                except MatrixError as exc:
                    self._machine.mark_request_as_failed(req.request_id)
                    failed.append((req.kind, exc))
                    continue
                updates.append(self._machine.mark_request_as_sent(req.request_id, answer))
                await self.commit()
        return SendResult(merge_updates(*updates), tuple(failed))

    async def share_room_key(
        self,
        room_id: str,
        joined: Iterable[str],
        *,
        invited: Iterable[str] = (),
        history_visibility: str = "shared",
        max_rounds: int = 6,
    ) -> ShareReport:
        """Drive `CryptoMachine.share_room_key` to READY and send the key's to-device messages."""
        joined, invited = list(joined), list(invited)
        for _ in range(max_rounds):
            report = self._machine.share_room_key(room_id, joined, invited=invited,
                                                  history_visibility=history_visibility)  # fmt: skip
            result = await self.send_outgoing()
            if report.state is ShareState.READY:
                if result.failed:
                    raise result.failed[0][1]
                return report
        raise MatrixError(
            f"sharing the room key of {room_id} did not settle in {max_rounds} rounds"
        )

    async def encrypt(
        self,
        room_id: str,
        event_type: str,
        content: dict[str, Any],
        *,
        also: Callable[[dict[str, Any], Tx], T] | None = None,
    ) -> dict[str, Any]:
        """Encrypt for a room whose key was shared, and commit the advanced session (with
        ``also(encrypted, tx)``, e.g. the outbox row) before the caller sends it."""
        encrypted = self._machine.encrypt_room_event(room_id, event_type, content)
        await self.commit(None if also is None else (lambda tx: also(encrypted, tx)))
        return encrypted

    async def decrypt_room_events(
        self,
        room_id: str,
        events: Sequence[ClientEvent],
        *,
        batch: int = 64,
        raw: Sequence[RawDecryption | None] | None = None,
    ) -> list[DecryptedEvent | UnableToDecrypt]:
        """Decrypt in batches, yielding to the event loop between them. The seen-index
        rows this adds are committed by the caller's next `commit` (with its events).
        ``raw``: a decrypt worker's vodozemac results for these events (`DecryptWorker`),
        checked here as the machine checks its own."""
        out: list[DecryptedEvent | UnableToDecrypt] = []
        for start in range(0, len(events), batch):
            end = start + batch
            part = None if raw is None else raw[start:end]
            out.extend(self._machine.decrypt_room_events(room_id, events[start:end], raw=part))
            if start + batch < len(events):
                await asyncio.sleep(0)
        return out
