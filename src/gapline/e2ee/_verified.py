"""`VerifiedMarks`: devices and master keys this device verified interactively (SAS).

A mark names the key that was checked (a device's Ed25519 key, a user's master
key), so it stops counting the moment that key changes. Cross-signing makes the
same fact visible to the user's other devices; the mark also covers a user who
has no cross-signing keys. The marks are kept as one sealed row of the vault,
under a name that is not a secret-storage name, so they never leave this device.
"""

from __future__ import annotations

import json

from ._types import Device
from ._vault import SecretVault

__all__ = ["VERIFIED_MARKS", "VerifiedMarks"]

VERIFIED_MARKS = "gapline.verified_marks"


class VerifiedMarks:
    def __init__(self, vault: SecretVault) -> None:
        self._vault = vault
        self._generation = -1
        self._devices: dict[str, dict[str, str]] = {}
        self._masters: dict[str, str] = {}

    def _fresh(self) -> None:
        if self._generation == self._vault.generation:
            return
        text = self._vault.get(VERIFIED_MARKS)
        data = json.loads(text) if text else {}
        self._devices = data.get("devices", {})
        self._masters = data.get("masters", {})
        self._generation = self._vault.generation

    def _save(self) -> None:
        text = json.dumps({"devices": self._devices, "masters": self._masters}, sort_keys=True)
        self._vault.put(VERIFIED_MARKS, text)
        self._generation = self._vault.generation

    def mark_device(self, user_id: str, device_id: str, ed25519: str) -> None:
        self._fresh()
        self._devices.setdefault(user_id, {})[device_id] = ed25519
        self._save()

    def mark_master(self, user_id: str, master_key: str) -> None:
        self._fresh()
        self._masters[user_id] = master_key
        self._save()

    def device_verified(self, device: Device) -> bool:
        self._fresh()
        return self._devices.get(device.user_id, {}).get(device.device_id) == device.ed25519

    def master_verified(self, user_id: str, master_key: str | None) -> bool:
        self._fresh()
        return master_key is not None and self._masters.get(user_id) == master_key
