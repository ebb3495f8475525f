"""End-to-end encryption for the bot, its state in the journal's own database.

:class:`BotCrypto` runs one `gapline.e2ee.CryptoDriver` whose rows live beside the
journal (same backend), so each crypto step commits in the transaction of what caused
it: a sync's to-device events, Olm state and room keys with that sync's token
(ingress); an answer's Megolm ratchet step with the outbox row that holds its
ciphertext (:meth:`BotCrypto.seal`). The store key comes from the bot's passphrase
through the journal database's wrapped key (``gapline.storage.open_cipher``): a wrong
passphrase fails before any pickle is tried, a damaged pickle fails the open, and
nothing is loaded in either case.

One step at a time: every caller that changes the machine holds :attr:`BotCrypto.lock`
from the change until its commit. Without it, one caller's commit would save another's
half-done step (an Olm ratchet advanced by a to-device batch whose sync token is not
saved yet), and a later save of the older step would write an Olm session back out of
step with its peer.

Fail closed: a room is encrypted when the machine knows its ``m.room.encryption`` or
the homeserver says so; nothing is sent into it in the clear (`EncryptionUnavailable`),
with or without a crypto store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from gapline.e2ee import (
    BACKUP_SECRET,
    SELF_SIGNING_SECRET,
    CryptoDriver,
    DecryptedEvent,
    EncryptionRefused,
    KeyUpdates,
    RoomKeyId,
    SendResult,
    ShareReport,
    ShareState,
    UnableToDecrypt,
    enable_backup,
    open_machine,
    recover_from_server,
    restore_backup,
    sign_own_device,
    upload_backup,
)
from gapline.journal._audience import (
    AudienceChange,
    RoomMembers,
    audience_changes,
    load_audience,
    record_audience,
    room_members,
    store_audience,
)
from gapline.journal._faults import CryptoFaultPoint, fault_point
from gapline.journal._outbox import ENCRYPTED_EVENT_TYPE, seal_delivery
from gapline.journal._sealing import Sealing, sealing_of
from gapline.journal._types import Delivery, InboundEvent, JournalError
from gapline.matrix import (
    ClientEvent,
    Direction,
    MatrixClient,
    MatrixError,
    MessagesResponse,
    NotFound,
    RelationsResponse,
    SyncResponse,
)
from gapline.storage import Backend, StorageError, Tx, open_cipher

__all__ = [
    "STORE_KEY_LABEL",
    "BotCrypto",
    "DecryptingSource",
    "EncryptingTransport",
    "EncryptionStoreTaken",
    "EncryptionUnavailable",
    "RoomEncryption",
    "as_client_event",
    "decrypted_view",
    "room_members",
    "session_of",
]

log = logging.getLogger("gapline.journal.crypto")

STORE_KEY_LABEL = "gapline/journal/e2ee-store-key/v1"
"""The e2ee store key is the journal cipher's keyed hash (HMAC-SHA256 under a subkey of
the passphrase-wrapped store key) of this label: a 32-byte key only the passphrase
reaches, derived without touching the storage layer's key material directly."""


class EncryptionUnavailable(JournalError):
    """Fail closed: the room is encrypted and this event cannot be encrypted for it now."""


class EncryptionStoreTaken(JournalError):
    """The database's encrypted device is another principal's: one device per database."""


async def require_device_owner(backend: Backend, user_id: str) -> None:
    """Raise `EncryptionStoreTaken` when the database's end-to-end encryption state
    belongs to another user. Checked before anything is written (the device id, the
    cipher's key): a second principal must never adopt, or overwrite, the Olm account of
    the first, whose keys its homeserver already publishes."""
    try:
        row = await backend.read(
            lambda tx: tx.one("SELECT user_id, device_id FROM e2ee_account WHERE id = 1")
        )
    except StorageError:
        return  # no encryption state in this database yet
    if row is not None and row[0] != user_id:
        raise EncryptionStoreTaken(
            f"this journal's end-to-end encryption device is {row[0]}'s ({row[1]}): one "
            f"encrypted device per database, so {user_id} needs a --store of its own "
            "(or no passphrase here)"
        )


