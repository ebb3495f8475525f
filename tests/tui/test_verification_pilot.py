"""The verification modal on the real engine, with a bare crypto machine as the other device.

Alice runs the TUI over a real engine (SQLite, its sync path, the in-memory key
server); bob is a `CryptoMachine` answering with its own calls. The modal opens
for bob's request, accepts on ``y``, shows the seven emoji bob's machine shows,
and each answer reaches bob: ``y`` a MAC (then verified), ``n``
``m.mismatched_sas``, Esc ``m.user``. ``V`` picks bob's device and asks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

from textual.pilot import Pilot

from gapline.e2ee import VerificationState
from gapline.history import Engine, Event, EventSink, VerificationPhase
from gapline.tui import GaplineApp
from gapline.tui._verification import DevicePicker, VerificationScreen, flow_text
from tests.history.e2ee_support import (
    ALICE,
    ROOM,
    Scene,
    Sink,
)
from tests.history.test_engine_verification import bob_receive, bob_send, verifying_scene
from tests.tui.support import until

P = VerificationPhase
S = VerificationState


class Forward(Sink):
    """Keeps every event and hands it on to the app's sink once the app is connected."""

    target: EventSink | None = None

    async def publish(self, event: Event) -> None:
        await super().publish(event)
        if self.target is not None:
            await self.target.publish(event)


@dataclass
class Run:
    scene: Scene
    app: GaplineApp
    pilot: Pilot

    @property
    def modal(self) -> VerificationScreen:
        screen = self.app.screen
        assert isinstance(screen, VerificationScreen), screen
        return screen

    async def state(self, phase: VerificationPhase) -> None:
        await until(
            self.pilot,
            lambda: (
                isinstance(self.app.screen, VerificationScreen)
                and self.app.screen.event.state is phase
            ),
            f"the modal at {phase.value}",
        )


@contextlib.asynccontextmanager
async def tui(tmp_path: Path) -> AsyncGenerator[Run]:
    forward = Forward()
    async with verifying_scene(tmp_path, forward) as scene:
        engine = scene.engine

        @contextlib.asynccontextmanager
        async def connect(sink: EventSink) -> AsyncGenerator[Engine]:
            forward.target = sink
            yield engine

        app = GaplineApp(connect, room_id=ROOM, tz=UTC)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.mirror.members(ROOM), "the room open")
            yield Run(scene, app, pilot)


async def bob_asks_and_alice_accepts(run: Run) -> str:
    s = run.scene
    flow = s.bob.machine.verification.request(ALICE[0], (ALICE[1],)).flow_id
    bob_send(s)
    await s.sync()
    await run.state(P.Requested)
    assert "asks to verify" in run.modal.text and "Accept?" in run.modal.text
    await run.pilot.press("y")
    await run.state(P.Ready)
    bob_receive(s)
    s.bob.machine.verification.start_sas(flow)
    bob_send(s)
    await s.sync()
    bob_receive(s)
    await s.sync()
    bob_receive(s)
    await run.state(P.ShowSas)
    return flow


async def test_matching_emoji_end_verified(tmp_path: Path) -> None:
    async with tui(tmp_path) as run:
        s = run.scene
        flow = await bob_asks_and_alice_accepts(run)
        bobs = s.bob.machine.verification.status(flow).short_string
        assert bobs is not None
        text = run.modal.text
        for symbol, name in bobs.emoji:
            assert symbol in text and name in text
        assert " ".join(map(str, bobs.decimals)).replace(" ", "  ") in text
        assert "Do they match?" in text
        await run.pilot.press("y")
        await run.state(P.Confirmed)
        bob_receive(s)  # alice's MAC
        s.bob.machine.verification.confirm(flow)
        bob_send(s)
        await s.sync()
        await run.state(P.Done)
        assert "Verified" in run.modal.text
        bob_receive(s)  # alice's done
        assert s.bob.machine.verification.status(flow).state is S.DONE
        await run.pilot.press("enter")
        await until(run.pilot, lambda: not isinstance(run.app.screen, VerificationScreen))


async def test_emoji_that_differ_tell_the_other_side(tmp_path: Path) -> None:
    async with tui(tmp_path) as run:
        flow = await bob_asks_and_alice_accepts(run)
        await run.pilot.press("n")
        await run.state(P.Cancelled)
        assert "the emoji did not match (by you)" in run.modal.text
        [status] = bob_receive(run.scene)
        assert status.flow_id == flow and status.cancel_code == "m.mismatched_sas"


async def test_escape_cancels_a_request_and_closes_once_it_ended(tmp_path: Path) -> None:
    async with tui(tmp_path) as run:
        s = run.scene
        flow = s.bob.machine.verification.request(ALICE[0], (ALICE[1],)).flow_id
        bob_send(s)
        await s.sync()
        await run.state(P.Requested)
        await run.pilot.press("escape")
        await run.state(P.Cancelled)
        [status] = bob_receive(s)
        assert status.flow_id == flow and status.cancel_code == "m.user"
        await run.pilot.press("escape")
        await until(run.pilot, lambda: not isinstance(run.app.screen, VerificationScreen))


async def test_v_picks_a_device_and_asks_it(tmp_path: Path) -> None:
    async with tui(tmp_path) as run:
        await run.pilot.press("V")
        await until(run.pilot, lambda: isinstance(run.app.screen, DevicePicker), "the picker")
        await run.pilot.press("enter")  # bob's device, the only other one
        await run.state(P.Requested)
        assert "Waiting for the other device" in run.modal.text
        [status] = bob_receive(run.scene)
        assert status.state is S.REQUESTED and status.user_id == ALICE[0]  # asked by alice
        assert status.flow_id == run.modal.event.flow_id


def test_the_modal_says_why_a_flow_ended() -> None:
    from gapline.history import VerificationChanged

    timed_out = VerificationChanged(flow_id="f", other_user="@b:x", other_device="D",
                                    state=P.Cancelled, cancel_code="m.timeout")  # fmt: skip
    assert "Not verified: it timed out (by the other side)" in flow_text(timed_out).plain
    done = VerificationChanged(flow_id="f", other_user="@b:x", state=P.Done, cross_signed=True)
    assert "Verified and cross-signed" in flow_text(done, {"@b:x": "Bob"}).plain
    assert "Verify Bob" in flow_text(done, {"@b:x": "Bob"}).plain
