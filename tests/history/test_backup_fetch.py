"""Keys fetched from the key backup for what a room shows, on the in-memory servers.

Alice's engine holds the key of a backup version on the fake homeserver (as a
device that recovered does) but never received bob's room keys (to-device is
held back): every row of his starts undecryptable, and heals only with keys the
engine fetches from the backup, on open, per walk page, or in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from gapline.e2ee import BACKUP_SECRET, BackupKey, UtdReason
from gapline.e2ee._backup_crypto import BACKUP_ALGORITHM, seal_session
from gapline.history import EventItem, OpenRoom, Set, TimelineChanged, TimelineReset
from gapline.history._backup_fetch import BackupFetcher
from gapline.matrix import ClientEvent
from gapline.matrix.testing import FakeHomeserver
from tests.e2ee.harness import Clock, Peer
from tests.e2ee.keyserver import KeyServer

from .e2ee_support import MEGOLM, ROOM, Scene, scene

ALICE = "@alice:x"


def _events(items: Any) -> dict[str, EventItem]:
    return {i.event_id: i for i in items if isinstance(i, EventItem)}


class Backup:
    """The fake homeserver's key backup of alice's account, and her engine's key to it."""

    def __init__(self, fake: FakeHomeserver) -> None:
        self.fake = fake
        self.version: str | None = None
        self.key: BackupKey | None = None

    async def take_up(self, s: Scene) -> None:
        """A version whose private key alice's machine holds (as after a recovery)."""
        driver = s.engine.crypto.driver if s.engine.crypto else None
        assert driver is not None
        machine = driver.machine
        if self.version is None:
            request = machine.backup.create_version()
            assert request.json is not None
            self.version = self.fake.room_keys.create_version(
                ALICE, BACKUP_ALGORITHM, request.json["auth_data"]
            )
            machine.backup.version_created(self.version)
            secret = machine.vault.get(BACKUP_SECRET)
            assert secret is not None
            self.key = BackupKey(secret)
        await driver.commit()

    def put(self, bob: Peer, session_id: str, *, corrupt: bool = False) -> None:
        """Bob's copy of his session, sealed to the backup key, in the backup."""
        assert self.key is not None and self.version is not None
        exported = bob.machine.inbound.export(ROOM, session_id)
        assert exported is not None
        key, index = exported
        session = {
            "algorithm": MEGOLM["algorithm"],
            "sender_key": key.sender_key,
            "sender_claimed_keys": {"ed25519": key.signing_key},
            "forwarding_curve25519_key_chain": [],
            "session_key": key.session_key,
        }
        sealed = seal_session(self.key.encryption(), session)
        if corrupt:
            sealed["mac"] = "AAAAAAAAAAA"
        data = {"first_message_index": index, "forwarded_count": 0, "is_verified": False,
                "session_data": sealed}  # fmt: skip
        self.fake.room_keys.put_key(ALICE, self.version, ROOM, session_id, data)

    def asked(self, session_id: str | None = None) -> int:
        """Per-session requests (``None``: whole-room requests) the engine sent."""
        gets = [
            [unquote(x) for x in r.path.split("/")[1:]]
            for r in self.fake.requests
            if r.endpoint == "room_keys" and r.method == "GET"
        ]
        if session_id is None:
            return sum(1 for g in gets if len(g) == 6)
        return sum(1 for g in gets if len(g) == 7 and g[6] == session_id)


@contextlib.asynccontextmanager
async def recovered(
    tmp_path: Path, server: KeyServer | None = None, bob: Peer | None = None,
    backup: Backup | None = None,
) -> AsyncGenerator[tuple[Scene, Backup]]:  # fmt: skip
    backup = backup or Backup(FakeHomeserver("x"))
    async with scene(tmp_path, server, bob, backup=backup.fake) as s:
        _fetcher(s).pause_s = 0
        if bob is None:
            await s.join_encrypted_room()
            s.server.hold_to_device = True  # alice never receives bob's room keys
        else:
            await s.sync()
        await backup.take_up(s)
        yield s, backup


