"""gapline's crypto against a real Synapse, with matrix-nio (its own crypto) as the peer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gapline.e2ee import UtdReason
from gapline.matrix import Session

from .synapse_peers import ENCRYPTION, GaplineDevice, NioDevice, _make_directory

pytestmark = pytest.mark.timeout(180)


class Scene:
    """Users, devices and rooms of one test; everything is closed at the end."""

    def __init__(self, kit: Any, tmp_path: Path) -> None:
        self.kit = kit
        self.tmp = tmp_path
        self.gapline: list[GaplineDevice] = []
        self.nio: list[NioDevice] = []

    async def gapline_device(self, session: Session, name: str) -> GaplineDevice:
        device = await GaplineDevice(session, _make_directory(self.tmp / name)).start(
            self.kit.base_url
        )
        self.gapline.append(device)
        return device

    async def nio_device(self, user_id: str, name: str) -> NioDevice:
        device = await NioDevice.login(self.kit.base_url, user_id, self.tmp / name)
        self.nio.append(device)
        return device

    async def encrypted_room(self, owner: Session, *members: Session) -> str:
        async with self.kit.client(owner) as client:
            room_id = await client.create_room(
                preset="private_chat",
                initial_state=[ENCRYPTION],
                invite=[m.user_id for m in members],
            )
        for member in members:
            async with self.kit.client(member) as client:
                await client.join(room_id)
        return room_id

    async def close(self) -> None:
        for g in self.gapline:
            await g.stop()
        for n in self.nio:
            await n.close()


@pytest.fixture
async def scene(synapse_kit: Any, tmp_path: Path) -> AsyncIterator[Scene]:
    s = Scene(synapse_kit, tmp_path)
    try:
        yield s
    finally:
        await s.close()


async def _gapline_and_nio(scene: Scene) -> tuple[GaplineDevice, NioDevice, str]:
    alice = await scene.kit.user("alice")
    bob = await scene.kit.user("bob")
    room = await scene.encrypted_room(alice, bob)
    g = await scene.gapline_device(alice, "alice")
    n = await scene.nio_device(bob.user_id, "bob-nio")
    await g.sync()
    await n.step()
    return g, n, room


async def test_nio_sends_encrypted_and_gapline_decrypts(scene: Scene) -> None:
    g, n, room = await _gapline_and_nio(scene)
    event_id = await n.send_text(room, "hello from nio")
    await g.wait_until(lambda: event_id in g.bodies)
    assert g.bodies[event_id] == "hello from nio"
    decrypted = g.decrypted[event_id]
    assert decrypted.sender == n.client.user_id and decrypted.sender_device == n.client.device_id


async def test_gapline_sends_encrypted_and_nio_decrypts_also_after_a_restart(scene: Scene) -> None:
    g, n, room = await _gapline_and_nio(scene)
    first = await g.send_text(room, "hello from gapline")
    await n.wait_until(lambda: first in n.bodies)
    assert n.bodies[first] == "hello from gapline"
    keys = g.machine.identity_keys
    await g.restart(scene.kit.base_url)
    assert g.machine.identity_keys == keys  # the same device, not a new one
    second = await g.send_text(room, "after a restart")
    await n.wait_until(lambda: second in n.bodies)
    reply = await n.send_text(room, "nio replies")
    await g.wait_until(lambda: reply in g.bodies)


async def test_nio_shares_its_key_late_and_the_retained_event_heals(scene: Scene) -> None:
    g, n, room = await _gapline_and_nio(scene)
    session_id, held = await n.hold_back_room_key(room)
    event_id = await n.send_text(room, "you will read this later")
    await g.wait_until(lambda: event_id in g.retained)
    _room, _event, utd = g.retained[event_id]
    assert utd.reason is UtdReason.MISSING_ROOM_KEY and utd.session_id == session_id
    async with scene.kit.client(n.session) as as_nio:
        await as_nio.send_to_device("m.room.encrypted", held, "late-key")
    await g.wait_until(lambda: event_id in g.bodies)
    assert g.bodies[event_id] == "you will read this later" and g.healed == [event_id]


async def test_nio_rotates_and_gapline_reads_both_sessions(scene: Scene) -> None:
    g, n, room = await _gapline_and_nio(scene)
    before = await n.send_text(room, "first session")
    n.olm.rotate_outbound_group_session(room)
    after = await n.send_text(room, "second session")
    await g.wait_until(lambda: before in g.bodies and after in g.bodies)
    assert g.decrypted[before].session_id != g.decrypted[after].session_id
    assert [g.bodies[before], g.bodies[after]] == ["first session", "second session"]


async def test_a_nio_device_that_joins_later_gets_the_current_session(scene: Scene) -> None:
    g, n, room = await _gapline_and_nio(scene)
    first = await g.send_text(room, "before the new device")
    await n.wait_until(lambda: first in n.bodies)
    late = await scene.nio_device(n.client.user_id, "bob-nio-2")
    # gapline learns of the device from sync's device_lists.changed and /keys/query.
    await g.wait_until(
        lambda: g.machine.device(late.client.user_id, late.client.device_id) is not None
    )
    second = await g.send_text(room, "for the new device too")
    await late.wait_until(lambda: second in late.bodies)
    await n.wait_until(lambda: second in n.bodies)
    shared = g.machine.outbound.shared_with(room)
    assert shared[(late.client.user_id, late.client.device_id)] == "shared"
    assert first not in late.bodies  # it got the session from its current index, not before


async def test_two_gapline_devices_of_one_user_read_each_other_and_nio(scene: Scene) -> None:
    alice = await scene.kit.user("alice")
    bob = await scene.kit.user("bob")
    room = await scene.encrypted_room(alice, bob)
    laptop = await scene.gapline_device(alice, "laptop")
    phone_session = await scene.kit.server.login(alice.user_id)
    phone = await scene.gapline_device(phone_session, "phone")
    n = await scene.nio_device(bob.user_id, "bob-nio")
    for device in (laptop, phone):
        await device.sync()
    await n.step()
    from_laptop = await laptop.send_text(room, "from the laptop")
    await phone.wait_until(lambda: from_laptop in phone.bodies)
    from_phone = await phone.send_text(room, "from the phone")
    await laptop.wait_until(lambda: from_phone in laptop.bodies)
    await n.wait_until(lambda: from_laptop in n.bodies and from_phone in n.bodies)
    from_nio = await n.send_text(room, "from nio to both")
    await laptop.wait_until(lambda: from_nio in laptop.bodies)
    await phone.wait_until(lambda: from_nio in phone.bodies)
    assert {d.device_id for d in laptop.machine.devices_of(alice.user_id)} == {
        alice.device_id,
        phone_session.device_id,
    }
