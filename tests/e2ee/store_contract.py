"""The persistence contract of `gapline.e2ee`, run on every storage backend.

``CryptoStoreContract`` is not collected itself; ``test_store_sqlite.py`` and
``test_store_postgres.py`` subclass it with a ``dsn`` fixture and delete the name.
A `DbPeer` is a `Peer` whose machine lives in a real store: its changes are
saved with `save_changes` in order (``flush``) and it can be reopened from disk.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import msgspec
import pytest

from gapline.e2ee import (
    E2EE_MIGRATIONS,
    E2EE_SCHEMA,
    Changes,
    CorruptCryptoStore,
    CryptoStoreError,
    DecryptedEvent,
    RefusalCode,
    RequestKind,
    TrustLevel,
    UnableToDecrypt,
    WrongStoreKey,
    load_state,
    open_machine,
    save_changes,
)
from gapline.e2ee._changes import SeenRecord
from gapline.storage import Backend, Tx, open_backend

from .harness import Clock, Peer, Room, online
from .keyserver import KeyServer


class DbPeer(Peer):
    backend: Backend
    flushed: int = 0

    @classmethod
    async def open(
        cls,
        backend: Backend,
        server: KeyServer,
        user_id: str,
        device_id: str,
        clock: Clock,
        store_key: bytes | None = None,
    ) -> DbPeer:
        peer = cls(server, user_id, device_id, clock, store_key)
        peer.backend = backend
        peer.machine = await open_machine(
            backend, peer.store_key, user_id=user_id, device_id=device_id, clock=clock
        )
        peer.saved = []
        return peer

    async def flush(self) -> None:
        self.commit()
        pending = self.saved[self.flushed :]

        def op(tx: Tx) -> None:
            for changes in pending:
                save_changes(tx, changes)

        await self.backend.write(op)
        self.flushed = len(self.saved)

    async def reopen(self) -> None:
        await self.flush()
        await self.reopen_without_flushing()

    async def reopen_without_flushing(self) -> None:
        """Open the machine again from what is on disk, as a process after a crash would."""
        m = self.machine
        self.machine = await open_machine(
            self.backend, self.store_key, user_id=m.user_id, device_id=m.device_id, clock=self.clock
        )
        self.saved, self.flushed = [], 0


async def paired(db: Backend) -> tuple[KeyServer, Clock, Peer, DbPeer, Room]:
    """Alice in memory, Bob in ``db``, both in one encrypted room, each knowing the other."""
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    bob = await DbPeer.open(db, server, "@bob:x", "B1", clock)
    bob.pump()
    alice.sync()
    bob.sync()
    room = Room("!r:x")
    alice.join(room)
    bob.join(room)
    alice.pump()
    bob.pump()
    return server, clock, alice, bob, room


class CryptoStoreContract:
    @pytest.fixture
    async def db(self, dsn: str) -> AsyncIterator[Backend]:
        backend = await open_backend(dsn)
        try:
            yield backend
        finally:
            await backend.close()

    async def _pair(self, db: Backend) -> tuple[KeyServer, Clock, Peer, DbPeer, Room]:
        return await paired(db)

    async def test_a_reopened_machine_continues_every_session(self, db: Backend) -> None:
        _server, _clock, alice, bob, room = await self._pair(db)
        first = alice.send(room, "before restart")
        bob.sync()
        assert bob.body(room, first) == "before restart"
        bob.send(room, "reply")
        keys = bob.machine.identity_keys
        await bob.reopen()
        assert bob.machine.identity_keys == keys
        assert bob.machine.device("@alice:x", "A1") is not None
        own = bob.machine.device("@bob:x", "B1")
        assert own is not None and own.trust is TrustLevel.OWN
        assert bob.body(room, first) == "before restart"
        replay = bob.read(room, msgspec.structs.replace(first, event_id="$x"))
        assert isinstance(replay, UnableToDecrypt) and replay.refusal is RefusalCode.MEGOLM_REPLAY
        second = alice.send(room, "after restart")  # same Megolm session, Olm not needed
        assert second.content["session_id"] == first.content["session_id"]
        assert bob.body(room, second) == "after restart"
        third = bob.send(room, "bob after restart")  # bob's outbound session survived
        alice.sync()
        assert alice.body(room, third) == "bob after restart"
        new_room = Room("!r2:x")
        alice.join(new_room)
        bob.join(new_room)
        fourth = alice.send(new_room, "new session over the old Olm channel")
        bob.sync()
        assert bob.body(new_room, fourth) == "new session over the old Olm channel"

    async def test_a_restart_never_creates_a_new_device(self, db: Backend) -> None:
        key = os.urandom(32)
        one = await open_machine(db, key, user_id="@a:x", device_id="D")
        two = await open_machine(db, key, user_id="@a:x", device_id="D")
        assert one.identity_keys == two.identity_keys
        with pytest.raises(CryptoStoreError, match="belongs to @a:x D"):
            await open_machine(db, key, user_id="@a:x", device_id="OTHER")

    async def test_a_wrong_store_key_is_a_clear_error_at_open(self, db: Backend) -> None:
        await open_machine(db, os.urandom(32), user_id="@a:x", device_id="D")
        with pytest.raises(WrongStoreKey, match="wrong store key"):
            await open_machine(db, os.urandom(32), user_id="@a:x", device_id="D")

    @pytest.mark.parametrize(
        "table", ["e2ee_account", "e2ee_inbound_sessions", "e2ee_olm_sessions"]
    )
    async def test_a_corrupted_pickle_is_a_clear_error_at_open(
        self, db: Backend, table: str
    ) -> None:
        _server, _clock, alice, bob, room = await self._pair(db)
        alice.send(room, "x")
        bob.sync()
        await bob.flush()
        pickle = await db.read(lambda tx: tx.one(f"SELECT pickle FROM {table}"))
        assert pickle is not None
        damaged = pickle[0][:40] + ("A" if pickle[0][40] != "A" else "B") + pickle[0][41:]
        await db.write(lambda tx: tx.execute(f"UPDATE {table} SET pickle = ?", (damaged,)))
        with pytest.raises(CorruptCryptoStore, match="do not open"):
            await bob.reopen()

    async def test_a_steps_changes_are_saved_all_or_nothing(self, db: Backend) -> None:
        server, _clock, alice, bob, room = await self._pair(db)
        await bob.flush()
        event = alice.send(room, "key in flight")
        sync = server.sync(*bob.me)  # the to-device room key, delivered once per sync token

        class Crash(Exception):
            pass

        bob.machine.receive_sync(sync)
        changes = bob.machine.take_changes()
        assert changes.olm_sessions and changes.inbound_sessions

        def save_then_crash(tx: Tx) -> None:
            save_changes(tx, changes)
            tx.execute("CREATE TABLE IF NOT EXISTS sync_token (t TEXT)")
            raise Crash("after saving, before the sync token commit")

        with pytest.raises(Crash):
            await db.write(save_then_crash)
        bob.saved = []
        bob.flushed = 0
        await bob.reopen()  # the machine as the store has it: before the sync
        assert isinstance(bob.read(room, event), UnableToDecrypt)
        updates = bob.machine.receive_sync(sync)  # the server hands the same batch again
        assert [k.session_id for k in updates.room_keys] == [event.content["session_id"]]
        assert bob.body(room, event) == "key in flight"

    async def test_a_ratchet_saved_without_its_keys_would_lose_them(self, db: Backend) -> None:
        # The control for the test above: saving only part of a step desynchronises.
        server, _clock, alice, bob, room = await self._pair(db)
        await bob.flush()
        event = alice.send(room, "x")
        sync = server.sync(*bob.me)
        bob.machine.receive_sync(sync)
        changes = bob.machine.take_changes()
        partial = changes.__class__(olm_sessions=changes.olm_sessions, account=changes.account)
        await db.write(lambda tx: save_changes(tx, partial))
        await bob.reopen()
        updates = bob.machine.receive_sync(sync)
        assert updates.room_keys == () and updates.refusals
        assert isinstance(bob.read(room, event), UnableToDecrypt)

    async def test_saving_the_same_changes_twice_is_harmless(self, db: Backend) -> None:
        _server, _clock, alice, bob, room = await self._pair(db)
        alice.send(room, "x")
        bob.sync()
        bob.commit()
        everything = list(bob.saved)

        def twice(tx: Tx) -> None:
            for _ in range(2):
                for changes in everything:
                    save_changes(tx, changes)

        await db.write(twice)
        bob.flushed = len(bob.saved)
        await bob.reopen()
        assert len(bob.machine.devices_of("@alice:x")) == 1

    async def test_replay_index_rows_are_kept_across_statements(self, db: Backend) -> None:
        """A heal saves a replay-index row per event, thousands in one write, several
        hundred per statement: every one is kept, and a row already stored keeps the
        event it was first saved with."""
        await db.migrate(E2EE_SCHEMA, E2EE_MIGRATIONS)
        first = tuple(SeenRecord("sid", i, os.urandom(16)) for i in range(901))
        again = (*first[400:], SeenRecord("sid", 0, os.urandom(16)))
        await db.write(lambda tx: save_changes(tx, Changes(seen=first)))
        await db.write(lambda tx: save_changes(tx, Changes(seen=again)))
        assert (await db.read(load_state)).seen == first

    async def test_queued_to_device_messages_survive_a_crash_and_are_sent_once(
        self, db: Backend
    ) -> None:
        server, clock = KeyServer(), Clock()
        (bob,) = online(server, clock, ("@bob:x", "B1"))
        alice = await DbPeer.open(db, server, "@alice:x", "A1", clock)
        alice.pump()
        room = Room("!r:x")
        alice.join(room)
        bob.join(room)
        for _ in range(4):  # share until the key messages are queued, without sending them
            report = alice.machine.share_room_key(room.room_id, sorted(room.members))
            alice.commit()
            pending = [
                r for r in alice.machine.outgoing_requests() if r.kind is not RequestKind.TO_DEVICE
            ]
            for req in pending:
                alice.machine.mark_request_as_sent(
                    req.request_id, server.handle(alice.me, req.request, req.response_type)
                )
                alice.commit()
            if report.state.value == "ready":
                break
        (queued,) = [
            r for r in alice.machine.outgoing_requests() if r.kind is RequestKind.TO_DEVICE
        ]
        await alice.reopen()  # crash before sending: the queued message is on disk
        (again,) = alice.machine.outgoing_requests()
        assert again.request_id == queued.request_id and again.request == queued.request
        server.handle(alice.me, queued.request, queued.response_type)  # it had been sent after all
        alice.pump()  # sent again with the same transaction ID: delivered once
        assert alice.machine.outgoing_requests() == []
        report = alice.share(
            room
        )  # after a restart a share step is needed, and finds nothing to send
        assert report.shared_with == () and not report.rotated
        content = alice.machine.encrypt_room_event(room.room_id, "m.room.message", {"body": "hi"})
        alice.commit()
        event = room.add("@alice:x", "m.room.encrypted", content)
        assert len(server.inbox[bob.me]) == 1
        bob.sync()
        result = bob.read(room, event)
        assert isinstance(result, DecryptedEvent) and result.content["body"] == "hi"
