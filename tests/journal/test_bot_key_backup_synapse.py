"""The bot's device and the account's key backup, on a real Synapse.

A first device of the bot's account backs up its sessions and sets up recovery; the
bot's own device (its crypto state in the journal's database) refuses a wrong recovery
key with nothing stored, recovers with the right one (every backed-up session), and
after that uploads the sessions it stores itself, never those the backup gave it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gapline.cli import main
from gapline.e2ee import (
    WrongRecoveryKey,
    bootstrap_cross_signing,
    enable_backup,
    encode_recovery_key,
    set_up_recovery,
    upload_backup,
)
from gapline.journal._crypto import BotCrypto
from gapline.matrix import MatrixClient
from gapline.storage import open_backend
from tests.e2ee.synapse_peers import GaplineDevice, add_made_up_sessions
from tests.fixtures.synapse import SynapseKit

pytestmark = pytest.mark.timeout(240)


async def test_the_bot_recovers_the_backup_and_backs_up_what_it_stores(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    account = await synapse_kit.user("bot")
    first = await GaplineDevice(account, tmp_path / "first").start(synapse_kit.base_url)
    try:
        assert first.driver is not None
        add_made_up_sessions(first, 5)
        await first.driver.commit()
        await bootstrap_cross_signing(first.driver, password="password")
        trust = await enable_backup(first.driver)
        assert trust is not None and trust.trusted
        assert await upload_backup(first.driver) == 5
        setup = await set_up_recovery(first.driver)
    finally:
        await first.stop()

    backend = await open_backend(str(tmp_path / "journal.sqlite3"))
    try:
        async with MatrixClient(synapse_kit.base_url, trust_env=False) as client:
            session = await client.login(account.user_id, "password")
            crypto = await BotCrypto.open(
                backend, client, "pw", user_id=session.user_id, device_id=session.device_id
            )
            await crypto.publish()
            with pytest.raises(WrongRecoveryKey):
                await crypto.recover(encode_recovery_key(os.urandom(32)))
            assert crypto.machine.inbound.identifiers() == []
            secrets = await backend.read(lambda tx: tx.all("SELECT * FROM e2ee_secrets"))
            assert list(secrets) == []

            restored = await crypto.recover(setup.recovery_key)
            assert len(restored) == 5 and len(crypto.machine.inbound.identifiers()) == 5
            assert await crypto.back_up() == 0  # what the backup gave is not sent back
            add_made_up_sessions(SimpleNamespace(machine=crypto.machine), 2)  # ty: ignore[invalid-argument-type]
            await crypto.commit()
            assert await crypto.back_up() == 2
            assert crypto.machine.backup.pending == 0
    finally:
        await backend.close()


def test_a_recovery_key_without_a_passphrase_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GAPLINE_PASSWORD", "pw")
    monkeypatch.delenv("GAPLINE_PASSPHRASE", raising=False)
    key = tmp_path / "recovery-key.txt"
    key.write_text(encode_recovery_key(os.urandom(32)) + "\n")
    status = main([
        "bot", "--homeserver", "http://127.0.0.1:9", "--user", "@bot:localhost",
        "--store", str(tmp_path / "j.sqlite3"), "--handler", "echo",
        "--recovery-key-file", str(key),
    ])  # fmt: skip
    assert status == 2
    assert "--recovery-key-file needs" in capsys.readouterr().err