def decrypted_view(event: ClientEvent, result: DecryptedEvent) -> ClientEvent:
    """The event as its sender wrote it: the decrypted type and content. ``m.relates_to``
    rides in the clear beside the ciphertext (so servers can aggregate) and is kept."""
    content = dict(result.content)
    relates = event.content.get("m.relates_to")
    if relates is not None and "m.relates_to" not in content:
        content["m.relates_to"] = relates
    return msgspec.structs.replace(event, type=result.type, content=content)


def as_client_event(event: InboundEvent) -> ClientEvent:
    """A retained decryption failure back as the ``m.room.encrypted`` event it was."""
    raw = event.content.encode() if isinstance(event.content, str) else event.content
    content = msgspec.json.decode(raw) if raw else {}
    return ClientEvent(
        event_id=event.event_id,
        type=event.type,
        sender=event.sender,
        origin_server_ts=event.origin_server_ts,
        content=content if isinstance(content, dict) else {},
        room_id=event.room_id,
    )


def session_of(event: InboundEvent) -> str | None:
    """The Megolm session a retained ciphertext names (None when it names none)."""
    session = as_client_event(event).content.get("session_id")
    return session if isinstance(session, str) else None


def is_encrypted_event(event: ClientEvent) -> bool:
    return event.type == ENCRYPTED_EVENT_TYPE and event.state_key is None


class _StateSource(Protocol):
    async def get_state(
        self, room_id: str, event_type: str, state_key: str = ""
    ) -> dict[str, Any]: ...


class RoomEncryption:
    """Which rooms are encrypted, for a bot without a crypto store: what sync showed,
    else what the homeserver says (asked once per room). Only for refusing to send."""

    def __init__(self, client: _StateSource) -> None:
        self._client = client
        self._encrypted: set[str] = set()
        self._plain: set[str] = set()

    def observe(self, room_id: str, events: Sequence[ClientEvent]) -> None:
        if any(e.type == "m.room.encryption" and e.state_key == "" for e in events):
            self._encrypted.add(room_id)
            self._plain.discard(room_id)

    async def is_encrypted(self, room_id: str) -> bool:
        if room_id in self._encrypted:
            return True
        if room_id in self._plain:
            return False
        content = await _server_encryption(self._client, room_id)
        (self._plain if content is None else self._encrypted).add(room_id)
        return content is not None

    async def seal(self, delivery: Delivery) -> Delivery:
        if await self.is_encrypted(delivery.room_id):
            raise _no_store(delivery.room_id)
        return delivery


def _no_store(room_id: str) -> EncryptionUnavailable:
    return EncryptionUnavailable(
        f"{room_id} is encrypted and this bot has no encryption store: nothing is sent "
        "in the clear (start it with --passphrase-file FILE or $GAPLINE_PASSPHRASE)"
    )


async def _server_encryption(client: _StateSource, room_id: str) -> dict[str, Any] | None:
    try:
        content = await client.get_state(room_id, "m.room.encryption")
    except NotFound:
        return None
    return content if content else None


