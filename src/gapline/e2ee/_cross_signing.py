"""`CrossSigning`: our master, self-signing and user-signing keys, and the trust they give.

Bootstrap (`bootstrap`, on a user's first device): three new Ed25519 keys;
the self-signing and user-signing keys are signed by the master key, the
master key by this device; the seeds go to the vault (and from there to secret
storage), the public keys to ``/keys/device_signing/upload`` (user-interactive
auth with the account password). Then our devices are signed with the
self-signing key (`sign_device`, `sign_own_device`) and other users' master
keys with the user-signing key (`sign_user`), through ``/keys/signatures/upload``.

Trust (`trust_of`, on top of `DeviceTracker`'s ``CROSS_SIGNED``):

- our master key is trusted when we hold its seed and it is the master key the
  server lists for us (a recovered seed for a replaced key gives no trust);
- another user's master key is trusted when it carries a valid signature by our
  user-signing key, itself signed by our trusted master key;
- a device cross-signed under a trusted master key is ``VERIFIED``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from ._account import AccountMachine
from ._canonical import SignatureInvalid, b64decode, b64encode, signed, verify_signature
from ._devices import DeviceTracker
from ._types import Device, TrustLevel
from ._vault import MASTER_SECRET, SELF_SIGNING_SECRET, USER_SIGNING_SECRET, SecretVault
from ._verified import VerifiedMarks

__all__ = ["CrossSigning", "CrossSigningBootstrap"]

log = logging.getLogger("gapline.e2ee.cross_signing")

_SECRETS = {
    "master": MASTER_SECRET,
    "self_signing": SELF_SIGNING_SECRET,
    "user_signing": USER_SIGNING_SECRET,
}


class _Signer:
    """An Ed25519 key from its 32-byte seed (secret: never logged)."""

    __slots__ = ("_key", "public")

    def __init__(self, seed_b64: str) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(b64decode(seed_b64))
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = b64encode(raw)

    def sign(self, message: bytes) -> str:
        return b64encode(self._key.sign(message))


def _new_seed() -> str:
    key = Ed25519PrivateKey.generate()
    return b64encode(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))


@dataclass(frozen=True, slots=True)
class CrossSigningBootstrap:
    """The ``/keys/device_signing/upload`` body (public keys only) to send."""

    keys: dict[str, dict[str, Any]]  # master_key, self_signing_key, user_signing_key
    master_key: str
    previous: dict[str, str | None] = field(repr=False, default_factory=dict)  # seeds replaced


def _single_key(obj: Any) -> str | None:
    keys = obj.get("keys") if isinstance(obj, dict) else None
    if not isinstance(keys, dict) or len(keys) != 1:
        return None
    ((key_id, key),) = keys.items()
    return key if isinstance(key, str) and key_id == f"ed25519:{key}" else None


class CrossSigning:
    def __init__(self, account: AccountMachine, devices: DeviceTracker, vault: SecretVault) -> None:
        self._account = account
        self._devices = devices
        self._vault = vault
        # Trust answers, valid while neither the cross-signing keys nor the vault change:
        # they are asked for on every decrypted event.
        self._cache_key: tuple[int, int] = (-1, -1)
        self._master: str | None = None
        self._verified: dict[str, bool] = {}
        self.marks: VerifiedMarks | None = None  # interactive verification's marks, if any

    def _fresh(self) -> None:
        key = (self._devices.cross_generation, self._vault.generation)
        if key != self._cache_key:
            self._cache_key = key
            self._master = self._trusted_master_key()
            self._verified = {}

    @property
    def user_id(self) -> str:
        return self._account.user_id

    def _signer(self, usage: str) -> _Signer | None:
        seed = self._vault.get(_SECRETS[usage])
        try:
            return None if seed is None else _Signer(seed)
        except ValueError as exc:
            log.warning("the held %s seed does not open: %s", usage, exc)
            return None

    def _key_object(self, usage: str, public: str) -> dict[str, Any]:
        return {"user_id": self.user_id, "usage": [usage], "keys": {f"ed25519:{public}": public}}

    # -- bootstrap ---------------------------------------------------------------------------

    def bootstrap(self) -> CrossSigningBootstrap:
        """New master, self-signing and user-signing keys (seeds kept in the vault).

        Send `CrossSigningBootstrap.keys` with ``device_signing_upload``; then query our
        own keys again and sign our devices (`sign_own_device`)."""
        seeds = {usage: _new_seed() for usage in _SECRETS}
        signers = {usage: _Signer(seed) for usage, seed in seeds.items()}
        master = signers["master"]
        master_obj = self._account.sign_json(self._key_object("master", master.public))
        keys = {"master_key": master_obj}
        for usage in ("self_signing", "user_signing"):
            obj = self._key_object(usage, signers[usage].public)
            keys[f"{usage}_key"] = signed(obj, self.user_id, f"ed25519:{master.public}",
                                          master.sign)  # fmt: skip
        previous = {name: self._vault.get(name) for name in _SECRETS.values()}
        for usage, seed in seeds.items():
            self._vault.put(_SECRETS[usage], seed)
        return CrossSigningBootstrap(keys, master.public, previous)

    # -- signing ----------------------------------------------------------------------------

    def sign_with_master(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` with our master key's signature added, when we hold a trusted one."""
        signer = self._signer("master")
        if signer is None or self.trusted_master_key() != signer.public:
            return obj
        return signed(obj, self.user_id, f"ed25519:{signer.public}", signer.sign)

    def sign_own_device(self) -> dict[str, dict[str, Any]] | None:
        """The signatures-upload body signing this device with our self-signing key."""
        return self._sign_devices([self._account.device_keys()])

    def sign_device(self, device_id: str) -> dict[str, dict[str, Any]] | None:
        """The signatures-upload body signing another device of ours (after verifying it)."""
        raw = self._devices.raw_device_keys(self.user_id, device_id)
        return None if raw is None else self._sign_devices([raw])

    def _sign_devices(self, objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
        signer = self._signer("self_signing")
        if signer is None:
            return None
        out: dict[str, Any] = {}
        for obj in objects:
            body = {k: v for k, v in obj.items() if k != "unsigned"}
            out[str(obj["device_id"])] = signed(body, self.user_id, f"ed25519:{signer.public}",
                                                signer.sign)  # fmt: skip
        return {self.user_id: out}

    def sign_user(self, user_id: str) -> dict[str, dict[str, Any]] | None:
        """The signatures-upload body signing ``user_id``'s master key with our user-signing
        key (after verifying them); ``None`` without their master key or our key."""
        signer = self._signer("user_signing")
        master = self._devices.cross_signing_keys(user_id).get("master")
        key = _single_key(master)
        if signer is None or master is None or key is None:
            return None
        body = {k: v for k, v in master.items() if k != "unsigned"}
        return {user_id: {key: signed(body, self.user_id, f"ed25519:{signer.public}", signer.sign)}}

    # -- trust -----------------------------------------------------------------------------

    def trusted_master_key(self) -> str | None:
        """Our master public key if we hold its seed and the server lists it for us."""
        self._fresh()
        return self._master

    def _trusted_master_key(self) -> str | None:
        signer = self._signer("master")
        if signer is None:
            return None
        listed = _single_key(self._devices.cross_signing_keys(self.user_id).get("master"))
        if listed != signer.public:
            if listed is not None:
                log.warning("the held master seed is not our listed master key %s", listed)
            return None
        return signer.public

    def undo(self, boot: CrossSigningBootstrap) -> None:
        """Hold again the seeds ``boot`` replaced (the server did not accept it)."""
        for name, seed in boot.previous.items():
            if seed is None:
                self._vault.remove(name)
            else:
                self._vault.put(name, seed)

    def user_verified(self, user_id: str) -> bool:
        """Whether ``user_id``'s master key is trusted (ours, or signed by our user-signing key)."""
        self._fresh()
        known = self._verified.get(user_id)
        if known is None:
            known = self._verified[user_id] = self._user_verified(user_id)
        return known

    def _user_verified(self, user_id: str) -> bool:
        ours = self._master
        if ours is None:
            return False
        if user_id == self.user_id:
            return _single_key(self._devices.cross_signing_keys(user_id).get("master")) == ours
        usk = self._devices.cross_signing_keys(self.user_id).get("user_signing")
        usk_key = _single_key(usk)
        master = self._devices.cross_signing_keys(user_id).get("master")
        if usk is None or usk_key is None or master is None:
            return False
        try:
            verify_signature(usk, self.user_id, f"ed25519:{ours}", ours)
            verify_signature(master, self.user_id, f"ed25519:{usk_key}", usk_key)
        except SignatureInvalid:
            return False
        return True

    def trust_of(self, device: Device) -> TrustLevel:
        if device.trust is TrustLevel.CROSS_SIGNED and self.user_verified(device.user_id):
            return TrustLevel.VERIFIED
        marks = self.marks
        if marks is not None and device.trust is not TrustLevel.OWN:
            if marks.device_verified(device):
                return TrustLevel.VERIFIED
            master = _single_key(self._devices.cross_signing_keys(device.user_id).get("master"))
            if device.trust is TrustLevel.CROSS_SIGNED and marks.master_verified(
                device.user_id, master
            ):
                return TrustLevel.VERIFIED
        return device.trust
