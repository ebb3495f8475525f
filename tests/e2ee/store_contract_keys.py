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
