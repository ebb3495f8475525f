"""SIGKILL in the middle of a key-backup upload and of a restore, against Synapse.

After the kill the store is opened again: every session ends up in the backup once
(the upload resumes with what was not acknowledged), and a restore killed before its
commit leaves nothing restored, so nothing half-restored is trusted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from gapline.e2ee import BACKUP_SECRET, enable_backup, restore_backup, upload_backup

from . import test_synapse_nio
from .synapse_peers import GaplineDevice, add_made_up_sessions
from .test_synapse_nio import Scene

pytestmark = pytest.mark.timeout(240)
scene = test_synapse_nio.scene

REPO = Path(__file__).resolve().parents[2]
SESSIONS = 12


async def _run_child_until(device: GaplineDevice, mode: str, marker: str, count: int) -> list[str]:
    """Run the child on the device's store, SIGKILL it after ``count`` ``marker`` lines."""
    await device.stop()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.e2ee.backup_crash_child", mode,
        json.dumps(device.session.to_dict()), str(device.directory / "gapline.db"),
        device.store_key.hex(), cwd=REPO, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert child.stdout is not None
        while sum(line.startswith(marker) for line in lines) < count:
            line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().strip()
            assert line and line != "done", f"the child ended before the kill: {lines}"
            lines.append(line)
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    return lines


async def test_sigkill_mid_upload_and_mid_restore(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    laptop = await scene.gapline_device(alice, "laptop")
    assert laptop.driver is not None
    add_made_up_sessions(laptop, SESSIONS)
    trust = await enable_backup(laptop.driver)
    assert trust is not None and trust.trusted and laptop.machine.backup.pending == SESSIONS
    # Killed after three acknowledged uploads.
    lines = await _run_child_until(laptop, "upload", "acked", 3)
    acked = {tuple(line.split()[1:]) for line in lines if line.startswith("acked")}
    await laptop.start(scene.kit.base_url)
    pending = laptop.machine.backup.pending
    # Nothing acknowledged is sent again; at most the one batch in flight at the kill is.
    assert SESSIONS - len(acked) - 1 <= pending <= SESSIONS - len(acked)
    assert laptop.machine.backup.version == trust.version
    assert laptop.driver is not None  # a new driver since the restart
    assert await upload_backup(laptop.driver) == pending
    version = await laptop.driver.client.backup_version()
    assert version is not None and version.count == SESSIONS  # each session in the backup once
    # A second device restores; killed after three batches, before its commit.
    phone = await scene.gapline_device(await scene.kit.server.login(alice.user_id), "phone")
    assert phone.driver is not None
    phone.machine.vault.put(BACKUP_SECRET, laptop.machine.vault.get(BACKUP_SECRET) or "")
    trusted = await enable_backup(phone.driver, create=False)
    assert trusted is not None and trusted.trusted
    await _run_child_until(phone, "restore", "decrypted", 3)
    await phone.start(scene.kit.base_url)
    assert phone.machine.inbound.identifiers() == []  # nothing half-restored was kept
    assert phone.machine.backup.pending == 0
    assert phone.driver is not None
    report = await restore_backup(phone.driver)
    assert len(report.imported) == SESSIONS and not report.refusals
    held = phone.machine.inbound.identifiers()
    assert len(held) == SESSIONS and all(phone.machine.backup.is_from_backup(*i) for i in held)
    assert phone.machine.backup.pending == 0  # restored sessions are not uploaded back
