"""The persistence contract of the key-keeping parts (held secrets, key backup), per backend.

Mixed into the backend test classes beside `CryptoStoreContract`, with the same
``db`` fixture.
"""

from __future__ import annotations

import os

import pytest

from gapline.e2ee import (
    BACKUP_SECRET,
    MASTER_SECRET,
    CorruptCryptoStore,
    open_machine,
    save_changes,
)
from gapline.storage import Backend

from .harness import Room
from .store_contract import paired


class KeyStoreContract:
    async def test_held_secrets_survive_a_restart_sealed(self, db: Backend) -> None:
        key = os.urandom(32)
        machine = await open_machine(db, key, user_id="@a:x", device_id="D")
        machine.vault.put(BACKUP_SECRET, "dW5taXN0YWthYmxlLWJhY2t1cC1rZXk")
        machine.vault.put(MASTER_SECRET, "bWFzdGVy")
        changes = machine.take_changes()
        await db.write(lambda tx: save_changes(tx, changes))
        rows = await db.read(lambda tx: tx.all("SELECT name, sealed FROM e2ee_secrets"))
        assert b"dW5taXN0YWthYmxl" not in b"".join(bytes(r[1]) for r in rows)
        again = await open_machine(db, key, user_id="@a:x", device_id="D")
        assert again.vault.get(BACKUP_SECRET) == "dW5taXN0YWthYmxlLWJhY2t1cC1rZXk"
        again.vault.remove(MASTER_SECRET)
        removed = again.take_changes()
        await db.write(lambda tx: save_changes(tx, removed))
        third = await open_machine(db, key, user_id="@a:x", device_id="D")
        assert third.vault.names() == [BACKUP_SECRET]

    async def test_a_secret_row_moved_to_another_name_does_not_open(self, db: Backend) -> None:
        key = os.urandom(32)
        machine = await open_machine(db, key, user_id="@a:x", device_id="D")
        machine.vault.put(BACKUP_SECRET, "YmFja3Vw")
        changes = machine.take_changes()
        await db.write(lambda tx: save_changes(tx, changes))
        await db.write(lambda tx: tx.execute("UPDATE e2ee_secrets SET name = ?", (MASTER_SECRET,)))
        with pytest.raises(CorruptCryptoStore, match="held secrets"):
            await open_machine(db, key, user_id="@a:x", device_id="D")

    async def test_a_backup_upload_resumes_after_a_crash_without_repeats(self, db: Backend) -> None:
        _server, _clock, alice, bob, _room = await paired(db)
        for i in range(3):
            extra = Room(f"!extra{i}:x")
            alice.join(extra)
            bob.join(extra)
            alice.send(extra, f"in room {i}")
        bob.sync()
        held = set(bob.machine.inbound.identifiers())
        assert len(held) >= 3
        bob.machine.backup.create_version()
        bob.machine.backup.version_created("1")
        uploaded: list[tuple[str, str]] = []
        first = bob.machine.backup.next_upload(batch=2)
        assert first is not None
        uploaded += [(r, s) for r, s, _i in first.sessions]
        bob.machine.backup.upload_done(first)
        await bob.flush()  # the first batch's answer is committed
        lost = bob.machine.backup.next_upload(batch=2)
        assert lost is not None  # sent, the process dies before its answer is committed
        await bob.reopen_without_flushing()
        assert bob.machine.backup.version == "1"
        assert bob.machine.backup.pending == len(held) - 2
        rest = []
        while (upload := bob.machine.backup.next_upload(batch=2)) is not None:
            rest += [(r, s) for r, s, _i in upload.sessions]
            bob.machine.backup.upload_done(upload)
        assert sorted(uploaded + rest) == sorted(held)  # each once (besides the lost batch)
        assert not set(uploaded) & set(rest)
