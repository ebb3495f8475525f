"""Keys that outlive a device, against a real Synapse, with matrix-nio as the other client."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.e2ee import (
    BACKUP_ALGORITHM,
    BACKUP_SECRET,
    BackupKey,
    RoomKeyId,
    TrustLevel,
    UtdReason,
    WrongRecoveryKey,
    bootstrap_cross_signing,
    enable_backup,
    encode_recovery_key,
    export_room_keys,
    import_room_keys,
    recover_from_server,
    restore_backup,
    set_up_recovery,
    sign_own_device,
    upload_backup,
    verify_user,
)
from gapline.matrix import MatrixHTTPError

from . import test_synapse_nio
from .synapse_peers import GaplineDevice, add_made_up_sessions
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


async def _read_retained(device: GaplineDevice, room_keys: tuple[RoomKeyId, ...]) -> None:
    """Decrypt the retained events of ``room_keys`` (what a client does on a key update)."""
    sessions = {(k.room_id, k.session_id) for k in room_keys}
    for event_id, (room_id, event, utd) in list(device.retained.items()):
        if (room_id, utd.session_id) in sessions:
            del device.retained[event_id]
            device._keep(room_id, event, device.machine.decrypt_room_event(room_id, event))
    assert device.driver is not None
    await device.driver.commit()


async def test_a_new_device_recovers_and_reads_the_history_the_first_device_read(
    scene: Scene,
) -> None:
    alice = await scene.kit.user("alice")
    bob = await scene.kit.user("bob")
    room = await scene.encrypted_room(alice, bob)
    laptop = await scene.gapline_device(alice, "laptop")
    n = await scene.nio_device(bob.user_id, "bob-nio")
    await laptop.sync()
    sent = [await n.send_text(room, f"history {i}") for i in range(3)]
    sent.append(await laptop.send_text(room, "the laptop's own message"))
    await laptop.wait_until(lambda: all(e in laptop.bodies for e in sent))
    assert laptop.driver is not None
    # The first device: cross-signing, a backup, and secret storage holding their keys.
    master = await bootstrap_cross_signing(laptop.driver, password="password")
    assert laptop.machine.cross_signing.trusted_master_key() == master
    trust = await enable_backup(laptop.driver)
    assert trust is not None and trust.trusted
    assert await upload_backup(laptop.driver) == len(laptop.machine.inbound.identifiers())
    assert laptop.machine.backup.pending == 0
    setup = await set_up_recovery(laptop.driver)
    assert set(setup.secrets) == {
        "m.megolm_backup.v1",
        "m.cross_signing.master",
        "m.cross_signing.self_signing",
        "m.cross_signing.user_signing",
    }
    # The new device sees the history as holes, then recovers.
    phone = await scene.gapline_device(await scene.kit.server.login(alice.user_id), "phone")
    await phone.wait_until(lambda: all(e in phone.retained for e in sent))
    assert phone.driver is not None
    await recover_from_server(phone.driver, recovery_key=setup.recovery_key)
    trust = await enable_backup(phone.driver, create=False)
    assert trust is not None and trust.trusted and trust.version == laptop.machine.backup.version
    report = await restore_backup(phone.driver)
    assert len(report.imported) == len(laptop.machine.inbound.identifiers())
    await _read_retained(phone, report.imported)
    assert [phone.bodies[e] for e in sent] == [laptop.bodies[e] for e in sent]
    assert all(
        phone.machine.backup.is_from_backup(room, phone.decrypted[e].session_id) for e in sent
    )
    # The recovered device signs itself; the laptop then sees it as verified.
    await sign_own_device(phone.driver)
    await laptop.wait_until(
        lambda: (
            (d := laptop.machine.device(alice.user_id, phone.session.device_id)) is not None
            and d.trust is TrustLevel.VERIFIED
        )
    )
    mine = phone.machine.device(alice.user_id, laptop.session.device_id)
    assert mine is not None and mine.trust is TrustLevel.VERIFIED


async def test_verifying_another_user_marks_their_cross_signed_devices(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    carol = await scene.kit.user("carol")
    room = await scene.encrypted_room(alice, carol)
    a = await scene.gapline_device(alice, "alice")
    c = await scene.gapline_device(carol, "carol")
    await a.sync()
    await c.sync()
    assert a.driver is not None and c.driver is not None
    await bootstrap_cross_signing(a.driver, password="password")
    await bootstrap_cross_signing(c.driver, password="password")
    await a.wait_until(
        lambda: (
            (d := a.machine.device(carol.user_id, carol.device_id)) is not None
            and d.trust is TrustLevel.CROSS_SIGNED
        )
    )
    assert not a.machine.cross_signing.user_verified(carol.user_id)
    await verify_user(a.driver, carol.user_id)
    assert a.machine.cross_signing.user_verified(carol.user_id)
    device = a.machine.device(carol.user_id, carol.device_id)
    assert device is not None and device.trust is TrustLevel.VERIFIED
    assert room and not c.machine.cross_signing.user_verified(alice.user_id)  # one-sided


async def test_a_backup_version_nobody_trusted_signed_is_not_used(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    g = await scene.gapline_device(alice, "alice")
    assert g.driver is not None
    unsigned = {"public_key": BackupKey.generate().public_key}
    version = await g.driver.client.backup_version_create(BACKUP_ALGORITHM, unsigned)
    trust = await enable_backup(g.driver)
    assert trust is not None and not trust.trusted and trust.version == version
    assert g.machine.backup.version is None and g.machine.backup.next_upload() is None
    assert "no signature by a trusted device" in trust.reason


async def test_replacing_cross_signing_keys_needs_the_password(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    g = await scene.gapline_device(alice, "alice")
    assert g.driver is not None
    first = await bootstrap_cross_signing(g.driver, password="password")
    with pytest.raises(MatrixHTTPError) as refused:
        await bootstrap_cross_signing(g.driver, password="not the password")
    assert refused.value.status == 401  # Synapse: the password stage failed
    assert g.machine.cross_signing.trusted_master_key() == first  # the old seeds are held
    await g.restart(scene.kit.base_url)
    assert g.machine.cross_signing.trusted_master_key() == first
    second = await bootstrap_cross_signing(g.driver, password="password")
    assert second != first and g.machine.cross_signing.trusted_master_key() == second


async def test_a_new_version_made_elsewhere_is_followed_only_if_trusted(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    laptop = await scene.gapline_device(alice, "laptop")
    phone = await scene.gapline_device(await scene.kit.server.login(alice.user_id), "phone")
    assert laptop.driver is not None and phone.driver is not None
    assert (await enable_backup(laptop.driver)) is not None
    add_made_up_sessions(laptop, 1)
    assert await upload_backup(laptop.driver) == 1
    await laptop.sync()

    async def replace_from_phone() -> str:
        assert phone.driver is not None
        key = BackupKey.generate()
        auth = phone.machine.account.sign_json({"public_key": key.public_key})
        return await phone.driver.client.backup_version_create(BACKUP_ALGORITHM, auth)

    # The phone is not trusted by the laptop: its version is refused, the upload stops.
    await replace_from_phone()
    add_made_up_sessions(laptop, 1)
    assert await upload_backup(laptop.driver) == 0
    assert laptop.machine.backup.version is None and laptop.machine.backup.next_upload() is None
    # Once the phone is cross-signed under the laptop's master key, its version is followed.
    await bootstrap_cross_signing(laptop.driver, password="password")
    setup = await set_up_recovery(laptop.driver)
    await recover_from_server(phone.driver, recovery_key=setup.recovery_key)
    await phone.sync()
    await sign_own_device(phone.driver)
    await laptop.wait_until(
        lambda: (
            (d := laptop.machine.device(alice.user_id, phone.session.device_id)) is not None
            and d.trust is TrustLevel.VERIFIED
        )
    )
    third = await replace_from_phone()
    trust = await enable_backup(laptop.driver, create=False)
    assert trust is not None and trust.trusted and trust.version == third
    assert "trusted device" in trust.reason
    assert await upload_backup(laptop.driver) == 2  # both sessions, into the new version


async def test_a_restore_can_ask_for_one_room_or_one_session(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    laptop = await scene.gapline_device(alice, "laptop")
    phone = await scene.gapline_device(await scene.kit.server.login(alice.user_id), "phone")
    assert laptop.driver is not None and phone.driver is not None
    await enable_backup(laptop.driver)
    add_made_up_sessions(laptop, 6)  # two in each of three rooms
    assert await upload_backup(laptop.driver) == 6
    phone.machine.vault.put(BACKUP_SECRET, laptop.machine.vault.get(BACKUP_SECRET) or "")
    await enable_backup(phone.driver, create=False)
    (room, session), *_ = laptop.machine.inbound.identifiers()
    one = await restore_backup(phone.driver, room_id=room, session_id=session)
    assert one.imported == (RoomKeyId(room, session),)
    missing = await restore_backup(phone.driver, room_id=room, session_id="not-backed-up")
    assert missing.imported == () and missing.already_known == 0
    whole_room = await restore_backup(phone.driver, room_id=room)
    assert len(whole_room.imported) == 1 and whole_room.already_known == 1
    rest = await restore_backup(phone.driver)
    assert len(rest.imported) == 4 and rest.already_known == 2
    assert phone.machine.inbound.identifiers() == laptop.machine.inbound.identifiers()
