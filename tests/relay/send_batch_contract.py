"""Sends accepted together: the SQLite store answers every send queued at once with one
batch of multi-row statements (``accept_batch``). Each send must get exactly the outcome
it would get alone, in queue order, on every backend.

``SendBatchContract`` is not collected itself (no ``Test`` prefix); ``test_sqlite.py`` and
``test_postgres.py`` subclass it with a ``relay_dsn`` fixture.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import pytest

from gapline.meshline.testing import make_account, make_send_params
from gapline.relay._errors import RelayFailure
from gapline.relay._store import (
    AcceptedSend,
    DeviceEntry,
    KeyBox,
    NewSend,
    NewState,
    Sends,
    TimelineStore,
    _sends,
)
from gapline.storage import Backend, Dialect, Tx, open_backend
from tests.relay.harness import start_relay
from tests.storage.contract import Gate

NOW = 1_800_000_000
RETENTION = 3600


def _send(
    sender: str,
    to: str,
    message_id: str,
    *,
    digest: str | None = None,
    sender_boxes: bool = True,
    refusal: Exception | None = None,
) -> NewSend:
    devices = {"alice": ["a0", "a1"], "bob": ["b0"], "carol": ["c0"], "dave": ["d0"]}
    return NewSend(
        from_account=sender,
        to_account=to,
        from_device_id=devices[sender][0],
        message_id=message_id,
        digest=digest or f"digest-{sender}-{message_id}",
        envelope=f'{{"id":"{message_id}"}}',
        recipient_boxes=tuple(KeyBox(d, f'{{"to":"{d}"}}') for d in devices[to]),
        sender_boxes=tuple(KeyBox(d, f'{{"from":"{d}"}}') for d in devices[sender])
        if sender_boxes
        else None,
        retention=RETENTION,
        now=NOW,
        refusal=refusal,
    )


class _Handed:
    """A view of a backend that sets ``all_handed`` when the ``expected``-th write reaches it.

    The backend puts a write in its queue before that write first waits, so once a test
    wakes on ``all_handed``, every write counted is in the queue.
    """

    def __init__(self, inner: Backend, expected: int) -> None:
        self.inner = inner
        self.expected = expected
        self.handed = 0
        self.all_handed = asyncio.Event()

    @property
    def dialect(self) -> Dialect:
        return self.inner.dialect

    def _count(self) -> None:
        self.handed += 1
        if self.handed == self.expected:
            self.all_handed.set()

    async def write(self, op: Callable[[Tx], Any]) -> Any:
        self._count()
        return await self.inner.write(op)

    async def write_batched(self, fn: Callable[[Tx, list[Any]], Any], item: Any) -> Any:
        self._count()
        return await self.inner.write_batched(fn, item)


async def _outcome(accepting: Awaitable[AcceptedSend]) -> AcceptedSend | RelayFailure:
    """What a send came to: its result, or the relay failure it raised."""
    try:
        return await accepting
    except RelayFailure as failure:
        return failure


async def _together(store: TimelineStore, sends: list[NewSend]) -> list[Any]:
    """Accept ``sends`` while the writer is held, so they reach it as one queue run."""
    backend = store.backend
    gate = Gate()
    handed = _Handed(backend, len(sends))
    accepting = Sends(cast(Backend, handed))  # the store's sends, seen through the counter
    async with asyncio.timeout(30), asyncio.TaskGroup() as group:
        group.create_task(backend.write(gate.op))
        await gate.wait_started()
        outcomes = [group.create_task(_outcome(accepting.accept(s))) for s in sends]
        await handed.all_handed.wait()  # every send has queued its write behind the gate
        gate.release.set()
    return [o.result() for o in outcomes]


def _timeline(tx: Tx, account: str) -> list[tuple[int, str]]:
    rows = tx.all(
        "SELECT sequence, envelope FROM timeline_records WHERE account = ?"
        " ORDER BY sequence LIMIT 1000",
        (account,),
    )
    return [(int(s), str(e)) for s, e in rows]


class SendBatchContract:
    """Batched acceptance; each backend module subclasses this with a ``relay_dsn`` fixture."""

    @pytest.fixture
    def batch_sizes(self, monkeypatch: pytest.MonkeyPatch) -> list[int]:
        """How many sends each call of the SQLite batch function answered."""
        sizes: list[int] = []
        real = _sends.accept_batch

        def counting(tx: Tx, sends: list[NewSend]) -> list[Any]:
            sizes.append(len(sends))
            return real(tx, sends)

        monkeypatch.setattr(_sends, "accept_batch", counting)
        return sizes

    @pytest.fixture
    async def store(self, relay_dsn: str) -> AsyncIterator[TimelineStore]:
        backend = await open_backend(relay_dsn)
        store = TimelineStore(backend, lambda: NOW)
        await store.migrate()
        for account, devices in {"alice": ["a0", "a1"], "bob": ["b0"], "carol": ["c0"]}.items():
            entries = tuple(DeviceEntry(d, 0, NOW + 10_000, f"cert-{d}") for d in devices)
            await store.accounts.publish_state(NewState(account, 1, f"state-{account}", entries))
        # dave's only device is not yet effective: every send to him is device_unknown.
        await store.accounts.publish_state(
            NewState("dave", 1, "state-dave", (DeviceEntry("d0", NOW + 500, NOW + 10_000, "c"),))
        )
        try:
            yield store
        finally:
            await backend.close()

    async def test_a_batch_assigns_consecutive_sequences_in_queue_order(
        self, store: TimelineStore, batch_sizes: list[int]
    ) -> None:
        backend = store.backend
        await store.sends.accept(_send("alice", "bob", "m-before"))  # bob's head exists: 0
        sends = [_send(s, "bob", f"m{i}") for i, s in enumerate(["alice", "carol"] * 4)]
        results = await _together(store, sends)
        assert all(isinstance(r, AcceptedSend) and not r.duplicate for r in results)
        # bob's timeline: one record per send, in queue order, after the earlier one.
        bob = [seq for r in results for a, seq in r.appended if a == "bob"]
        assert bob == list(range(1, 9))
        assert await backend.read(lambda tx: _timeline(tx, "bob")) == [
            (0, '{"id":"m-before"}'),
            *[(i + 1, f'{{"id":"m{i}"}}') for i in range(8)],
        ]
        # A sender's first sent record in the batch is sequence 0 of a brand-new timeline
        # (carol) or follows the existing head (alice).
        carol = [seq for r in results for a, seq in r.appended if a == "carol"]
        alice = [seq for r in results for a, seq in r.appended if a == "alice"]
        assert carol == [0, 1, 2, 3]
        assert alice == [1, 2, 3, 4]
        if backend.dialect is Dialect.SQLITE:
            assert batch_sizes[-1] == 8  # one call answered the whole queue run

    async def test_every_outcome_in_one_batch_is_the_one_it_gets_alone(
        self, store: TimelineStore, batch_sizes: list[int]
    ) -> None:
        backend = store.backend
        accepted = await store.sends.accept(_send("alice", "bob", "old"))
        sends = [
            _send("alice", "bob", "new1"),
            _send("alice", "bob", "old"),  # retry, same content: the first result, no record
            _send("alice", "bob", "old", digest="other"),  # retry, other content
            _send("alice", "dave", "to-dave"),  # no valid recipient device
            _send("carol", "bob", "late", refusal=RelayFailure("message_expired", "too old")),
            _send("alice", "bob", "old", refusal=RelayFailure("message_expired", "too old")),
            _send("carol", "bob", "twice"),  # new, and repeated below in the same batch
            _send("carol", "bob", "twice"),
            _send("carol", "bob", "twice", digest="changed"),
            _send("alice", "dave", "dave-then-bob"),  # fails ...
            _send("alice", "bob", "dave-then-bob"),  # ... so this one with its key is new
            _send("alice", "bob", "new2", sender_boxes=False),
        ]
        results = await _together(store, sends)

        def code(r: Any) -> str:
            if isinstance(r, RelayFailure):
                return r.code
            assert isinstance(r, AcceptedSend), r
            return "duplicate" if r.duplicate else "accepted"

        assert [code(r) for r in results] == [
            "accepted",
            "duplicate",
            "state_conflict",
            "device_unknown",
            "message_expired",
            "duplicate",  # a retry of an accepted message gets its result, refusal or not
            "accepted",
            "duplicate",
            "state_conflict",
            "device_unknown",
            "accepted",
            "accepted",
        ]
        assert results[1].result == accepted.result and results[1].appended == ()
        assert results[7].result == results[6].result and results[7].appended == ()
        bob = await backend.read(lambda tx: _timeline(tx, "bob"))
        assert [e for _s, e in bob] == [
            '{"id":"old"}',
            '{"id":"new1"}',
            '{"id":"twice"}',
            '{"id":"dave-then-bob"}',
            '{"id":"new2"}',
        ]
        assert [s for s, _e in bob] == [0, 1, 2, 3, 4]
        assert await backend.read(lambda tx: _timeline(tx, "dave")) == []
        # Nothing is kept for the sends that failed on a new key.
        for message_id, sender in (("to-dave", "alice"), ("late", "carol")):
            with pytest.raises(RelayFailure) as failure:
                await store.sends.delivery_status(sender, message_id, NOW)
            assert failure.value.code == "not_found", message_id
        # alice's sent records: old, new1, dave-then-bob (new2 had no sender boxes).
        alice = await backend.read(lambda tx: _timeline(tx, "alice"))
        assert [e for _s, e in alice] == ['{"id":"old"}', '{"id":"new1"}', '{"id":"dave-then-bob"}']
        if backend.dialect is Dialect.SQLITE:
            assert batch_sizes[-1] == len(sends)  # one call, repeats and all

    async def test_visibility_of_a_batched_send_is_each_boxed_valid_device(
        self,
        store: TimelineStore,
    ) -> None:
        backend = store.backend
        results = await _together(
            store, [_send("bob", "alice", "v1"), _send("carol", "alice", "v2")]
        )
        assert all(isinstance(r, AcceptedSend) for r in results)
        rows = await backend.read(
            lambda tx: tx.all(
                "SELECT account, device_id, sequence, key_box FROM timeline_visibility"
                " ORDER BY account, sequence, device_id LIMIT 100"
            )
        )
        assert [tuple(r) for r in rows] == [
            ("alice", "a0", 0, '{"to":"a0"}'),
            ("alice", "a1", 0, '{"to":"a1"}'),
            ("alice", "a0", 1, '{"to":"a0"}'),
            ("alice", "a1", 1, '{"to":"a1"}'),
            ("bob", "b0", 0, '{"from":"b0"}'),
            ("carol", "c0", 0, '{"from":"c0"}'),
        ]

    async def test_concurrent_http_sends_get_distinct_consecutive_sequences(
        self, relay_dsn: str, batch_sizes: list[int]
    ) -> None:
        async with start_relay(relay_dsn) as r:
            bob = make_account(1)
            senders = [make_account(1) for _ in range(8)]
            for account in (bob, *senders):
                await r.publish(account)
            tokens = [await r.login(s) for s in senders]
            params = [
                make_send_params(s, bob, created_at=r.clock()).to_wire()
                for s in senders
                for _ in range(25)
            ]
            results = await asyncio.gather(
                *(r.ok("message.send", p, token=tokens[i // 25]) for i, p in enumerate(params))
            )
            assert all(res["status"] == "target_accepted" for res in results)
            tb = await r.login(bob)
            seqs: list[int] = []
            after = -1
            while True:
                page = await r.ok("message.timeline.sync", {"after": after}, token=tb)
                seqs += [item["sequence"] for item in page["items"]]
                if not page["has_more"]:
                    break
                after = seqs[-1]
            assert seqs == list(range(200))
            assert all(a < b for a, b in itertools.pairwise(seqs))
            if r.server.backend.dialect is Dialect.SQLITE:
                assert sum(batch_sizes) == 200 and max(batch_sizes) > 1
