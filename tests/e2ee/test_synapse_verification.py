"""Interactive SAS verification against a real Synapse, with matrix-nio as the other device.

matrix-nio speaks the to-device flow that begins at the start (it has no request
step) and accepts; gapline starts (see docs/e2ee.md for why nio cannot be the
starter against a client that follows the spec's commitment encoding)."""

from __future__ import annotations

from collections.abc import Callable

import nio
import pytest
from nio.crypto import Sas as NioSas

from gapline.e2ee import (
    TrustLevel,
    VerificationState,
    bootstrap_cross_signing,
    publish_verified,
    request_verification_in_room,
    send_verification,
)
from gapline.matrix import Session

from . import test_synapse_nio
from .synapse_peers import GaplineDevice, NioDevice
from .test_synapse_nio import Scene

scene = test_synapse_nio.scene

pytestmark = pytest.mark.timeout(240)
S = VerificationState


async def _know_each_other(g: GaplineDevice, n: NioDevice) -> None:
    nio_user, nio_device = n.client.user_id, str(n.client.device_id)
    g.machine.update_tracked_users([nio_user])
    await g.wait_until(lambda: g.machine.device(nio_user, nio_device) is not None)
    g_user, g_device = g.session.user_id, g.session.device_id
    n.olm.users_for_key_query.add(g_user)  # nio tracks only users it shares a room with
    await n.wait_until(lambda: g_device in n.olm.device_store[g_user])


async def _nio_sync(n: NioDevice, cancels: list[nio.KeyVerificationCancel]) -> None:
    answer = await n.client.sync(timeout=1000)
    assert isinstance(answer, nio.SyncResponse), answer
    cancels.extend(e for e in answer.to_device_events if isinstance(e, nio.KeyVerificationCancel))
    await n.keys()


async def _two_users(scene: Scene) -> tuple[GaplineDevice, NioDevice]:
    """alice on gapline and bob on nio, in an encrypted room, each knowing the other device."""
    alice = await scene.kit.user("alice")
    bob = await scene.kit.user("bob")
    await scene.encrypted_room(alice, bob)
    g = await scene.gapline_device(alice, "alice")
    n = await scene.nio_device(bob.user_id, "bob-nio")
    await _know_each_other(g, n)
    return g, n


async def _to_show_sas(g: GaplineDevice, n: NioDevice) -> tuple[str, NioSas]:
    """gapline starts, nio accepts, keys cross; both sides hold the short string."""
    assert g.driver is not None
    status = g.machine.verification.start_sas(
        user_id=n.client.user_id, device_id=str(n.client.device_id)
    )
    await send_verification(g.driver)
    flow = status.flow_id
    await n.wait_until(lambda: flow in n.client.key_verifications)
    answer = await n.client.accept_key_verification(flow)
    assert isinstance(answer, nio.ToDeviceResponse), answer
    await g.wait_until(lambda: g.machine.verification.status(flow).state is S.ACCEPTED)
    sas = n.client.key_verifications[flow]
    await n.wait_until(lambda: sas.established_sas is not None)  # our key in, its key out
    await g.wait_until(lambda: g.machine.verification.status(flow).state is S.SHOW_SAS)
    shown = g.machine.verification.status(flow).short_string
    assert shown is not None and shown.decimals == sas.get_decimals()
    return flow, sas


async def _both_confirm(g: GaplineDevice, n: NioDevice) -> str:
    """Both people see the same string and confirm (nio's first: it checks our MAC only
    once its person confirmed); both flows end verified."""
    assert g.driver is not None
    flow, sas = await _to_show_sas(g, n)
    answer = await n.client.confirm_short_auth_string(flow)
    assert isinstance(answer, nio.ToDeviceResponse), answer
    g.machine.verification.confirm(flow)
    await send_verification(g.driver)
    await g.wait_until(lambda: g.machine.verification.status(flow).state is S.DONE)
    await n.wait_until(lambda: sas.verified)
    return flow


async def test_a_gapline_and_a_nio_device_of_one_user_verify_and_cross_sign(
    scene: Scene,
) -> None:
    alice = await scene.kit.user("alice")
    g = await scene.gapline_device(alice, "alice-gapline")
    assert g.driver is not None
    await bootstrap_cross_signing(g.driver, password="password")
    n = await scene.nio_device(alice.user_id, "alice-nio")
    await _know_each_other(g, n)
    nio_device = str(n.client.device_id)
    assert g.machine.device(alice.user_id, nio_device).trust is TrustLevel.UNSIGNED
    flow = await _both_confirm(g, n)
    assert n.olm.device_store[alice.user_id][g.session.device_id].verified
    status = g.machine.verification.status(flow)
    assert status.verified_devices == (nio_device,) and status.signatures is not None
    assert await publish_verified(g.driver, status)
    # Signed with our self-signing key, as the server now lists it: cross-signed.
    assert g.machine.devices.get(alice.user_id, nio_device).trust is TrustLevel.CROSS_SIGNED
    assert g.machine.device(alice.user_id, nio_device).trust is TrustLevel.VERIFIED


async def test_a_gapline_user_verifies_a_nio_user(scene: Scene) -> None:
    g, n = await _two_users(scene)
    flow = await _both_confirm(g, n)
    bob = n.client.user_id
    assert g.machine.device(bob, str(n.client.device_id)).trust is TrustLevel.VERIFIED
    assert n.olm.device_store[g.session.user_id][g.session.device_id].verified
    # Bob has no cross-signing keys: the mark is all there is, nothing to sign.
    assert g.machine.verification.status(flow).signatures is None