def _world() -> tuple[KeyServer, Peer, Backup]:
    """A key server, bob, and the backup: kept across two engines on one store."""
    server = KeyServer()
    bob = Peer(server, "@bob:x", "B1", Clock())
    bob.pump()
    bob.machine.set_room_encryption(ROOM, MEGOLM)
    bob.machine.update_tracked_users(["@alice:x", "@bob:x"])
    bob.commit()
    return server, bob, Backup(FakeHomeserver("x"))


def _fetcher(s: Scene) -> BackupFetcher:
    assert s.engine.backup_fetch is not None
    return s.engine.backup_fetch


def _rotate(s: Scene) -> None:
    s.bob.machine.outbound.invalidate(ROOM, "a new session for the test")


def _session(event: ClientEvent) -> str:
    return event.content["session_id"]


async def test_open_fetches_the_visible_rows_sessions_and_they_heal_by_set(tmp_path) -> None:
    async with recovered(tmp_path) as (s, backup):
        first = [s.encrypted(f"first {i}") for i in range(2)]
        _rotate(s)
        second = s.encrypted("second")
        _rotate(s)
        unseen = s.encrypted("never shown")  # its key is backed up, its event never arrives
        for e in (*first, second, unseen):
            backup.put(s.bob, _session(e))
        await s.sync(*first, second)
        await s.engine.execute(OpenRoom(ROOM))
        await _fetcher(s).wait_idle()
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in (*first, second)] == ["first 0", "first 1", "second"]
        assert backup.asked(_session(first[0])) == 1
        assert backup.asked(_session(second)) == 1
        assert backup.asked(_session(unseen)) == 0
        diffs = [d for e in s.sink.events if isinstance(e, TimelineChanged) for d in e.diffs]
        healed = {getattr(d.value, "event_id", None) for d in diffs if isinstance(d, Set)}
        assert healed == {e.event_id for e in (*first, second)}
        resets = [e for e in s.sink.events if isinstance(e, TimelineReset)]
        assert len(resets) == 1  # the open's own: healing never resets


async def test_a_page_fetches_its_missing_sessions_before_it_commits(tmp_path) -> None:
    async with recovered(tmp_path) as (s, backup):
        old = [s.encrypted(f"old {i}") for i in range(3)]
        _rotate(s)
        newest = s.encrypted("newest")
        for e in (*old, newest):
            backup.put(s.bob, _session(e))
        s.hs.older.extend(old)
        await s.sync(newest, prev_batch="p1")  # a gap below the newest event
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.wait_idle(ROOM)
        await _fetcher(s).wait_idle()
        await s.engine.flush_history(ROOM)
        rows = _events(s.rows())
        assert [rows[e.event_id].body for e in old] == ["old 0", "old 1", "old 2"]
        assert rows[newest.event_id].body == "newest"
        # The page's rows reached the timeline decrypted: never shown undecryptable.
        shown = [
            v
            for e in s.sink.events
            if isinstance(e, TimelineChanged)
            for d in e.diffs
            for v in (getattr(d, "values", None) or [getattr(d, "value", None)])
            if isinstance(v, EventItem) and v.event_id in {o.event_id for o in old}
        ]
        assert shown and all(v.body is not None and v.decryption is None for v in shown)
        assert backup.asked(_session(old[0])) == 1


async def test_a_session_the_backup_lacks_stays_utd_and_is_not_asked_again(tmp_path) -> None:
    async with recovered(tmp_path) as (s, backup):
        s.hs.older.extend(s.encrypted(f"lost page {i}") for i in range(2))
        lost = s.encrypted("lost")
        await s.sync(lost, prev_batch="p1")  # a page of the same session below it
        await s.engine.execute(OpenRoom(ROOM))
        await s.engine.wait_idle(ROOM)
        await _fetcher(s).wait_idle()
        for i in range(3):  # more syncs showing the same session
            await s.sync(s.encrypted(f"lost again {i}"))
            await _fetcher(s).wait_idle()
        await s.engine.flush_history(ROOM)
        row = _events(s.rows())[lost.event_id]
        assert row.body is None and row.decryption is not None
        assert row.decryption.reason is UtdReason.MISSING_ROOM_KEY
        assert backup.asked(_session(lost)) == 1