class BotCrypto:
    """The bot device's crypto machine on the journal's backend (see the module doc)."""

    def __init__(
        self,
        driver: CryptoDriver,
        client: MatrixClient,
        principal_id: str,
        sealing: Sealing | None = None,
        backend: Backend | None = None,
    ) -> None:
        self._driver = driver
        self._client = client
        self._p = principal_id
        # Where each encrypted room's audience is kept (`_audience`); None: asked of the
        # homeserver before every send.
        self._backend = backend
        self.lock = asyncio.Lock()
        # Rooms the homeserver said are not encrypted: asked once. Safe to keep, because
        # an m.room.encryption arriving later reaches the machine, which is asked first.
        self._plain: set[str] = set()
        # What the journal seals its contents with (what the bot decrypts stays sealed).
        self.sealing = sealing or Sealing()

    @classmethod
    async def open(
        cls,
        backend: Backend,
        client: MatrixClient,
        passphrase: str,
        *,
        user_id: str,
        device_id: str,
    ) -> BotCrypto:
        """Unwrap the store key with ``passphrase`` and load (or create) the device's
        machine. Raises `gapline.storage.WrongPassphrase`, `gapline.e2ee.WrongStoreKey`,
        `gapline.e2ee.CorruptCryptoStore` or `gapline.e2ee.CryptoStoreError` (the state
        belongs to another device); nothing is loaded then."""
        cipher = await open_cipher(backend, passphrase)
        store_key = cipher.lookup_key(STORE_KEY_LABEL)
        machine = await open_machine(backend, store_key, user_id=user_id, device_id=device_id)
        sealing = sealing_of(cipher)
        driver = CryptoDriver(backend, client, store_key, machine)
        return cls(driver, client, user_id, sealing, backend)

    @property
    def machine(self) -> Any:
        return self._driver.machine

    @property
    def identity_keys(self) -> dict[str, str]:
        return self._driver.machine.identity_keys

    # -- steps a caller runs under the lock --------------------------------------------------

    def receive(self, response: SyncResponse, *, initial: bool) -> KeyUpdates:
        """Room state first (encryption settings, members), then sync's to-device
        events, device lists and key counts. The caller commits with the sync token."""
        machine = self._driver.machine
        for room_id, room in response.rooms.join.items():
            self.observe(room_id, [*room.state.events, *room.timeline.events])
        return machine.receive_sync(response, initial=initial)

    def audience(self, response: SyncResponse, *, initial: bool) -> Callable[[Tx], None]:
        """The write of this sync's audience changes, for the commit of its sync token:
        the stored audience is always the one the stored token stands for."""
        changes: tuple[AudienceChange, ...] = audience_changes(
            response, principal_id=self._p, initial=initial
        )
        return lambda tx: record_audience(tx, self._p, changes)

    async def _audience(self, room_id: str) -> RoomMembers:
        """Who gets the room key: the stored audience, else the room's whole state asked
        of the homeserver once (and stored, so the next send asks nothing)."""
        backend = self._backend
        if backend is not None:
            stored = await backend.read(lambda tx: load_audience(tx, self._p, room_id))
            if stored is not None:
                return stored
        log.info("room audience asked of the homeserver", extra={"room_id": room_id})
        members = room_members(await self._client.room_state(room_id))
        if backend is not None:
            await backend.write(lambda tx: store_audience(tx, self._p, room_id, members))
        return members

    def observe(self, room_id: str, events: Sequence[ClientEvent]) -> None:
        machine = self._driver.machine
        members: set[str] = set()
        for event in events:
            if event.type == "m.room.encryption" and event.state_key == "":
                machine.set_room_encryption(room_id, event.content)
            elif event.type == "m.room.member" and event.state_key is not None:
                if event.content.get("membership") in ("join", "invite"):
                    members.add(event.state_key)
                else:
                    members.discard(event.state_key)
                    machine.room_member_left(room_id, event.state_key)
        if members and machine.is_room_encrypted(room_id):
            machine.update_tracked_users(members)

    async def decrypt(
        self, room_id: str, events: Sequence[ClientEvent]
    ) -> list[DecryptedEvent | UnableToDecrypt]:
        return await self._driver.decrypt_room_events(room_id, events)

    async def commit(self, also: Callable[[Tx], Any] | None = None) -> None:
        await self._driver.commit(also)

    async def send_outgoing(self) -> KeyUpdates:
        """Send what the machine queued (keys upload/query/claim, to-device); a failed
        request is built again at the next step."""
        return (await self._send()).updates

    async def back_up(self) -> int:
        """Upload the sessions the trusted backup version lacks (after a sync step that
        stored keys); how many went up. A failure is logged and the sessions stay pending
        for the next step: the sync is never held up by the backup."""
        backup = self._driver.machine.backup
        if backup.version is None or not backup.pending:
            return 0
        try:
            return await upload_backup(self._driver)
        except (MatrixError, StorageError) as exc:
            log.warning("key backup upload failed", extra={"error": str(exc)})
            return 0

    async def _send(self) -> SendResult:
        result = await self._driver.send_outgoing()
        for kind, exc in result.failed:
            log.warning("e2ee request failed", extra={"request": kind.value, "error": str(exc)})
        for refusal in result.updates.refusals:
            log.warning(
                "e2ee input refused",
                extra={
                    "code": refusal.code.value,
                    "sender": refusal.sender,
                    "detail": refusal.detail,
                },
            )
        return result

    # -- self-contained steps (they take the lock) -------------------------------------------

    async def recover(self, recovery_key: str) -> tuple[RoomKeyId, ...]:
        """Recover the account's secrets with its recovery key, sign this device, take up
        the key backup and restore it; the sessions restored (heal their retained events).

        A wrong key (`WrongRecoveryKey`, `RecoveryKeyInvalid`) changes nothing."""
        driver = self._driver
        async with self.lock:
            names = await recover_from_server(driver, recovery_key=recovery_key)
            if SELF_SIGNING_SECRET in names:
                await sign_own_device(driver)
            if BACKUP_SECRET not in names:
                log.warning("secret storage holds no backup key: nothing to restore")
                return ()
            trust = await enable_backup(driver, create=False)
            if trust is None:
                log.warning("the account has no key backup: nothing to restore")
                return ()
            report = await restore_backup(driver, version=trust.version)
        for refusal in report.refusals:
            log.warning("backup entry refused", extra={"detail": refusal.detail})
        log.info(
            "keys restored from the backup",
            extra={"version": trust.version, "sessions": len(report.imported)},
        )
        return report.imported

    async def publish(self) -> None:
        """Upload the device's keys (a new device) and anything queued by a previous run."""
        async with self.lock:
            await self.send_outgoing()

    async def decrypt_page(self, room_id: str, events: Sequence[ClientEvent]) -> list[ClientEvent]:
        """Hydration and refetch pages: each decryptable event as its sender wrote it
        (replay-index rows committed before the page is projected); an undecryptable one
        stays ``m.room.encrypted`` (never projected)."""
        encrypted = [e for e in events if is_encrypted_event(e)]
        if not encrypted:
            return list(events)
        async with self.lock:
            results = await self.decrypt(room_id, encrypted)
            await self.commit()
        plain = {r.event_id: r for r in results if isinstance(r, DecryptedEvent)}
        return [decrypted_view(e, plain[e.event_id]) if e.event_id in plain else e for e in events]

    async def _encrypted_locked(self, room_id: str) -> bool:
        machine = self._driver.machine
        if machine.is_room_encrypted(room_id):
            return True
        if room_id in self._plain:
            return False
        content = await _server_encryption(self._client, room_id)
        if content is None:
            self._plain.add(room_id)
            return False
        machine.set_room_encryption(room_id, content)
        await self.commit()
        return True

    async def _encrypt_locked(
        self,
        room_id: str,
        event_type: str,
        content: dict[str, Any],
        also: Callable[[dict[str, Any], Tx], Any] | None = None,
    ) -> dict[str, Any]:
        members = await self._audience(room_id)
        try:
            report = await self._share(room_id, members)
            if report.rotated or report.shared_with or report.withheld:
                log.info(
                    "room key shared",
                    extra={
                        "room_id": room_id,
                        "session_id": report.session_id,
                        "devices": len(report.shared_with),
                        "withheld": len(report.withheld),
                        "unreachable": list(report.unreachable_users),
                    },
                )
            return await self._driver.encrypt(room_id, event_type, content, also=also)
        except EncryptionRefused as exc:
            raise EncryptionUnavailable(f"nothing sent in the clear: {exc}") from exc

    async def _share(self, room_id: str, members: RoomMembers) -> ShareReport:
        """`CryptoMachine.share_room_key` driven to READY: query, claim, then the new key's
        to-device messages, committed (queued) before any is sent."""
        machine = self._driver.machine
        for _ in range(6):
            report = machine.share_room_key(
                room_id,
                members.joined,
                invited=members.invited,
                history_visibility=members.history_visibility,
            )
            if report.state is ShareState.READY:
                await self.commit()
                if report.shared_with or report.withheld:
                    fault_point(CryptoFaultPoint.AFTER_KEY_SHARE_BEFORE_TO_DEVICE)
            result = await self._send()
            if report.state is ShareState.READY:
                if result.failed:
                    raise result.failed[0][1]
                return report
            machine = self._driver.machine
        raise MatrixError(f"sharing the room key of {room_id} did not settle")

    async def seal(self, delivery: Delivery) -> Delivery:
        """The delivery to send: unchanged for a plaintext room or a row sealed already;
        else encrypted once, its ciphertext stored in the row in the transaction that
        saves the ratchet step (a resend sends that ciphertext)."""
        if delivery.event_type == ENCRYPTED_EVENT_TYPE:
            return delivery
        async with self.lock:
            if not await self._encrypted_locked(delivery.room_id):
                return delivery
            stored: list[bytes] = []

            def write(encrypted: dict[str, Any], tx: Tx) -> None:
                body = msgspec.json.encode(encrypted)
                if not seal_delivery(tx, self._p, delivery, body):
                    raise JournalError(f"delivery {delivery.txn_id} changed while it was sealed")
                stored.append(body)

            await self._encrypt_locked(
                delivery.room_id, delivery.event_type, msgspec.json.decode(delivery.content), write
            )
            fault_point(CryptoFaultPoint.AFTER_SEAL_BEFORE_SEND)
        return dataclasses.replace(delivery, event_type=ENCRYPTED_EVENT_TYPE, content=stored[0])

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str | None = None,
    ) -> str:
        """A direct send (progress edits): encrypted when the room is, else as is."""
        async with self.lock:
            if await self._encrypted_locked(room_id):
                content = await self._encrypt_locked(room_id, event_type, dict(content))
                event_type = ENCRYPTED_EVENT_TYPE
        return await self._client.send_event(room_id, event_type, content, txn_id=txn_id)

    async def is_encrypted(self, room_id: str) -> bool:
        async with self.lock:
            return await self._encrypted_locked(room_id)


