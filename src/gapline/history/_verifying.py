"""Interactive verification in the engine: the SAS machine fed from sync, driven by commands.

The account's crypto machine holds one `Verifications` state machine per flow;
:class:`Verifying` does for the engine what that machine leaves to its caller:

- every sync's verification events go in as the sync is prepared (plaintext and
  Olm-decrypted to-device events, and the room events that decrypted to
  ``m.key.verification.*`` or are an in-room request), under the crypto lock,
  so a mark a finished flow saves is committed with that sync;
- the commands (``StartVerification``, ``AcceptVerification``,
  ``ConfirmVerification``, ``CancelVerification``) call the machine;
- :meth:`Verifying.settle` then sends what the machine queued (through the
  e2ee driver: to-device as is, in-room encrypted for an encrypted room),
  starts the SAS once the other side is ready to a request of ours, uploads
  the cross-signing signatures of a flow that just succeeded, and publishes one
  ``VerificationChanged`` per flow whose state changed;
- while a flow is under way a ticker owned by the engine's task group calls
  the machine's ``expire`` (``m.timeout``) every :data:`TICK_S`, so a flow the
  other side abandoned ends even when no sync arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from gapline.e2ee import (
    CryptoDriver,
    DecryptedToDevice,
    KeyUpdates,
    VerificationEvent,
    VerificationState,
    VerificationStatus,
    publish_verified,
    request_verification_in_room,
    send_verification,
)
from gapline.history._commands import (
    AcceptVerification,
    CancelVerification,
    ConfirmVerification,
    StartVerification,
)
from gapline.history._crypto import EngineCrypto
from gapline.history._failures import describe
from gapline.history._types import Answer, Event, EventNotFound, Failed, Invalid, Ok
from gapline.history._verifying_types import VerificationChanged, VerificationPhase
from gapline.matrix import MatrixError, SyncResponse, ToDeviceEvent
from gapline.storage import StorageError

__all__ = ["TICK_S", "VerifyCommand", "Verifying"]

log = logging.getLogger("gapline.history.verification")

TICK_S = 5.0  # how often a flow under way is checked for the other side's silence
_PHASES = {
    VerificationState.REQUESTED: VerificationPhase.Requested,
    VerificationState.READY: VerificationPhase.Ready,
    VerificationState.STARTED: VerificationPhase.Started,
    VerificationState.ACCEPTED: VerificationPhase.Accepted,
    VerificationState.SHOW_SAS: VerificationPhase.ShowSas,
    VerificationState.CONFIRMED: VerificationPhase.Confirmed,
    VerificationState.DONE: VerificationPhase.Done,
    VerificationState.CANCELLED: VerificationPhase.Cancelled,
}
_ENDED = (VerificationState.DONE, VerificationState.CANCELLED)

VerifyCommand = StartVerification | AcceptVerification | ConfirmVerification | CancelVerification


class Verifying:
    """The engine's verification flows (see the module doc)."""

    def __init__(
        self,
        crypto: EngineCrypto,
        publish: Callable[[Event], Awaitable[None]],
        tg: asyncio.TaskGroup,
    ) -> None:
        self._crypto = crypto
        self._publish = publish
        self._tg = tg
        self._shown: dict[str, VerificationChanged] = {}
        self._outgoing: set[str] = set()  # flows this device asked for
        self._signed: dict[str, bool] = {}  # finished flows: whether signatures went up
        self._ticker: asyncio.Task[None] | None = None

    # -- what sync brings --------------------------------------------------------------------

    def receive_sync(self, response: SyncResponse, updates: KeyUpdates) -> None:
        """Feed one prepared sync's verification events (its timelines as the cache keeps
        them, so an encrypted step arrives decrypted). Call it under the crypto lock."""
        driver = self._crypto.driver
        if driver is None:
            return
        self.receive_to_device([*response.to_device.events, *updates.to_device])
        verification = driver.machine.verification
        for room_id, joined in response.rooms.join.items():
            for event in joined.timeline.events:
                if event.state_key is not None:
                    continue
                found = VerificationEvent.from_room(room_id, event)
                if found.is_verification:
                    verification.receive(found)

    def receive_to_device(self, events: Iterable[ToDeviceEvent | DecryptedToDevice]) -> None:
        driver = self._crypto.driver
        if driver is None:
            return
        verification = driver.machine.verification
        for raw in events:
            event = VerificationEvent.from_to_device(raw)
            if event.is_verification:
                verification.receive(event)

    # -- what the person says ----------------------------------------------------------------

    async def execute(self, command: VerifyCommand) -> Answer:
        driver = await self._crypto.ensure()
        if driver is None:
            return Failed("verification needs a logged-in client")
        try:
            if isinstance(command, StartVerification):
                answer = await self._start(driver, command)
                if answer != Ok():
                    return answer
            else:
                async with self._crypto.lock:
                    answer = self._answer(driver, command)
                if answer != Ok():
                    return answer
            await self.settle()
        except (MatrixError, StorageError) as exc:
            await self.settle()  # the flow's state as it stands
            return Failed(f"verification: {describe(exc)}")
        return Ok()

    async def _start(self, driver: CryptoDriver, command: StartVerification) -> Answer:
        user, device = command.user_id, command.device_id
        machine = driver.machine
        if user == machine.user_id and device == machine.device_id:
            return Invalid("this device cannot verify itself")

        def others() -> list[str]:
            return [d.device_id for d in machine.devices_of(user)
                    if (d.user_id, d.device_id) != (machine.user_id, machine.device_id)
                    and not d.deleted]  # fmt: skip

        if command.room_id is None and (device not in others() if device else not others()):
            # Not known yet (no room shared, or a new device): ask the server for its keys.
            async with self._crypto.lock:
                machine.update_tracked_users([user])
                machine.receive_sync_changes(changed=[user])
            await self._crypto.send_outgoing()
            machine = driver.machine
        if device is not None and device not in others():
            return Failed(f"unknown device {device} of {user}: its keys are not known")
        async with self._crypto.lock:
            if command.room_id is not None:
                status = await request_verification_in_room(driver, command.room_id, user)
            else:
                try:
                    status = driver.machine.verification.request(user, (device,) if device else ())
                except ValueError as exc:
                    return Failed(str(exc))
            self._outgoing.add(status.flow_id)
        log.info("verification %s: asked %s %s", status.flow_id, user, device or "(all devices)")
        return Ok()

    def _answer(
        self, driver: CryptoDriver, command: AcceptVerification | ConfirmVerification |
        CancelVerification
    ) -> Answer:  # fmt: skip
        verification = driver.machine.verification
        try:
            match command:
                case AcceptVerification(flow_id=flow):
                    verification.accept(flow)
                case ConfirmVerification(flow_id=flow, matches=True):
                    verification.confirm(flow)
                case ConfirmVerification(flow_id=flow):
                    verification.mismatch(flow)
                case CancelVerification(flow_id=flow):
                    verification.cancel(flow)
        except KeyError:
            return EventNotFound()
        except ValueError as exc:
            return Failed(str(exc))
        return Ok()

    # -- sending and showing -----------------------------------------------------------------

    async def settle(self) -> None:
        """Send what the machine queued, start the SAS of our requests that are ready,
        sign what was verified, and publish each flow whose state changed.

        A message that cannot be sent is logged (the other side times out, or the person
        cancels); the flow's state is published as the machine holds it."""
        driver = self._crypto.driver
        if driver is None:
            return
        async with self._crypto.lock:
            verification = driver.machine.verification
            verification.expire()
            for status in verification.flows():
                if (status.flow_id in self._outgoing and not status.we_started
                        and status.state is VerificationState.READY):  # fmt: skip
                    verification.start_sas(status.flow_id)
            try:
                await send_verification(driver)
            except (MatrixError, StorageError) as exc:
                log.warning("verification messages not sent: %s", exc)
            statuses = driver.machine.verification.flows()
            for status in statuses:
                if status.state is VerificationState.DONE and status.flow_id not in self._signed:
                    self._signed[status.flow_id] = await self._sign(driver, status)
        known = {s.flow_id for s in statuses}  # the machine forgets flows long ended
        for held in (self._shown, self._signed):
            for flow_id in [f for f in held if f not in known]:
                del held[flow_id]
        self._outgoing &= known
        for status in statuses:
            event = self._event(status)
            if self._shown.get(status.flow_id) != event:
                self._shown[status.flow_id] = event
                await self._publish(event)
        if self._ticker is None and any(s.state not in _ENDED for s in statuses):
            self._ticker = self._tg.create_task(self._tick())

    async def _sign(self, driver: CryptoDriver, status: VerificationStatus) -> bool:
        try:
            signed = await publish_verified(driver, status)
        except (MatrixError, StorageError) as exc:
            log.warning("verification %s: signatures not uploaded: %s", status.flow_id, exc)
            return False
        log.info("verification %s: %s verified%s", status.flow_id, status.user_id,
                 " and cross-signed" if signed else "")  # fmt: skip
        return signed

    def _event(self, status: VerificationStatus) -> VerificationChanged:
        short = status.short_string
        return VerificationChanged(
            flow_id=status.flow_id,
            other_user=status.user_id,
            other_device=status.device_id,
            room_id=status.room_id,
            state=_PHASES[status.state],
            outgoing=status.flow_id in self._outgoing,
            emoji=None if short is None else short.emoji,
            decimals=None if short is None else short.decimals,
            cancel_code=status.cancel_code,
            cancel_reason=status.cancel_reason,
            cancelled_by_us=status.cancelled_by_us,
            cross_signed=self._signed.get(status.flow_id, False),
        )

    async def _tick(self) -> None:
        """Expire flows the other side left hanging; ends once none is under way."""
        try:
            while True:
                await asyncio.sleep(TICK_S)
                driver = self._crypto.driver
                flows = () if driver is None else driver.machine.verification.flows()
                if not any(s.state not in _ENDED for s in flows):
                    return
                await self.settle()
        finally:
            self._ticker = None

    async def close(self) -> None:
        """Stop the ticker (the engine is shutting down)."""
        task, self._ticker = self._ticker, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