async def test_a_mismatch_cancels_on_both_sides(scene: Scene) -> None:
    g, n = await _two_users(scene)
    assert g.driver is not None
    # gapline's person says the strings differ: nio receives m.mismatched_sas.
    flow, sas = await _to_show_sas(g, n)
    g.machine.verification.mismatch(flow)
    await send_verification(g.driver)
    cancels: list[nio.KeyVerificationCancel] = []
    for _ in range(20):
        if cancels:
            break
        await _nio_sync(n, cancels)
    assert [(c.transaction_id, c.code) for c in cancels] == [(flow, "m.mismatched_sas")]
    assert sas.canceled and flow not in n.client.key_verifications
    # nio's person says they differ: gapline's flow ends cancelled with the same code.
    flow2, _sas2 = await _to_show_sas(g, n)
    await n.client.cancel_key_verification(flow2, reject=True)
    await g.wait_until(lambda: g.machine.verification.status(flow2).state is S.CANCELLED)
    status = g.machine.verification.status(flow2)
    assert status.cancel_code == "m.mismatched_sas" and not status.cancelled_by_us
    device = g.machine.device(n.client.user_id, str(n.client.device_id))
    assert device is not None and device.trust is TrustLevel.UNSIGNED


async def _pump(devices: tuple[GaplineDevice, ...], done: Callable[[], bool]) -> None:
    for _ in range(30):
        if done():
            return
        for d in devices:
            await d.sync(timeout_ms=200)
    raise AssertionError("the verification did not get there")


async def _gapline_users(scene: Scene) -> tuple[GaplineDevice, GaplineDevice, str]:
    """alice and bob, each on a gapline device, in an encrypted room, knowing each other."""
    alice = await scene.kit.user("alice")
    bob = await scene.kit.user("bob")
    room = await scene.encrypted_room(alice, bob)
    a = await scene.gapline_device(alice, "alice")
    b = await scene.gapline_device(bob, "bob")
    await _pump((a, b), lambda: a.machine.device(bob.user_id, bob.device_id) is not None
                and b.machine.device(alice.user_id, alice.device_id) is not None)  # fmt: skip
    return a, b, room


async def _ready_to_done(a: GaplineDevice, b: GaplineDevice, flow: str) -> None:
    """b accepts a's request, a starts, both compare the same string and confirm."""
    va, vb = a.machine.verification, b.machine.verification
    await _pump((a, b), lambda: any(s.flow_id == flow for s in vb.flows()))
    vb.accept(flow)
    await _pump((a, b), lambda: va.status(flow).state is S.READY)
    va.start_sas(flow)
    await _pump((a, b), lambda: va.status(flow).state is S.SHOW_SAS
                and vb.status(flow).state is S.SHOW_SAS)  # fmt: skip
    assert va.status(flow).short_string == vb.status(flow).short_string
    va.confirm(flow)
    vb.confirm(flow)
    await _pump((a, b), lambda: va.status(flow).state is S.DONE
                and vb.status(flow).state is S.DONE)  # fmt: skip


async def test_two_gapline_users_verify_through_a_request_and_sign_each_others_master_key(
    scene: Scene,
) -> None:
    a, b, _room = await _gapline_users(scene)
    for d in (a, b):
        assert d.driver is not None
        await bootstrap_cross_signing(d.driver, password="password")

    def cross_signed(me: GaplineDevice, other: Session) -> bool:
        device = me.machine.device(other.user_id, other.device_id)
        return device is not None and device.trust is TrustLevel.CROSS_SIGNED

    # Each sees the other's device signed by its owner, not yet verified by itself.
    await _pump((a, b), lambda: cross_signed(a, b.session) and cross_signed(b, a.session))
    flow = a.machine.verification.request(b.session.user_id).flow_id
    await _ready_to_done(a, b, flow)
    for me, other in ((a, b.session), (b, a.session)):
        status = me.machine.verification.status(flow)
        assert status.verified_master_key is not None  # the MAC covered their master key
        assert not me.machine.cross_signing.user_verified(other.user_id)
        assert me.driver is not None and await publish_verified(me.driver, status)
        # Their master key now carries our user-signing key's signature, as the server
        # lists it: their cross-signed devices are VERIFIED through cross-signing.
        assert me.machine.cross_signing.user_verified(other.user_id)
        device = me.machine.device(other.user_id, other.device_id)
        assert device is not None and device.trust is TrustLevel.VERIFIED


async def test_two_gapline_users_verify_in_an_encrypted_room(scene: Scene) -> None:
    a, b, room = await _gapline_users(scene)
    assert a.driver is not None
    flow = (await request_verification_in_room(a.driver, room, b.session.user_id)).flow_id
    await _ready_to_done(a, b, flow)
    assert b.machine.verification.status(flow).room_id == room
    # Every step after the request crossed the room encrypted, relating to the request.
    steps = {d.type for d in b.decrypted.values()} | {d.type for d in a.decrypted.values()}
    assert {f"m.key.verification.{k}" for k in ("ready", "start", "accept", "key", "mac",
                                                "done")} <= steps  # fmt: skip
    for me, other in ((a, b.session), (b, a.session)):
        device = me.machine.device(other.user_id, other.device_id)
        assert device is not None and device.trust is TrustLevel.VERIFIED