class _Guard(Protocol):
    async def is_encrypted(self, room_id: str) -> bool: ...


class EncryptingTransport:
    """The turn runner's direct sends: through `BotCrypto` (encrypted where the room is),
    or, without a crypto store, refused in an encrypted room (fail closed)."""

    def __init__(self, client: MatrixClient, crypto: BotCrypto | None, guard: _Guard) -> None:
        self._client = client
        self._crypto = crypto
        self._guard = guard

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str | None = None,
    ) -> str:
        if self._crypto is not None:
            return await self._crypto.send_event(room_id, event_type, content, txn_id)
        if await self._guard.is_encrypted(room_id):
            raise MatrixError(str(_no_store(room_id)))
        return await self._client.send_event(room_id, event_type, content, txn_id=txn_id)

    async def upload(
        self,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        filename: str | None = None,
    ) -> str:
        return await self._client.upload(data, content_type=content_type, filename=filename)

    async def encrypt_media(self, room_id: str) -> bool:
        """An encrypted room's attachments are encrypted before they are uploaded."""
        return await self._guard.is_encrypted(room_id)


class DecryptingSource:
    """What hydration and the point refetch read through: the client, with every page's
    encrypted events decrypted (`BotCrypto.decrypt_page`) before they are projected."""

    def __init__(self, client: MatrixClient, crypto: BotCrypto) -> None:
        self._client = client
        self._crypto = crypto

    async def messages(
        self,
        room_id: str,
        *,
        from_: str | None = None,
        to: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        limit: int | None = None,
        filter: str | Mapping[str, Any] | None = None,
    ) -> MessagesResponse:
        page = await self._client.messages(
            room_id, from_=from_, to=to, dir=dir, limit=limit, filter=filter
        )
        return msgspec.structs.replace(
            page, chunk=await self._crypto.decrypt_page(room_id, page.chunk)
        )

    async def relations(
        self,
        room_id: str,
        event_id: str,
        *,
        rel_type: str | None = None,
        event_type: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        from_: str | None = None,
        to: str | None = None,
        limit: int | None = None,
        recurse: bool | None = None,
    ) -> RelationsResponse:
        page = await self._client.relations(
            room_id,
            event_id,
            rel_type=rel_type,
            event_type=event_type,
            dir=dir,
            from_=from_,
            to=to,
            limit=limit,
            recurse=recurse,
        )
        return msgspec.structs.replace(
            page, chunk=await self._crypto.decrypt_page(room_id, page.chunk)
        )

    async def get_event(self, room_id: str, event_id: str) -> ClientEvent:
        event = await self._client.get_event(room_id, event_id)
        return (await self._crypto.decrypt_page(room_id, [event]))[0]

    async def download(self, mxc_uri: str) -> bytes:
        return await self._client.download(mxc_uri)
