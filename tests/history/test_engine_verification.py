"""Interactive verification through the engine's commands, against a bare crypto machine.

Alice is a real engine (SQLite, its sync path); bob is a bare `CryptoMachine`
behind the in-memory key server, driving his side with the machine's own calls.
Every step crosses the server as to-device messages; what alice's engine shows
is the ``VerificationChanged`` events it published.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import pytest

from gapline.e2ee import (
    TrustLevel,
    VerificationEvent,
    VerificationState,
    VerificationStatus,
)
from gapline.history import (
    AcceptVerification,
    CancelVerification,
    ConfirmVerification,
    EventNotFound,
    Failed,
    Invalid,
    Mirror,
    Ok,
    StartVerification,
    VerificationChanged,
    VerificationPhase,
    command_from_wire,
    event_from_wire,
    to_wire,
)
from gapline.matrix import EmptyResponse
from tests.e2ee.harness import Clock, Peer
from tests.e2ee.keyserver import KeyServer
from tests.history.e2ee_support import ALICE, MEGOLM, ROOM, Scene, Sink, scene

BOB = ("@bob:x", "B1")
P = VerificationPhase
S = VerificationState


@contextlib.asynccontextmanager
async def verifying_scene(tmp_path: Path, sink: Sink | None = None) -> AsyncGenerator[Scene]:
    """Alice's engine and bob in their encrypted room, each knowing the other's device."""
    server = KeyServer()
    # bob's clock is the wall clock: alice's engine ignores a request stamped long ago.
    bob = Peer(server, *BOB, Clock(int(time.time() * 1000)))
    bob.pump()
    bob.machine.set_room_encryption(ROOM, MEGOLM)
    bob.machine.update_tracked_users([ALICE[0], BOB[0]])
    bob.commit()
    async with scene(tmp_path, server, bob, sink=sink) as sc:
        await sc.join_encrypted_room()
        await sc.sync()  # alice's engine queried bob's device
        assert sc.engine.devices([BOB[0]])[BOB[0]], "alice knows bob's device"
        yield sc


@pytest.fixture
async def s(tmp_path: Path) -> AsyncGenerator[Scene]:
    async with verifying_scene(tmp_path) as sc:
        yield sc


def bob_receive(s: Scene) -> list[VerificationStatus]:
    """Bob's sync: each verification event he got goes into his machine; his answers out."""
    response = s.server.sync(*BOB)
    updates = s.bob.machine.receive_sync(response)
    out = []
    for raw in [*response.to_device.events, *updates.to_device]:
        event = VerificationEvent.from_to_device(raw)
        if event.is_verification:
            status = s.bob.machine.verification.receive(event)
            if status is not None:
                out.append(status)
    bob_send(s)
    return out


def bob_send(s: Scene) -> None:
    for msg in s.bob.machine.verification.take_outgoing():
        s.server.handle(s.bob.me, msg.request(uuid.uuid4().hex), EmptyResponse)
    s.bob.pump()


def shown(s: Scene) -> list[VerificationChanged]:
    return [e for e in s.sink.events if isinstance(e, VerificationChanged)]


def last(s: Scene) -> VerificationChanged:
    return shown(s)[-1]


async def to_show_sas(s: Scene) -> str:
    """Bob asks, alice accepts through the engine, bob starts: both show the string."""
    vb = s.bob.machine.verification
    flow = vb.request(ALICE[0], (ALICE[1],)).flow_id
    bob_send(s)
    await s.sync()
    asked = last(s)
    assert (asked.flow_id, asked.state, asked.outgoing) == (flow, P.Requested, False)
    assert (asked.other_user, asked.other_device) == BOB
    assert await s.engine.execute(AcceptVerification(flow)) == Ok()
    assert last(s).state is P.Ready
    bob_receive(s)
    assert vb.status(flow).state is S.READY
    vb.start_sas(flow)
    bob_send(s)
    await s.sync()  # the start: alice accepts it at once (she agreed to the request)
    assert last(s).state is P.Accepted
    bob_receive(s)  # the accept; bob sends his key
    await s.sync()  # bob's key: alice shows the string and sends hers
    assert last(s).state is P.ShowSas
    bob_receive(s)
    assert vb.status(flow).state is S.SHOW_SAS
    return flow


async def test_bob_asks_alice_accepts_and_both_confirm_the_same_emoji(s: Scene) -> None:
    flow = await to_show_sas(s)
    event = last(s)
    bobs = s.bob.machine.verification.status(flow).short_string
    assert bobs is not None and event.emoji == bobs.emoji and len(event.emoji) == 7
    assert event.decimals == bobs.decimals
    assert await s.engine.execute(ConfirmVerification(flow)) == Ok()
    assert last(s).state is P.Confirmed
    bob_receive(s)  # alice's MAC
    s.bob.machine.verification.confirm(flow)
    bob_send(s)  # bob's MAC and done
    await s.sync()
    done = last(s)
    assert done.state is P.Done and not done.cancelled_by_us
    assert not done.cross_signed  # bob has no cross-signing keys: nothing to sign
    [device] = s.engine.devices([BOB[0]])[BOB[0]]
    assert device.trust is TrustLevel.VERIFIED
    bob_receive(s)
    assert s.bob.machine.verification.status(flow).state is S.DONE
    # One event per change, in order, none repeated.
    states = [e.state for e in shown(s) if e.flow_id == flow]
    assert states == [P.Requested, P.Ready, P.Accepted, P.ShowSas, P.Confirmed, P.Done]


