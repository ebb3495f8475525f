"""Sealing an outgoing room event for an encrypted room, or refusing to send it.

:func:`seal` turns a room and a plaintext event (type and content) into what
is sent: the same event for a room that is not encrypted, else the
``m.room.encrypted`` content, after the room's Megolm session was shared over
Olm with every device of the room's members (one-time keys claimed, Olm
sessions created, the key's to-device messages sent and acknowledged first;
rotation as the room's ``m.room.encryption`` says, or after a member left).

It fails closed: :class:`CannotEncrypt` (with a line a user can read) when the
machine refuses, or when no device of the
room's other members can read the message; never is plaintext sent into a
room the machine knows as encrypted. A room whose encryption the machine has
not seen (a store older than its crypto state) is asked of the server once
(``m.room.encryption`` state) before anything is sent in the clear. A homeserver
error on the way (the key's to-device requests, that state read) propagates as
the ``MatrixError`` it is, so the send queue retries what is transient.

The Megolm index the encryption advanced is committed before :func:`seal`
returns (``also`` writes the caller's own row, e.g. an outbox entry holding the
ciphertext, in that same transaction), so a resend sends the stored ciphertext
and never encrypts twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gapline.e2ee import EncryptionRefused, ShareReport
from gapline.history._cache_store import CacheStore
from gapline.history._crypto import EngineCrypto
from gapline.history._decryption import ENCRYPTED
from gapline.matrix import MatrixClient, NotFound
from gapline.storage import Tx

__all__ = ["CannotEncrypt", "Sealed", "seal"]


class CannotEncrypt(Exception):
    """The event must not be sent: it cannot be encrypted for this encrypted room."""


@dataclass(frozen=True, slots=True)
class Sealed:
    """What to send: ``event_type`` and ``content`` (encrypted when ``report`` is set)."""

    event_type: str
    content: dict[str, Any]
    report: ShareReport | None = None


async def _encrypted(crypto: EngineCrypto, client: MatrixClient, room_id: str) -> bool:
    if crypto.is_encrypted(room_id):
        return True
    if room_id in crypto.checked_plain:
        return False
    try:
        content = await client.get_state(room_id, "m.room.encryption")
    except NotFound:
        crypto.checked_plain.add(room_id)
        return False
    # A MatrixError (the homeserver unreachable, say) propagates: the send queue
    # retries a transient one and fails the row on a refusal; either way nothing
    # went out in the clear.
    assert crypto.driver is not None
    crypto.driver.machine.set_room_encryption(room_id, content)
    return True


async def seal(
    crypto: EngineCrypto | None,
    store: CacheStore,
    client: MatrixClient,
    room_id: str,
    event_type: str,
    content: dict[str, Any],
    *,
    also: Callable[[dict[str, Any], Tx], object] | None = None,
) -> Sealed:
    """The event as it is to be sent into ``room_id``; raises :class:`CannotEncrypt`."""
    if crypto is None or await crypto.ensure() is None:
        return Sealed(event_type, content)
    if not await _encrypted(crypto, client, room_id):
        return Sealed(event_type, content)
    async with crypto.lock:
        return await _share_and_encrypt(crypto, store, room_id, event_type, content, also)


async def _share_and_encrypt(
    crypto: EngineCrypto,
    store: CacheStore,
    room_id: str,
    event_type: str,
    content: dict[str, Any],
    also: Callable[[dict[str, Any], Tx], object] | None,
) -> Sealed:
    driver = crypto.driver
    assert driver is not None
    members = await store.members(room_id)
    joined = [m.user_id for m in members if m.membership == "join"]
    invited = [m.user_id for m in members if m.membership == "invite"]
    me = driver.machine.user_id
    if me not in joined:
        joined.append(me)
    driver.machine.update_tracked_users([*joined, *invited])
    visibility = crypto.visibility.get(room_id, "shared")
    try:
        report = await driver.share_room_key(
            room_id, joined, invited=invited, history_visibility=visibility
        )
    except EncryptionRefused as exc:
        raise CannotEncrypt(f"not sent: {exc}") from exc
    others = [u for u in (*joined, *invited) if u != me]
    readers = [
        pair
        for pair, status in driver.machine.outbound.shared_with(room_id).items()
        if status == "shared"
    ]
    if others and not readers:
        who = ", ".join(sorted(set(report.unreachable_users) | {u for u, _ in report.withheld}))
        raise CannotEncrypt(
            "not sent: this message cannot be encrypted to anyone in the room"
            f" (no device could receive the key{': ' + who if who else ''})"
        )
    try:
        encrypted = await driver.encrypt(room_id, event_type, content, also=also)
    except EncryptionRefused as exc:
        raise CannotEncrypt(f"not sent: {exc}") from exc
    return Sealed(ENCRYPTED, encrypted, report)
