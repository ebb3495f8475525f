"""`DeviceTracker`: whose devices we follow, their accepted keys, and their trust.

Device lists come from ``/keys/query``. The rules:

- A user is *tracked* once they share an encrypted room with us
  (`track`); sync's ``device_lists.changed`` marks a tracked user *outdated*,
  ``device_lists.left`` stops tracking. Outdated users are queried before the
  machine shares a room key with them.
- A device is accepted only when its object names the (user, device) it is
  listed under and carries a valid self-signature by its own Ed25519 key.
- The first accepted (Curve25519, Ed25519) pair of a (user, device) is pinned
  for good: an answer that lists a known device ID with other keys is refused
  and logged, and the device keeps its old keys. A device that disappears from
  its owner's list is marked deleted, not forgotten, so its ID stays pinned.
- Cross-signing: a self-signing key counts only when the user's master key
  signed it; a device signed by that self-signing key is ``CROSS_SIGNED``.
  Whether the master key itself is trusted is `CrossSigning`'s (`VERIFIED`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from gapline.matrix import KeysQueryResponse

from ._canonical import SignatureInvalid, verify_signature
from ._changes import ChangeBuilder, CrossSigningRecord, DeviceRecord
from ._types import Device, Refusal, RefusalCode, TrustLevel

__all__ = ["DeviceTracker", "QueryResult"]

log = logging.getLogger("gapline.e2ee.devices")


@dataclass(frozen=True, slots=True)
class QueryResult:
    changed_users: tuple[str, ...]  # users whose accepted device set or trust changed
    removed: tuple[tuple[str, str], ...]  # (user, device) that left their owner's list
    refusals: tuple[Refusal, ...]


def _single_key(obj: dict[str, Any]) -> str | None:
    keys = obj.get("keys")
    if not isinstance(keys, dict) or len(keys) != 1:
        return None
    ((key_id, key),) = keys.items()
    if not isinstance(key, str) or key_id != f"ed25519:{key}":
        return None
    return key


class DeviceTracker:
    def __init__(self, user_id: str, device_id: str, own_ed25519: str, own_curve25519: str) -> None:
        self.user_id = user_id
        self.device_id = device_id
        self._own = (own_curve25519, own_ed25519)
        self.tracked: dict[str, bool] = {}  # user -> outdated
        self._devices: dict[str, dict[str, Device]] = {}
        self._raw: dict[tuple[str, str], str] = {}
        self._by_curve: dict[str, Device] = {}
        self._cross: dict[str, dict[str, Any]] = {}
        self._dirty_devices: set[tuple[str, str]] = set()
        self._dirty_tracked: set[str] = set()
        self._untracked: set[str] = set()
        self._dirty_cross: set[str] = set()
        self.cross_generation = 0  # bumped whenever any cross-signing keys change (trust caches)

    # -- loading and saving ----------------------------------------------------------------

    def load(
        self,
        devices: Iterable[DeviceRecord],
        cross: Iterable[CrossSigningRecord],
        tracked: Iterable[tuple[str, bool]],
    ) -> None:
        for record in cross:
            self._cross[record.user_id] = json.loads(record.keys_json)
        for record in devices:
            obj = json.loads(record.keys_json)
            self._put(record.user_id, record.device_id, obj, record.keys_json, record.deleted)
        self.tracked.update(tracked)
        self._dirty_devices.clear()  # loaded rows are already stored

    def drain(self, out: ChangeBuilder) -> None:
        for user, device_id in sorted(self._dirty_devices):
            d = self._devices[user][device_id]
            out.add(
                "devices",
                DeviceRecord(
                    user,
                    device_id,
                    d.curve25519,
                    d.ed25519,
                    self._raw[(user, device_id)],
                    d.deleted,
                ),
            )
        for user in sorted(self._dirty_cross):
            out.add("cross_signing", CrossSigningRecord(user, json.dumps(self._cross[user])))
        out.add("tracked_users", *((u, self.tracked[u]) for u in sorted(self._dirty_tracked)))
        out.add("untracked_users", *sorted(self._untracked))
        self._dirty_devices.clear()
        self._dirty_cross.clear()
        self._dirty_tracked.clear()
        self._untracked.clear()

    @property
    def dirty(self) -> bool:
        return bool(
            self._dirty_devices or self._dirty_cross or self._dirty_tracked or self._untracked
        )

    # -- lookups ------------------------------------------------------------------------------

    def get(self, user_id: str, device_id: str) -> Device | None:
        return self._devices.get(user_id, {}).get(device_id)

    def by_curve25519(self, key: str) -> Device | None:
        return self._by_curve.get(key)

    def cross_signing_keys(self, user_id: str) -> dict[str, Any]:
        """The user's accepted cross-signing keys as received (master, self_signing, ...)."""
        return self._cross.get(user_id, {})

    def raw_device_keys(self, user_id: str, device_id: str) -> dict[str, Any] | None:
        """A device's signed keys object as received."""
        raw = self._raw.get((user_id, device_id))
        return None if raw is None else json.loads(raw)

    def devices_of(self, user_id: str, *, include_deleted: bool = False) -> list[Device]:
        devices = self._devices.get(user_id, {}).values()
        return sorted(
            (d for d in devices if include_deleted or not d.deleted), key=lambda d: d.device_id
        )

    # -- tracking -----------------------------------------------------------------------------

    def track(self, users: Iterable[str]) -> list[str]:
        """Follow these users; the new ones are outdated. Returns the new ones."""
        new = [u for u in dict.fromkeys(users) if u not in self.tracked]
        for user in new:
            self.tracked[user] = True
            self._dirty_tracked.add(user)
            self._untracked.discard(user)
        return new

    def mark_changed(self, users: Iterable[str]) -> None:
        for user in users:
            if user in self.tracked and not self.tracked[user]:
                self.tracked[user] = True
                self._dirty_tracked.add(user)

    def mark_left(self, users: Iterable[str]) -> None:
        for user in users:
            if user in self.tracked and user != self.user_id:
                del self.tracked[user]
                self._dirty_tracked.discard(user)
                self._untracked.add(user)

    def outdated(self) -> list[str]:
        return sorted(u for u, outdated in self.tracked.items() if outdated)

    # -- /keys/query ----------------------------------------------------------------------------

    def receive_query(self, asked: Iterable[str], answer: KeysQueryResponse) -> QueryResult:
        """Apply a ``/keys/query`` answer for the users ``asked``; others are ignored."""
        refusals: list[Refusal] = []
        changed: list[str] = []
        removed: list[tuple[str, str]] = []
        for user in dict.fromkeys(asked):
            if self.tracked.get(user):
                self.tracked[user] = False
                self._dirty_tracked.add(user)
            listed = answer.device_keys.get(user)
            if listed is None:
                log.warning(
                    "keys/query: no device list for %s (failures: %s)",
                    user,
                    sorted(answer.failures),
                )
                continue
            before = {d.device_id: d for d in self.devices_of(user, include_deleted=True)}
            self._receive_cross_signing(user, answer, refusals)
            for device_id, obj in listed.items():
                refusal = self._accept_device(user, device_id, obj)
                if refusal is not None:
                    log.warning(
                        "keys/query: refused device %s %s: %s", user, device_id, refusal.detail
                    )
                    refusals.append(refusal)
            for device_id, device in before.items():
                if device_id not in listed and not device.deleted:
                    self._set(replace(device, deleted=True))
                    removed.append((user, device_id))
            self._retrust(user)
            after = {d.device_id: d for d in self.devices_of(user, include_deleted=True)}
            if after != before:
                changed.append(user)
        return QueryResult(tuple(changed), tuple(removed), tuple(refusals))

    def _accept_device(self, user: str, device_id: str, obj: Any) -> Refusal | None:
        def refuse(code: RefusalCode, detail: str) -> Refusal:
            return Refusal(code, detail, sender=user, device_id=device_id)

        if not isinstance(obj, dict):
            return refuse(RefusalCode.MALFORMED, "device keys are not an object")
        if obj.get("user_id") != user or obj.get("device_id") != device_id:
            return refuse(
                RefusalCode.MISMATCHED_IDS,
                f"listed as {user} {device_id} but names {obj.get('user_id')} "
                f"{obj.get('device_id')}",
            )
        keys = obj.get("keys")
        curve = keys.get(f"curve25519:{device_id}") if isinstance(keys, dict) else None
        ed = keys.get(f"ed25519:{device_id}") if isinstance(keys, dict) else None
        if not isinstance(curve, str) or not isinstance(ed, str):
            return refuse(RefusalCode.MALFORMED, "device keys lack curve25519 or ed25519")
        try:
            verify_signature(obj, user, f"ed25519:{device_id}", ed)
        except (SignatureInvalid, ValueError) as exc:
            return refuse(RefusalCode.BAD_SIGNATURE, f"self-signature: {exc}")
        known = self.get(user, device_id)
        if known is not None and (known.curve25519, known.ed25519) != (curve, ed):
            return refuse(
                RefusalCode.CHANGED_DEVICE_KEY,
                f"keys changed for a known device (pinned ed25519 {known.ed25519}, "
                f"offered {ed}); kept the pinned keys",
            )
        if (user, device_id) == (self.user_id, self.device_id) and (curve, ed) != self._own:
            return refuse(
                RefusalCode.CHANGED_DEVICE_KEY, "listed keys for this device are not ours"
            )
        raw = json.dumps(obj, sort_keys=True)
        if known is None or known.deleted or self._raw.get((user, device_id)) != raw:
            self._put(user, device_id, obj, raw, deleted=False)
            self._dirty_devices.add((user, device_id))
        return None

    def _receive_cross_signing(
        self, user: str, answer: KeysQueryResponse, refusals: list[Refusal]
    ) -> None:
        keys: dict[str, Any] = {}
        master = answer.master_keys.get(user)
        if master is not None:
            if (
                master.get("user_id") == user
                and "master" in master.get("usage", ())
                and _single_key(master)
            ):
                keys["master"] = master
            else:
                refusals.append(Refusal(RefusalCode.MALFORMED, "unusable master key", sender=user))
        ssk = answer.self_signing_keys.get(user)
        if ssk is not None and "master" in keys:
            master_key = _single_key(keys["master"])
            try:
                if ssk.get("user_id") != user or "self_signing" not in ssk.get("usage", ()):
                    raise SignatureInvalid("not a self-signing key of this user")
                if _single_key(ssk) is None:
                    raise SignatureInvalid("no single ed25519 key")
                verify_signature(ssk, user, f"ed25519:{master_key}", str(master_key))
                keys["self_signing"] = ssk
            except SignatureInvalid as exc:
                log.warning("keys/query: refused self-signing key of %s: %s", user, exc)
                refusals.append(
                    Refusal(RefusalCode.BAD_SIGNATURE, f"self-signing key: {exc}", sender=user)
                )
        usk = answer.user_signing_keys.get(user)
        if usk is not None and user == self.user_id:
            keys["user_signing"] = usk  # checked by CrossSigning before it is relied on
        if self._cross.get(user) != keys:
            old_master = self._cross.get(user, {}).get("master")
            if old_master is not None and old_master != keys.get("master"):
                log.warning("keys/query: the master key of %s changed", user)
            self._cross[user] = keys
            self._dirty_cross.add(user)
            self.cross_generation += 1

    def _trust_of(self, user: str, device_id: str, obj: dict[str, Any]) -> TrustLevel:
        if (user, device_id) == (self.user_id, self.device_id):
            return TrustLevel.OWN
        ssk = self._cross.get(user, {}).get("self_signing")
        key = _single_key(ssk) if ssk else None
        if key is not None:
            try:
                verify_signature(obj, user, f"ed25519:{key}", key)
                return TrustLevel.CROSS_SIGNED
            except SignatureInvalid:
                pass  # not cross-signed: the default below
        return TrustLevel.UNSIGNED

    def _retrust(self, user: str) -> None:
        for device in self.devices_of(user, include_deleted=True):
            obj = json.loads(self._raw[(user, device.device_id)])
            trust = self._trust_of(user, device.device_id, obj)
            if trust is not device.trust:
                self._set(replace(device, trust=trust))

    def _put(self, user: str, device_id: str, obj: dict[str, Any], raw: str, deleted: bool) -> None:
        keys = obj["keys"]
        unsigned = obj.get("unsigned")
        name = unsigned.get("device_display_name") if isinstance(unsigned, dict) else None
        algorithms = obj.get("algorithms")
        device = Device(
            user_id=user,
            device_id=device_id,
            curve25519=keys[f"curve25519:{device_id}"],
            ed25519=keys[f"ed25519:{device_id}"],
            algorithms=tuple(a for a in algorithms if isinstance(a, str))
            if isinstance(algorithms, list)
            else (),
            display_name=name if isinstance(name, str) else None,
            trust=self._trust_of(user, device_id, obj),
            deleted=deleted,
        )
        self._raw[(user, device_id)] = raw
        self._set(device)

    def _set(self, device: Device) -> None:
        self._devices.setdefault(device.user_id, {})[device.device_id] = device
        self._by_curve[device.curve25519] = device
        self._dirty_devices.add((device.user_id, device.device_id))
