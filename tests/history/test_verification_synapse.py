"""Interactive verification between two gapline engines on a real Synapse, by commands only.

Each side is a whole engine (its sync path feeds the verification machine; its
commands answer it); nothing but ``StartVerification``, ``AcceptVerification``
and ``ConfirmVerification`` moves a flow. Two devices of one user end with the
new device verified and cross-signed by the first; two users, verifying in
their encrypted room, end with each other's master key signed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest

from gapline.e2ee import TrustLevel, bootstrap_cross_signing
from gapline.history import (
    AcceptVerification,
    ConfirmVerification,
    Engine,
    Ok,
    StartVerification,
    VerificationChanged,
    VerificationPhase,
)
from gapline.matrix import MatrixClient, Session
from tests.history.e2ee_support import encrypted_room
from tests.history.test_engine_e2ee_synapse import Sink, gapline

pytestmark = pytest.mark.timeout(300)

ROUNDS = 40
P = VerificationPhase


@contextlib.asynccontextmanager
async def engine(kit: Any, session: Session, store: Path, sink: Sink) -> AsyncGenerator[Engine]:
    async with gapline(kit, session, store, sink) as (e, _):
        await e.sync_once()
        yield e


def flows(sink: Sink) -> dict[str, VerificationChanged]:
    out: dict[str, VerificationChanged] = {}
    for event in sink.events:
        if isinstance(event, VerificationChanged):
            out[event.flow_id] = event
    return out


async def pump(engines: tuple[Engine, ...], done: Callable[[], bool]) -> None:
    for _ in range(ROUNDS):
        if done():
            return
        for e in engines:
            await e.sync_once(timeout_ms=200)
    raise AssertionError("the verification did not get there")


def trust(e: Engine, user_id: str, device_id: str) -> TrustLevel | None:
    found = [d for d in e.devices([user_id])[user_id] if d.device_id == device_id]
    return found[0].trust if found else None


async def verify(a: Engine, sa: Sink, b: Engine, sb: Sink, start: StartVerification) -> str:
    """a asks, b accepts, both see the same emoji and say they match; both end Done."""
    assert await a.execute(start) == Ok()
    [flow] = flows(sa)
    await pump((b, a), lambda: flow in flows(sb))
    assert flows(sb)[flow].state is P.Requested and not flows(sb)[flow].outgoing
    assert await b.execute(AcceptVerification(flow)) == Ok()
    both = (a, b)
    await pump(both, lambda: flows(sa)[flow].state is P.ShowSas is flows(sb)[flow].state)
    shown_a, shown_b = flows(sa)[flow], flows(sb)[flow]
    assert shown_a.emoji is not None and len(shown_a.emoji) == 7
    assert (shown_a.emoji, shown_a.decimals) == (shown_b.emoji, shown_b.decimals)
    assert await a.execute(ConfirmVerification(flow)) == Ok()
    assert await b.execute(ConfirmVerification(flow)) == Ok()
    await pump(both, lambda: flows(sa)[flow].state is P.Done is flows(sb)[flow].state)
    return flow


async def test_a_new_device_is_verified_and_cross_signed_by_the_first(
    synapse_kit: Any, tmp_path: Path
) -> None:
    first = await synapse_kit.user("alice")
    async with MatrixClient(synapse_kit.base_url, trust_env=False) as login:
        second = await login.login(first.user_id, "password")
    sa, sb = Sink(), Sink()
    async with (
        engine(synapse_kit, first, tmp_path / "a", sa) as a,
        engine(synapse_kit, second, tmp_path / "b", sb) as b,
    ):
        assert a.crypto is not None and a.crypto.driver is not None
        await bootstrap_cross_signing(a.crypto.driver, password="password")
        me = first.user_id
        await pump((a, b), lambda: trust(a, me, second.device_id) is TrustLevel.UNSIGNED
                   and trust(b, me, first.device_id) is not None)  # fmt: skip
        flow = await verify(a, sa, b, sb, StartVerification(me, second.device_id))
        assert flows(sa)[flow].cross_signed  # the first device holds the self-signing key
        assert not flows(sb)[flow].cross_signed  # the new one has nothing to sign with
        assert trust(a, me, second.device_id) is TrustLevel.VERIFIED
        assert trust(b, me, first.device_id) is TrustLevel.VERIFIED
        # The server lists the new device signed by the user's self-signing key.
        raw = a.crypto.driver.machine.devices.get(me, second.device_id)
        assert raw is not None and raw.trust is TrustLevel.CROSS_SIGNED


async def test_two_users_verify_in_their_room_and_sign_each_others_master_key(
    synapse_kit: Any, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    room = await encrypted_room(synapse_kit, alice, bob)
    sa, sb = Sink(), Sink()
    async with (
        engine(synapse_kit, alice, tmp_path / "a", sa) as a,
        engine(synapse_kit, bob, tmp_path / "b", sb) as b,
    ):
        for e in (a, b):
            assert e.crypto is not None and e.crypto.driver is not None
            await bootstrap_cross_signing(e.crypto.driver, password="password")
        await pump((a, b), lambda: trust(a, bob.user_id, bob.device_id) is TrustLevel.CROSS_SIGNED
                   and trust(b, alice.user_id, alice.device_id) is TrustLevel.CROSS_SIGNED)  # fmt: skip
        flow = await verify(a, sa, b, sb, StartVerification(bob.user_id, room_id=room))
        assert flows(sa)[flow].room_id == room == flows(sb)[flow].room_id
        for me, sink, other in ((a, sa, bob), (b, sb, alice)):
            assert sink.events and flows(sink)[flow].cross_signed
            assert me.crypto is not None and me.crypto.driver is not None
            assert me.crypto.driver.machine.cross_signing.user_verified(other.user_id)
            assert trust(me, other.user_id, other.device_id) is TrustLevel.VERIFIED