async def test_a_corrupt_backup_entry_is_refused_and_the_row_stays_utd(tmp_path, caplog) -> None:
    async with recovered(tmp_path) as (s, backup):
        bad = s.encrypted("bad entry")
        backup.put(s.bob, _session(bad), corrupt=True)
        await s.sync(bad)
        with caplog.at_level(logging.WARNING, logger="gapline.e2ee.backup"):
            await s.engine.execute(OpenRoom(ROOM))
            await _fetcher(s).wait_idle()
            await s.sync()
            await _fetcher(s).wait_idle()
        await s.engine.flush_history(ROOM)
        row = _events(s.rows())[bad.event_id]
        assert row.body is None and row.decryption is not None
        assert any("refused" in r.getMessage() and "MAC" in r.getMessage() for r in caplog.records)
        assert backup.asked(_session(bad)) == 1
        driver = s.engine.crypto.driver if s.engine.crypto else None
        assert driver is not None
        assert driver.machine.inbound.first_known_index(ROOM, _session(bad)) is None


async def test_one_request_in_flight_per_session(tmp_path) -> None:
    async with recovered(tmp_path) as (s, backup):
        event = s.encrypted("once")
        backup.put(s.bob, _session(event))
        stalled = backup.fake.stall("room_keys", 0.2)
        fetcher = _fetcher(s)
        first = asyncio.create_task(fetcher.fetch(ROOM, [_session(event)]))
        await stalled.struck.wait()
        second = await fetcher.fetch(ROOM, [_session(event), _session(event)])
        assert second == ()  # the first caller imports it; this one waited for it
        assert len(await first) == 1
        assert backup.asked(_session(event)) == 1


async def test_the_background_fetch_completes_the_room_once(tmp_path) -> None:
    server, bob, backup = _world()
    async with recovered(tmp_path, server, bob, backup) as (s, _):
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        seen = s.encrypted("seen")
        _rotate(s)
        hidden = s.encrypted("not shown yet")
        await backup.take_up(s)
        for e in (seen, hidden):
            backup.put(s.bob, _session(e))
        await s.sync(seen)
        await s.engine.execute(OpenRoom(ROOM))
        await _fetcher(s).wait_idle()
        driver = s.engine.crypto.driver if s.engine.crypto else None
        assert driver is not None
        assert driver.machine.inbound.first_known_index(ROOM, _session(hidden)) is not None
        assert backup.asked() == 1  # the whole room, once
    async with recovered(tmp_path, server, bob, backup) as (s, _):
        await s.engine.execute(OpenRoom(ROOM))
        await _fetcher(s).wait_idle()
        assert backup.asked() == 1  # recorded as done: not asked again after a restart


async def test_closing_the_engine_cancels_a_background_fetch_and_it_resumes(tmp_path) -> None:
    server, bob, backup = _world()
    async with recovered(tmp_path, server, bob, backup) as (s, _):
        await s.join_encrypted_room()
        s.server.hold_to_device = True
        hidden = s.encrypted("in the backup only")
        await backup.take_up(s)
        backup.put(s.bob, _session(hidden))
        stalled = backup.fake.stall("room_keys", 3600)
        await s.engine.execute(OpenRoom(ROOM))
        await stalled.struck.wait()
    # The engine closed with the room's fetch in its stall; nothing was imported.
    async with recovered(tmp_path, server, bob, backup) as (s, _):
        driver = s.engine.crypto.driver if s.engine.crypto else None
        assert driver is not None
        assert driver.machine.inbound.first_known_index(ROOM, _session(hidden)) is None
        await s.engine.execute(OpenRoom(ROOM))
        await _fetcher(s).wait_idle()
        assert driver.machine.inbound.first_known_index(ROOM, _session(hidden)) is not None
        assert backup.asked() == 2


@pytest.fixture(autouse=True)
def _quiet(caplog) -> None:
    caplog.set_level(logging.INFO, logger="gapline.history")
