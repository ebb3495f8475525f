"""The async steps of interactive verification over a `CryptoDriver`.

`send_verification` sends what `Verifications.take_outgoing` holds: to-device
messages as they are, in-room ones encrypted first when the room is encrypted
(the room key shared with its joined members, like any event). `publish_verified`
uploads the signatures a successful flow produced and fetches the keys again, so
the verified device or user shows ``VERIFIED`` on every device of ours.
"""

from __future__ import annotations

import uuid
from typing import Any

from gapline.matrix import EmptyResponse

from ._driver import CryptoDriver
from ._key_driver import _publish_signatures, _requery
from ._verification_types import VerificationStatus

__all__ = ["publish_verified", "request_verification_in_room", "send_verification"]


async def _send_room(driver: CryptoDriver, room_id: str, event_type: str,
                     content: dict[str, Any]) -> str:  # fmt: skip
    txn_id = uuid.uuid4().hex
    if not driver.machine.is_room_encrypted(room_id):
        return await driver.client.send_event(room_id, event_type, content, txn_id=txn_id)
    members = list(await driver.client.joined_members(room_id))
    await driver.share_room_key(room_id, members)
    encrypted = await driver.encrypt(room_id, event_type, content)
    return await driver.client.send_event(room_id, "m.room.encrypted", encrypted, txn_id=txn_id)


async def request_verification_in_room(
    driver: CryptoDriver, room_id: str, user_id: str
) -> VerificationStatus:
    """Ask ``user_id`` to verify in a room we share (the way to verify another user)."""
    verification = driver.machine.verification
    msg = verification.request_in_room(room_id, user_id)
    event_id = await _send_room(driver, room_id, msg.type, msg.content)
    return verification.room_request_sent(room_id, user_id, event_id)


async def send_verification(driver: CryptoDriver) -> int:
    """Send every waiting verification message, in order; how many were sent.

    A message that fails to send raises (the flow's other side will time out, or the
    caller cancels); the verification state is in memory, so nothing is committed."""
    sent = 0
    for msg in driver.machine.verification.take_outgoing():
        if msg.room_id is not None:
            await _send_room(driver, msg.room_id, msg.type, msg.content)
        else:
            await driver.client.request(msg.request(uuid.uuid4().hex), EmptyResponse)
        sent += 1
    await driver.commit()  # the marks of a flow that just succeeded
    return sent


async def publish_verified(driver: CryptoDriver, status: VerificationStatus) -> bool:
    """Upload the cross-signing signatures of a verified flow; whether there were any."""
    if status.signatures is None:
        return False
    await _publish_signatures(driver, status.signatures)
    await _requery(driver, status.user_id)
    if status.user_id != driver.machine.user_id:
        await _requery(driver, driver.machine.user_id)
    return True
