"""The engine's end-to-end encryption: one `gapline.e2ee` machine where every event enters.

:class:`EngineCrypto` holds the account's :class:`~gapline.e2ee.CryptoDriver`
(opened once the client is logged in, on the cache's own backend, with a key
derived from the cache's store key) and does for the engine what the machine
leaves to its caller:

- room state is fed to the machine as it arrives (``m.room.encryption``, from
  the state block or the timeline, any time; members of encrypted rooms are
  tracked, a leave retires the outbound session; history visibility is kept
  for key sharing);
- a sync's to-device events, device lists and key counts go in before its
  timeline is decrypted, so keys carried by a sync decrypt that sync's events;
- every ``m.room.encrypted`` event is decrypted on the event loop in batches
  (vodozemac holds the GIL, so a thread would not free the loop; batches of
  64 keep a stall under ~5 ms) and handed to the cache as
  :func:`~gapline.history._decryption.as_cached` makes it;
- the room keys it stores go up to the account's key backup after the step (when
  a trusted backup version is in use), so a new device can recover them;
- the machine's changes are taken for the caller to save **in the write of
  what caused them** (the sync token, a page), and the keys that arrived name
  the sessions whose retained events heal (``_heal_pass``).

A failed write leaves the machine ahead of the store: :meth:`reopen` reloads
it from what is durable. :attr:`lock` keeps a sync step, a key share and the
sending of requests from interleaving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

import msgspec

from gapline.e2ee import (
    BACKUP_SECRET,
    SELF_SIGNING_SECRET,
    Changes,
    CryptoDriver,
    DecryptWorkers,
    KeyUpdates,
    RestoreReport,
    enable_backup,
    merge_updates,
    recover_from_server,
    restore_backup,
    sign_own_device,
    upload_backup,
)
from gapline.history._cache_store import CacheStore
from gapline.history._decryption import ENCRYPTED, as_cached, unmarked
from gapline.history._healing import UTD_MIGRATIONS, UTD_SCHEMA, index_unmarked
from gapline.matrix import ClientEvent, MatrixClient, MatrixError, SyncResponse
from gapline.storage import StorageError

__all__ = ["EngineCrypto"]

log = logging.getLogger("gapline.history")

STORE_KEY_LABEL = "gapline/history/e2ee-store-key/v1"
BATCH = 64


class EngineCrypto:
    """One account's crypto machine, wired to its event cache (see the module doc)."""

    def __init__(self, store: CacheStore, client: MatrixClient) -> None:
        self._store = store
        self._client = client
        # 32 bytes derived from the cache's store key: the machine's pickles open only
        # with the passphrase that opens the cache.
        self._store_key = store.cipher.lookup_key(STORE_KEY_LABEL)
        self.driver: CryptoDriver | None = None
        self._opening = asyncio.Lock()
        # The worker process a large heal decrypts in (`_heal_pass`): started at the
        # first, kept until `close`.
        self.decrypt_workers = DecryptWorkers()
        self.lock = asyncio.Lock()
        """Held by each step that takes the machine's changes to commit them with their
        cause (a sync), or sends its requests (key sharing, uploads): two such steps
        interleaved would send one request twice, or commit a sync's Olm state without
        its token."""
        self.visibility: dict[str, str] = {}
        """Each room's ``m.room.history_visibility`` seen in this process (sharing)."""
        self.checked_plain: set[str] = set()
        """Rooms the server said carry no ``m.room.encryption`` (asked before a send)."""
        self.members: dict[str, set[str]] = {}
        """Joined and invited members of encrypted rooms seen in this process."""

    async def ensure(self) -> CryptoDriver | None:
        """The driver, opened on first use once the client is logged in (``None`` before).

        Never call it while holding :attr:`lock`: the first open sends the device's keys
        under that lock, and an asyncio lock is not re-entrant."""
        if self.driver is not None:
            return self.driver
        client = self._client
        if client.user_id is None or client.device_id is None:
            return None
        async with self._opening:  # a sync and a page load may both open it first
            if self.driver is None:
                backend = self._store.backend
                await backend.migrate(UTD_SCHEMA, UTD_MIGRATIONS)
                await index_unmarked(self._store)
                self.driver = await CryptoDriver.open(backend, client, self._store_key)
                await self.send_outgoing()  # device keys and one-time keys, when new
        return self.driver

    async def close(self) -> None:
        """Stop what runs beside the engine for the crypto (the decrypt worker)."""
        await self.decrypt_workers.aclose()

    @property
    def ready(self) -> bool:
        return self.driver is not None

    async def reopen(self) -> None:
        """Reload the machine from the store (a write of its changes failed)."""
        if self.driver is not None:
            self.driver = await CryptoDriver.open(
                self._store.backend, self._client, self._store_key
            )

    def is_encrypted(self, room_id: str) -> bool:
        return self.driver is not None and self.driver.machine.is_room_encrypted(room_id)

    def take_changes(self) -> Changes | None:
        """The machine's changes, for the caller's write (``None``: nothing changed)."""
        machine = None if self.driver is None else self.driver.machine
        if machine is None or not machine.has_unsaved_changes:
            return None
        return machine.take_changes()

    # -- room state ------------------------------------------------------------------------

    def observe(self, room_id: str, events: Iterable[ClientEvent]) -> None:
        """Room state as it arrives (state block or timeline, in order)."""
        assert self.driver is not None
        machine = self.driver.machine
        for event in events:
            if event.state_key is None:
                continue
            if event.type == "m.room.encryption" and event.state_key == "":
                machine.set_room_encryption(room_id, event.content)
                self.checked_plain.discard(room_id)
                if room_id not in self.members:
                    self.members[room_id] = set()
            elif event.type == "m.room.history_visibility" and event.state_key == "":
                value = event.content.get("history_visibility")
                if isinstance(value, str):
                    self.visibility[room_id] = value
            elif event.type == "m.room.member":
                present = event.content.get("membership") in ("join", "invite")
                members = self.members.setdefault(room_id, set())
                if present:
                    members.add(event.state_key)
                else:  # left, kicked or banned: whoever had our session must not get the next
                    members.discard(event.state_key)
                    machine.room_member_left(room_id, event.state_key)
        if machine.is_room_encrypted(room_id):
            machine.update_tracked_users(self.members.get(room_id, ()))

    # -- decryption ------------------------------------------------------------------------

    async def decrypt(self, room_id: str, events: Sequence[ClientEvent]) -> list[ClientEvent]:
        """The events as the cache keeps them: each encrypted one decrypted or marked
        undecryptable, every other one as it came (with any forged mark dropped)."""
        out = [unmarked(e) for e in events]
        todo = [
            i
            for i, e in enumerate(out)
            if e.type == ENCRYPTED and e.state_key is None and e.redacted_because is None
        ]
        if not todo or self.driver is None:
            return out
        results = await self.driver.decrypt_room_events(
            room_id, [out[i] for i in todo], batch=BATCH
        )
        for i, result in zip(todo, results, strict=True):
            out[i] = as_cached(out[i], result)
        return out

    async def prepare_sync(
        self, response: SyncResponse, *, initial: bool
    ) -> tuple[SyncResponse, KeyUpdates]:
        """Feed one sync to the machine (state, then to-device and device lists), and the
        sync with its timelines as the cache keeps them."""
        assert self.driver is not None
        rooms = dict(response.rooms.join)
        for room_id, joined in rooms.items():
            self.observe(room_id, [*joined.state.events, *joined.timeline.events])
        updates = self.driver.machine.receive_sync(response, initial=initial)
        for room_id, joined in rooms.items():
            events = await self.decrypt(room_id, joined.timeline.events)
            if any(a is not b for a, b in zip(events, joined.timeline.events, strict=True)):
                timeline = msgspec.structs.replace(joined.timeline, events=events)
                rooms[room_id] = msgspec.structs.replace(joined, timeline=timeline)
        new_rooms = msgspec.structs.replace(response.rooms, join=rooms)
        return msgspec.structs.replace(response, rooms=new_rooms), updates

    async def send_outgoing(self) -> KeyUpdates:
        """Send what the machine queued (key upload, queries, claims, to-device); what
        the answers delivered (keys: heal their sessions)."""
        machine = None if self.driver is None else self.driver.machine
        if machine is None or (not machine.has_unsaved_changes and not machine.outgoing_requests()):
            return KeyUpdates()
        assert self.driver is not None
        try:
            async with self.lock:
                result = await self.driver.send_outgoing()
        except MatrixError as exc:
            log.warning("end-to-end encryption requests failed: %s", exc)
            return KeyUpdates()
        for kind, exc in result.failed:
            log.warning("end-to-end encryption request %s failed: %s", kind.value, exc)
        return result.updates

    async def recover(self, recovery_key: str, *, restore: bool = True) -> RestoreReport:
        """Recover the account's secrets with the recovery key, sign this device with
        the recovered self-signing key, take up the backup and (``restore``) restore all
        its keys; the caller heals the retained events of ``imported``. Without
        ``restore`` nothing is imported here: the keys are fetched as rooms show them.

        Raises `WrongRecoveryKey` / `RecoveryKeyInvalid` / `SecretStorageError` before
        anything is changed or saved; `MatrixError` when the server cannot be asked."""
        driver = await self.ensure()
        if driver is None:
            raise RuntimeError("recovery needs a logged-in client")
        async with self.lock:
            names = await recover_from_server(driver, recovery_key=recovery_key)
            log.info("recovered from secret storage: %s", ", ".join(names) or "nothing")
            if SELF_SIGNING_SECRET in names:
                await sign_own_device(driver)
            if BACKUP_SECRET not in names:
                log.warning("secret storage holds no backup key: no keys to restore")
                return RestoreReport((), 0, ())
            trust = await enable_backup(driver, create=False)
            if trust is None:
                log.warning("the account has no key backup: no keys to restore")
                return RestoreReport((), 0, ())
            if not restore:
                log.info(
                    "took up backup version %s: its keys are restored as rooms show them",
                    trust.version,
                )
                return RestoreReport((), 0, ())
            report = await restore_backup(driver, version=trust.version)
        for refusal in report.refusals:
            log.warning("backup entry refused: %s", refusal.detail)
        log.info(
            "restored %d sessions from backup version %s (%d already known)",
            len(report.imported),
            trust.version,
            report.already_known,
        )
        return report

    async def back_up(self) -> int:
        """Upload the sessions the trusted backup version lacks; how many went up.

        Called after each sync step. Never raises for the network or the store: a failed
        batch is logged and stays pending (the machine keeps what was acknowledged), so
        the next step resumes where this one stopped and a sync is never held up by it."""
        driver = self.driver
        if driver is None:
            return 0
        backup = driver.machine.backup
        if backup.version is None or not backup.pending:
            return 0
        try:
            async with self.lock:
                return await upload_backup(driver)
        except (MatrixError, StorageError) as exc:
            log.warning("key backup upload failed (retried after the next sync): %s", exc)
            return 0

    @staticmethod
    def merge(*updates: KeyUpdates) -> KeyUpdates:
        return merge_updates(*updates)
