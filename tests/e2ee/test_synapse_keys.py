"""Keys that outlive a device, against a real Synapse, with matrix-nio as the other client."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.e2ee import (
    BACKUP_SECRET,
    UtdReason,
    WrongRecoveryKey,
    encode_recovery_key,
    export_room_keys,
    import_room_keys,
    recover_from_server,
    set_up_recovery,
)

from . import test_synapse_nio
from .test_synapse_nio import Scene

scene = test_synapse_nio.scene  # the same fixture: users, devices and rooms closed at the end

pytestmark = pytest.mark.timeout(240)


async def test_key_files_cross_between_nio_and_gapline(scene: Scene, tmp_path: Path) -> None:
    alice = await scene.kit.user("alice")
    bob = await scene.kit.user("bob")
    room = await scene.encrypted_room(alice, bob)
    n = await scene.nio_device(bob.user_id, "bob-nio")
    from_nio = await n.send_text(room, "sent before gapline had a device")
    g = await scene.gapline_device(alice, "alice")
    await g.wait_until(lambda: from_nio in g.retained)
    assert g.retained[from_nio][2].reason is UtdReason.MISSING_ROOM_KEY
    # nio exports, gapline imports and reads what nio sent.
    nio_file = tmp_path / "nio-keys.txt"
    await n.client.export_keys(str(nio_file), "hunter2")
    report = import_room_keys(g.machine, nio_file.read_text(), "hunter2")
    assert report.imported and not report.refusals
    room_id, event, _utd = g.retained.pop(from_nio)
    g._keep(room_id, event, g.machine.decrypt_room_event(room_id, event))
    assert g.driver is not None
    await g.driver.commit()
    assert g.bodies[from_nio] == "sent before gapline had a device"
    # gapline exports, a new nio device imports and reads what gapline sent.
    from_gapline = await g.send_text(room, "sent before the second nio device")
    late = await scene.nio_device(bob.user_id, "bob-nio-2")
    await late.wait_until(lambda: from_gapline in late.undecryptable)
    gapline_file = tmp_path / "gapline-keys.txt"
    gapline_file.write_text(export_room_keys(g.machine, "correct horse", rounds=10_000))
    await late.client.import_keys(str(gapline_file), "correct horse")
    await late.retry_undecryptable()
    assert late.bodies[from_gapline] == "sent before the second nio device"


async def test_recovery_through_secret_storage_on_synapse(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    first = await scene.gapline_device(alice, "first")
    first.machine.vault.put(BACKUP_SECRET, "a2VwdC1ieS10aGUtZmlyc3QtZGV2aWNl")
    assert first.driver is not None
    await first.driver.commit()
    setup = await set_up_recovery(first.driver)
    assert setup.secrets == (BACKUP_SECRET,)
    second = await scene.gapline_device(await scene.kit.server.login(alice.user_id), "second")
    assert second.driver is not None
    with pytest.raises(WrongRecoveryKey):
        await recover_from_server(second.driver, recovery_key=encode_recovery_key(bytes(32)))
    assert second.machine.vault.names() == []
    names = await recover_from_server(second.driver, recovery_key=setup.recovery_key)
    assert names == (BACKUP_SECRET,)
    await second.restart(scene.kit.base_url)  # kept in the store, not only in memory
    assert second.machine.vault.get(BACKUP_SECRET) == "a2VwdC1ieS10aGUtZmlyc3QtZGV2aWNl"
