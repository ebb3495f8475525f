"""`KeyBackup`: which inbound sessions the server-side key backup holds, uploads, restores.

Rules:

- A backup version is used for upload only when its auth data is trusted: we
  hold the private key of its public key, or it carries a valid signature by
  one of our devices we trust (this device, or one cross-signed under a master
  key we trust), or by that master key. Otherwise it is refused, with the
  reason logged, and nothing is uploaded to it.
- Every inbound session is uploaded once per version; again only when we come
  to hold a better copy (an earlier first known index). What the version holds
  is stored (``e2ee_backed_up``) with the changes of the upload's answer, so a
  restart resumes with the sessions not yet acknowledged; a crash between the
  server's answer and that commit resends that one batch, which the server
  stores as the same single copy.
- Uploads go in batches (`next_upload`), one batch out at a time.
- Restoring decrypts each entry with the backup's private key; an entry that
  fails its MAC or does not parse is refused and logged, the rest are imported
  as forwarded sessions (a backup proves nothing about who first sent a key)
  and marked as from the backup, so they are not uploaded back to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gapline.matrix import (
    BackupVersionResponse,
    KeyBackupData,
    Request,
    RoomKeysResponse,
    crypto_api,
)

from ._account import AccountMachine
from ._backup_crypto import BACKUP_ALGORITHM, BackupEntryInvalid, BackupKey, seal_session
from ._canonical import SignatureInvalid, verify_signature
from ._changes import BackedUpRecord, BackupVersionRecord, ChangeBuilder
from ._cross_signing import CrossSigning
from ._devices import DeviceTracker
from ._inbound import InboundGroupSessions, RoomKey
from ._types import MEGOLM, Refusal, RefusalCode, RoomKeyId, TrustLevel
from ._vault import BACKUP_SECRET, SecretVault

__all__ = ["BackupTrust", "BackupUpload", "KeyBackup", "RestoreReport"]

log = logging.getLogger("gapline.e2ee.backup")

UPLOAD_BATCH = 200  # sessions per PUT /room_keys/keys


@dataclass(frozen=True, slots=True)
class BackupTrust:
    version: str
    trusted: bool
    reason: str  # what made it trusted, or why it is not


@dataclass(frozen=True, slots=True)
class BackupUpload:
    """One batch on its way: report it with `KeyBackup.upload_done` or `upload_failed`."""

    version: str
    sessions: tuple[tuple[str, str, int], ...]  # (room, session, first known index uploaded)
    request: Request


@dataclass(frozen=True, slots=True)
class RestoreReport:
    imported: tuple[RoomKeyId, ...]  # new or better sessions: retry their events
    already_known: int
    refusals: tuple[Refusal, ...]  # entries that failed their MAC or the room-key rules


class KeyBackup:
    def __init__(
        self,
        inbound: InboundGroupSessions,
        vault: SecretVault,
        devices: DeviceTracker,
        account: AccountMachine,
        cross_signing: CrossSigning,
    ) -> None:
        self._inbound = inbound
        self._vault = vault
        self._devices = devices
        self._account = account
        self._cross_signing = cross_signing
        self._version: BackupVersionRecord | None = None
        self._backed_up: dict[tuple[str, str], BackedUpRecord] = {}
        self._pending: set[tuple[str, str]] = set()
        self._in_flight: BackupUpload | None = None
        self._restoring = False
        self._dirty_version = False
        self._version_removed = False
        self._dirty: set[tuple[str, str]] = set()
        self._created: dict[str, Any] | None = None
        inbound.on_stored.append(self._session_stored)

    # -- loading and saving ----------------------------------------------------------------

    def load(self, version: BackupVersionRecord | None, rows: Iterable[BackedUpRecord]) -> None:
        self._version = version
        self._backed_up = {(r.room_id, r.session_id): r for r in rows}
        self._recompute()

    def drain(self, out: ChangeBuilder) -> None:
        if self._version_removed:
            out.backup_version_removed = True
        if self._dirty_version and self._version is not None:
            out.add("backup_version", self._version)
        out.add("backed_up", *(self._backed_up[i] for i in sorted(self._dirty)))
        self._dirty_version = self._version_removed = False
        self._dirty.clear()

    @property
    def dirty(self) -> bool:
        return bool(self._dirty_version or self._version_removed or self._dirty)

    # -- state -------------------------------------------------------------------------------

    @property
    def version(self) -> str | None:
        """The version uploads go to (a trusted one), or ``None``."""
        return None if self._version is None else self._version.version

    @property
    def pending(self) -> int:
        """Sessions not yet in the backup (or held better than there)."""
        return len(self._pending)

    def is_backed_up(self, room_id: str, session_id: str) -> bool:
        """Whether the current version holds our copy of the session (as good as ours)."""
        ident = (room_id, session_id)
        return ident in self._backed_up and ident not in self._pending

    @property
    def fetchable_version(self) -> str | None:
        """The version in use when this device holds its private key (so keys can be
        fetched from it on demand), else ``None``."""
        if self._version is None:
            return None
        held = self._vault.get(BACKUP_SECRET)
        public_key = json.loads(self._version.auth_data_json).get("public_key")
        try:
            if held is None or BackupKey(held).public_key != public_key:
                return None
        except ValueError:  # a held secret that is not a key opens nothing
            return None
        return self._version.version

    def is_from_backup(self, room_id: str, session_id: str) -> bool:
        record = self._backed_up.get((room_id, session_id))
        return record is not None and record.restored

    def _needs_upload(self, ident: tuple[str, str]) -> bool:
        index = self._inbound.first_known_index(*ident)
        if self._version is None or index is None:
            return False
        record = self._backed_up.get(ident)
        return (
            record is None
            or record.version != self._version.version
            or index < record.first_known_index
        )

    def _recompute(self) -> None:
        self._pending = {i for i in self._inbound.identifiers() if self._needs_upload(i)}

    def _session_stored(self, ident: tuple[str, str]) -> None:
        if not self._restoring and self._needs_upload(ident):
            self._pending.add(ident)

    # -- versions ----------------------------------------------------------------------------

    def create_version(self, sign_with_master: Callable[[dict], dict] | None = None) -> Request:
        """A new backup key (kept in the vault) and the request creating its version;
        report the answer's version ID with `version_created`."""
        key = BackupKey.generate()
        self._vault.put(BACKUP_SECRET, key.secret)
        auth_data: dict[str, Any] = self._account.sign_json({"public_key": key.public_key})
        if sign_with_master is not None:
            auth_data = sign_with_master(auth_data)
        self._created = auth_data
        return crypto_api.room_keys_version_create(BACKUP_ALGORITHM, auth_data)

    def version_created(self, version: str) -> None:
        if self._created is None:
            raise ValueError("no backup version is being created")
        self._activate(version, self._created)
        self._created = None

    def use_version(self, answer: BackupVersionResponse) -> BackupTrust:
        """The server's current version: used for upload if its auth data is trusted."""
        trusted, reason = self._trust(answer)
        if not trusted:
            log.warning("key backup version %s refused: %s", answer.version, reason)
            if self._version is not None and self._version.version != answer.version:
                self.no_version()  # ours is no longer the server's current version
            return BackupTrust(answer.version, False, reason)
        self._activate(answer.version, answer.auth_data)
        return BackupTrust(answer.version, True, reason)

    def no_version(self) -> None:
        """The server has no backup (any more): stop uploading."""
        if self._version is not None:
            self._version = None
            self._version_removed = True
            self._dirty_version = False
            self._backed_up.clear()
            self._dirty.clear()
            self._pending.clear()
            self._in_flight = None

    def _activate(self, version: str, auth_data: dict[str, Any]) -> None:
        record = BackupVersionRecord(version, BACKUP_ALGORITHM, json.dumps(auth_data))
        if self._version != record:
            if self._version is None or self._version.version != version:
                self._backed_up = {i: r for i, r in self._backed_up.items() if r.version == version}
                self._dirty = {i for i in self._dirty if i in self._backed_up}
                self._in_flight = None
            self._version = record
            self._dirty_version = True
        self._recompute()

    def _trust(self, answer: BackupVersionResponse) -> tuple[bool, str]:
        if answer.algorithm != BACKUP_ALGORITHM:
            return False, f"unsupported algorithm {answer.algorithm!r}"
        public_key = answer.auth_data.get("public_key")
        if not isinstance(public_key, str):
            return False, "the auth data has no public key"
        held = self._vault.get(BACKUP_SECRET)
        if held is not None and BackupKey(held).public_key == public_key:
            return True, "this device holds its private key"
        user = self._account.user_id
        signatures = answer.auth_data.get("signatures", {})
        by_us = signatures.get(user, {}) if isinstance(signatures, dict) else {}
        master = self._cross_signing.trusted_master_key()
        reasons = []
        for key_id in sorted(by_us if isinstance(by_us, dict) else {}):
            name = key_id.removeprefix("ed25519:")
            if master is not None and name == master:
                signer, what = master, "our master key"
            else:
                device = self._devices.get(user, name)
                if device is None or device.deleted:
                    continue
                if self._cross_signing.trust_of(device) not in (
                    TrustLevel.OWN,
                    TrustLevel.VERIFIED,
                ):
                    reasons.append(f"device {name} is not trusted")
                    continue
                signer, what = device.ed25519, f"our trusted device {name}"
            try:
                verify_signature(answer.auth_data, user, key_id, signer)
            except SignatureInvalid as exc:
                reasons.append(str(exc))
                continue
            return True, f"signed by {what}"
        detail = "; ".join(reasons) or "no signature by a trusted device or the master key"
        return False, detail

    # -- upload --------------------------------------------------------------------------------

    def next_upload(self, batch: int = UPLOAD_BATCH) -> BackupUpload | None:
        """The next batch to upload, or ``None`` (nothing pending, or a batch is out)."""
        if self._version is None or self._in_flight is not None or not self._pending:
            return None
        public_key = json.loads(self._version.auth_data_json)["public_key"]
        encryption = BackupKey.encryption_for(public_key)
        rooms: dict[str, dict[str, dict[str, Any]]] = {}
        sessions = []
        for room_id, session_id in sorted(self._pending)[:batch]:
            exported = self._inbound.export(room_id, session_id)
            if exported is None:
                self._pending.discard((room_id, session_id))
                continue
            key, index = exported
            rooms.setdefault(room_id, {})[session_id] = {
                "first_message_index": index,
                "forwarded_count": len(key.forwarding_chain),
                "is_verified": self._verified(key),
                "session_data": seal_session(encryption, _session_json(key)),
            }
            sessions.append((room_id, session_id, index))
        if not sessions:
            return None
        version = self._version.version
        self._in_flight = BackupUpload(
            version, tuple(sessions), crypto_api.room_keys_put(version, rooms)
        )
        return self._in_flight

    def _verified(self, key: RoomKey) -> bool:
        if key.forwarded:
            return False
        device = self._devices.by_curve25519(key.sender_key)
        return device is not None and self._cross_signing.trust_of(device) in (
            TrustLevel.OWN,
            TrustLevel.VERIFIED,
        )

    def upload_done(self, upload: BackupUpload) -> None:
        """The server accepted the batch: those sessions are in the backup."""
        if self._in_flight is upload:
            self._in_flight = None
        if self._version is None or upload.version != self._version.version:
            return
        for room_id, session_id, index in upload.sessions:
            ident = (room_id, session_id)
            self._backed_up[ident] = BackedUpRecord(room_id, session_id, upload.version, index,
                                                    restored=False)  # fmt: skip
            self._dirty.add(ident)
            if not self._needs_upload(ident):
                self._pending.discard(ident)

    def upload_failed(self, upload: BackupUpload) -> None:
        if self._in_flight is upload:
            self._in_flight = None

    # -- restore -------------------------------------------------------------------------------

    def restore(self, version: str, answer: RoomKeysResponse) -> RestoreReport:
        """Import a page of the backup (``GET /room_keys/keys``) with the held private key."""
        return self.restore_entries(version, entries(answer))

    def restore_entries(
        self, version: str, items: Iterable[tuple[str, str, KeyBackupData]]
    ) -> RestoreReport:
        """Import backed-up sessions given as (room, session, entry); see `restore`."""
        held = self._vault.get(BACKUP_SECRET)
        if held is None:
            raise ValueError("no backup key is held: recover it from secret storage first")
        key = BackupKey(held)
        imported: list[RoomKeyId] = []
        refusals: list[Refusal] = []
        known = 0
        self._restoring = True
        try:
            for room_id, session_id, entry in items:
                try:
                    room_key = _room_key(room_id, session_id, key.open(entry.session_data))
                except BackupEntryInvalid as exc:
                    refusal = Refusal(RefusalCode.MALFORMED, f"backup entry {session_id}: {exc}")
                    log.warning("key backup %s: refused %s in %s: %s", version,
                                session_id, room_id, exc)  # fmt: skip
                    refusals.append(refusal)
                    continue
                result = self._inbound.add(room_key)
                if isinstance(result, Refusal):
                    log.warning("key backup %s: refused %s: %s", version, session_id,
                                result.detail)  # fmt: skip
                    refusals.append(result)
                elif not result:
                    known += 1
                else:
                    imported.append(RoomKeyId(room_id, session_id))
                    self._mark_restored(version, room_id, session_id)
        finally:
            self._restoring = False
        return RestoreReport(tuple(imported), known, tuple(refusals))

    def _mark_restored(self, version: str, room_id: str, session_id: str) -> None:
        if self._version is None or self._version.version != version:
            return  # restored from another version: this one still lacks it
        ident = (room_id, session_id)
        index = self._inbound.first_known_index(room_id, session_id)
        assert index is not None
        self._backed_up[ident] = BackedUpRecord(room_id, session_id, version, index, restored=True)
        self._dirty.add(ident)
        self._pending.discard(ident)