async def test_alice_starts_and_says_the_emoji_differ(s: Scene) -> None:
    assert await s.engine.execute(StartVerification(BOB[0], BOB[1])) == Ok()
    asked = last(s)
    assert asked.state is P.Requested and asked.outgoing
    [request] = bob_receive(s)
    flow = request.flow_id
    assert flow == asked.flow_id and request.state is S.REQUESTED
    s.bob.machine.verification.accept(flow)
    bob_send(s)
    await s.sync()  # bob's ready: the engine starts the SAS itself
    assert last(s).state is P.Started
    bob_receive(s)  # the start, accepted at once
    await s.sync()  # the accept: alice sends her key
    bob_receive(s)  # alice's key: bob shows the string, sends his
    await s.sync()
    assert last(s).state is P.ShowSas and last(s).emoji is not None
    assert await s.engine.execute(ConfirmVerification(flow, matches=False)) == Ok()
    ended = last(s)
    assert ended.state is P.Cancelled and ended.cancel_code == "m.mismatched_sas"
    assert ended.cancelled_by_us
    [status] = bob_receive(s)
    assert status.state is S.CANCELLED and status.cancel_code == "m.mismatched_sas"
    [device] = s.engine.devices([BOB[0]])[BOB[0]]
    assert device.trust is not TrustLevel.VERIFIED


async def test_bob_cancels_and_alice_sees_why(s: Scene) -> None:
    flow = await to_show_sas(s)
    s.bob.machine.verification.cancel(flow)
    bob_send(s)
    await s.sync()
    ended = last(s)
    assert ended.state is P.Cancelled and ended.cancel_code == "m.user"
    assert not ended.cancelled_by_us
    # A command for the finished flow changes nothing; one for no flow says so.
    assert isinstance(await s.engine.execute(ConfirmVerification(flow)), Failed)
    assert await s.engine.execute(AcceptVerification("no-such-flow")) == EventNotFound()


async def test_alice_cancels_and_bob_is_told(s: Scene) -> None:
    flow = await to_show_sas(s)
    assert await s.engine.execute(CancelVerification(flow)) == Ok()
    assert last(s).state is P.Cancelled and last(s).cancel_code == "m.user"
    [status] = bob_receive(s)
    assert status.state is S.CANCELLED and status.cancel_code == "m.user"


async def until(done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_a_silent_other_side_times_out_without_a_sync(
    s: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gapline.e2ee._verification as machine_rules
    import gapline.history._verifying as engine_rules

    monkeypatch.setattr(machine_rules, "STEP_TIMEOUT_MS", 20)
    monkeypatch.setattr(engine_rules, "TICK_S", 0.01)
    assert await s.engine.execute(StartVerification(BOB[0])) == Ok()
    [request] = bob_receive(s)
    s.bob.machine.verification.accept(request.flow_id)
    bob_send(s)
    await s.sync()  # ready: alice starts and waits for bob's accept, which never comes
    await until(lambda: last(s).state is P.Cancelled)
    assert last(s).cancel_code == "m.timeout" and last(s).cancelled_by_us
    *_, status = bob_receive(s)  # the start reaches bob late, then the timeout
    assert status.state is S.CANCELLED and status.cancel_code == "m.timeout"


async def test_start_refuses_what_cannot_be_verified(s: Scene) -> None:
    assert isinstance(await s.engine.execute(StartVerification(*ALICE)), Invalid)
    answer = await s.engine.execute(StartVerification(BOB[0], "NOPE"))
    assert isinstance(answer, Failed) and "unknown device NOPE" in answer.message
    assert not shown(s)


async def test_the_commands_and_the_event_on_the_wire() -> None:
    commands = {
        StartVerification("@b:x"): {"StartVerification": {"user_id": "@b:x"}},
        StartVerification("@b:x", "D", "!r:x"): {
            "StartVerification": {"user_id": "@b:x", "device_id": "D", "room_id": "!r:x"}
        },
        AcceptVerification("f"): {"AcceptVerification": {"flow_id": "f"}},
        ConfirmVerification("f"): {"ConfirmVerification": {"flow_id": "f"}},
        ConfirmVerification("f", matches=False): {
            "ConfirmVerification": {"flow_id": "f", "matches": False}
        },
        CancelVerification("f"): {"CancelVerification": {"flow_id": "f"}},
    }
    for command, wire in commands.items():
        assert to_wire(command) == wire
        assert command_from_wire(wire) == command
    with pytest.raises(ValueError, match="Matrix user id"):
        command_from_wire({"StartVerification": {"user_id": "bob"}})
    with pytest.raises(ValueError, match="empty"):
        command_from_wire({"AcceptVerification": {"flow_id": ""}})
    event = VerificationChanged(
        flow_id="f", other_user="@b:x", other_device="D", state=P.ShowSas, outgoing=True,
        emoji=(("🐶", "Dog"),) * 7, decimals=(1, 2, 3),
    )  # fmt: skip
    wire = to_wire(event)
    assert wire["VerificationChanged"]["emoji"][0] == ["🐶", "Dog"]
    assert wire["VerificationChanged"]["state"] == "ShowSas"
    assert event_from_wire(wire) == event
    mirror = Mirror()
    mirror.apply(event)
    assert mirror.verifications == {"f": event}
