"""MeshlineStore's contract on every backend: dedup across relays, positions, gaps.

``MeshlineStoreContract`` is not collected itself (no ``Test`` prefix); ``test_sqlite.py``
and ``test_postgres.py`` subclass it with a ``store_dsn`` fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gapline.meshline._store import MeshlineStore
from gapline.meshline._timeline import Direction, process_page
from gapline.meshline.testing import (
    local_device,
    make_account,
    make_send_params,
    sync_page,
    timeline_entry,
)
from gapline.storage import Backend, open_backend

RELAY_A = "0x" + "aa" * 20
RELAY_B = "0x" + "bb" * 20


async def sync(store: MeshlineStore, relay: str, page, me, after: int | None = None):
    after = await store.position(relay) if after is None else after
    keys = [item.envelope.key for item in page.items]
    known = await store.known_digests(keys)
    outcome = process_page(
        page, local=local_device(me), relay_id=relay, after=after, known=known.get
    )
    return outcome, await store.commit_page(relay, outcome)


class MeshlineStoreContract:
    """Each backend module subclasses this with a ``store_dsn`` fixture."""

    @pytest.fixture
    async def backend(self, store_dsn: str) -> AsyncIterator[Backend]:
        opened = await open_backend(store_dsn)
        try:
            yield opened
        finally:
            await opened.close()

    async def test_first_copy_wins_across_relays(self, backend: Backend) -> None:
        alice, bob = make_account(), make_account()
        store = await MeshlineStore.open(backend, alice.context, alice.account)
        mid = "msg_" + "E" * 22
        first = make_send_params(bob, alice, text="first", message_id=mid)
        second = make_send_params(bob, alice, text="second", message_id=mid)
        dev, cert = alice.device(0).device_id, bob.device(0).certificate

        _, stored = await sync(
            store, RELAY_A, sync_page([timeline_entry(first, dev, 0)], [cert]), alice
        )
        assert [m.sequence for m in stored.messages] == [0] and stored.position == 0
        outcome, stored_b = await sync(
            store, RELAY_B, sync_page([timeline_entry(second, dev, 7)], [cert]), alice
        )
        assert outcome.duplicates[0].conflict and not stored_b.messages
        assert stored_b.position == 7  # B's position is its own
        assert await store.position(RELAY_A) == 0

        rows = await store.messages()
        assert len(rows) == 1 and b"first" in rows[0].plaintext and rows[0].relay_id == RELAY_A
        assert rows[0].direction is Direction.INBOUND and rows[0].envelope == first.envelope

    async def test_racing_copies_never_overwrite(self, backend: Backend) -> None:
        """Both relays' pages were processed before either committed: the later commit adds nothing."""
        alice, bob = make_account(), make_account()
        store = await MeshlineStore.open(backend, alice.context, alice.account)
        mid = "msg_" + "F" * 22
        one = make_send_params(bob, alice, text="one", message_id=mid)
        two = make_send_params(bob, alice, text="two", message_id=mid)
        dev, cert = alice.device(0).device_id, bob.device(0).certificate
        me = local_device(alice)
        out_a = process_page(
            sync_page([timeline_entry(one, dev, 1)], [cert]),
            local=me,
            relay_id=RELAY_A,
            after=-1,
            known=lambda k: None,
        )
        out_b = process_page(
            sync_page([timeline_entry(two, dev, 1)], [cert]),
            local=me,
            relay_id=RELAY_B,
            after=-1,
            known=lambda k: None,
        )
        assert len((await store.commit_page(RELAY_A, out_a)).messages) == 1
        assert len((await store.commit_page(RELAY_B, out_b)).messages) == 0
        rows = await store.messages()
        assert len(rows) == 1 and b"one" in rows[0].plaintext

    async def test_positions_gaps_and_empty_pages(self, backend: Backend) -> None:
        alice, bob = make_account(), make_account()
        store = await MeshlineStore.open(backend, alice.context, alice.account)
        assert await store.position(RELAY_A) == -1
        dev, cert = alice.device(0).device_id, bob.device(0).certificate
        msgs = [make_send_params(bob, alice, text=f"m{i}") for i in range(3)]
        page = sync_page(
            [timeline_entry(m, dev, s) for m, s in zip(msgs, (2, 5, 9), strict=True)],
            [cert],
            has_retention_gap=True,
        )
        _, stored = await sync(store, RELAY_A, page, alice)
        assert [m.sequence for m in stored.messages] == [2, 5, 9]
        assert stored.gap is not None and stored.gap.after == -1 and stored.position == 9
        # The same gap reported again (re-read) is not new.
        _, again = await sync(
            store, RELAY_A, sync_page([], [], has_retention_gap=True), alice, after=-1
        )
        assert again.gap is None and again.position == 9  # and the position never moves back
        _, empty = await sync(store, RELAY_A, sync_page([], []), alice)
        assert empty.position == 9 and not empty.messages
        gaps = await store.gaps()
        assert [(g.relay_id, g.after, g.before) for g in gaps] == [(RELAY_A, -1, 2)]
        # Another account's store in the same database sees nothing of alice's.
        other = await MeshlineStore.open(backend, bob.context, bob.account)
        assert await other.messages() == [] and await other.position(RELAY_A) == -1
        assert [m.local_order for m in await store.messages(after=1, limit=10)] == [2, 3]

    @pytest.mark.parametrize("n", [3])
    async def test_reopen_keeps_everything(self, backend: Backend, n: int) -> None:
        alice, bob = make_account(), make_account()
        store = await MeshlineStore.open(backend, alice.context, alice.account)
        dev, cert = alice.device(0).device_id, bob.device(0).certificate
        page = sync_page(
            [timeline_entry(make_send_params(bob, alice), dev, s) for s in range(n)], [cert]
        )
        await sync(store, RELAY_A, page, alice)
        reopened = await MeshlineStore.open(
            backend, alice.context, alice.account
        )  # migrate is idempotent
        assert await reopened.position(RELAY_A) == n - 1
        assert len(await reopened.messages()) == n