def entries(answer: RoomKeysResponse) -> list[tuple[str, str, KeyBackupData]]:
    """A ``GET /room_keys/keys`` answer as (room, session, entry), in a stable order."""
    return [
        (room_id, session_id, entry)
        for room_id, room in sorted(answer.rooms.items())
        for session_id, entry in sorted(room.sessions.items())
    ]


def merge_reports(parts: Iterable[RestoreReport]) -> RestoreReport:
    parts = list(parts)
    return RestoreReport(
        tuple(k for p in parts for k in p.imported),
        sum(p.already_known for p in parts),
        tuple(r for p in parts for r in p.refusals),
    )


def _session_json(key: RoomKey) -> dict[str, Any]:
    return {
        "algorithm": MEGOLM,
        "sender_key": key.sender_key,
        "sender_claimed_keys": {"ed25519": key.signing_key},
        "forwarding_curve25519_key_chain": list(key.forwarding_chain),
        "session_key": key.session_key,
    }


def _room_key(room_id: str, session_id: str, session: dict[str, Any]) -> RoomKey:
    claimed = session.get("sender_claimed_keys")
    ed = claimed.get("ed25519") if isinstance(claimed, dict) else None
    chain = session.get("forwarding_curve25519_key_chain", [])
    sender_key, session_key = session.get("sender_key"), session.get("session_key")
    if session.get("algorithm") != MEGOLM:
        raise BackupEntryInvalid(f"unsupported algorithm {session.get('algorithm')!r}")
    if not (isinstance(sender_key, str) and isinstance(session_key, str) and isinstance(ed, str)):
        raise BackupEntryInvalid("lacks sender_key, session_key or the claimed ed25519 key")
    if not isinstance(chain, list) or not all(isinstance(c, str) for c in chain):
        raise BackupEntryInvalid("the forwarding chain is not a list of keys")
    return RoomKey(room_id, session_id, session_key, sender_key, ed, None, None,
                   forwarded=True, forwarding_chain=tuple(chain))  # fmt: skip
