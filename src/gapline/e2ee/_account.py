"""`AccountMachine`: this device's Olm account, its signed keys and one-time keys.

The account is created once per store: a restart loads it (same identity keys,
same device), it is never replaced. Its job:

- sign: the device keys (self-signature), one-time and fallback keys, and any
  JSON object (`sign_json`);
- keep the server stocked with signed one-time keys: top up from sync's
  ``device_one_time_keys_count`` to `AccountMachine.target_keys`, and make a
  new fallback key when sync says the old one was used;
- build the ``/keys/upload`` body and, once it is accepted, mark those keys
  published;
- consume a one-time key when another device opens an Olm session with us.

Every change marks the account dirty; its pickle is taken with the step's
`Changes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import vodozemac

from gapline.matrix import KeysUploadResponse

from ._canonical import signed
from ._changes import AccountRecord
from ._secrets import CryptoKeys
from ._types import MEGOLM, OLM

__all__ = ["SIGNED_CURVE25519", "AccountMachine"]

SIGNED_CURVE25519 = "signed_curve25519"


# vodozemac 0.10's type stubs omit the fallback-key API its Account has.
def _fallback_key(account: vodozemac.Account) -> dict[str, vodozemac.Curve25519PublicKey]:
    return account.fallback_key  # ty: ignore[missing-attribute]


def _new_fallback_key(account: vodozemac.Account) -> None:
    account.generate_fallback_key()  # ty: ignore[missing-attribute]


class AccountMachine:
    """This device's identity (Curve25519 and Ed25519 keys) and key publication state."""

    def __init__(
        self,
        user_id: str,
        device_id: str,
        account: vodozemac.Account,
        *,
        device_keys_uploaded: bool,
        server_otk_count: int | None,
        created_ms: int,
    ) -> None:
        self.user_id = user_id
        self.device_id = device_id
        self._account = account
        self.device_keys_uploaded = device_keys_uploaded
        self.server_otk_count = server_otk_count
        self.created_ms = created_ms
        self.curve25519 = account.curve25519_key.to_base64()
        self.ed25519 = account.ed25519_key.to_base64()
        self.dirty = False

    @classmethod
    def create(cls, user_id: str, device_id: str, now_ms: int) -> AccountMachine:
        """A brand-new account with a full stock of one-time keys and a fallback key."""
        machine = cls(
            user_id,
            device_id,
            vodozemac.Account(),
            device_keys_uploaded=False,
            server_otk_count=None,
            created_ms=now_ms,
        )
        machine._account.generate_one_time_keys(machine.target_keys)
        _new_fallback_key(machine._account)
        machine.dirty = True
        return machine

    @classmethod
    def from_record(cls, record: AccountRecord, keys: CryptoKeys) -> AccountMachine:
        account = vodozemac.Account.from_pickle(record.pickle, keys.pickle_key)
        return cls(
            record.user_id,
            record.device_id,
            account,
            device_keys_uploaded=record.device_keys_uploaded,
            server_otk_count=record.server_otk_count,
            created_ms=record.created_ms,
        )

    def record(self, keys: CryptoKeys) -> AccountRecord:
        return AccountRecord(
            user_id=self.user_id,
            device_id=self.device_id,
            key_check=keys.key_check,
            pickle=self._account.pickle(keys.pickle_key),
            device_keys_uploaded=self.device_keys_uploaded,
            server_otk_count=self.server_otk_count,
            created_ms=self.created_ms,
        )

    @property
    def target_keys(self) -> int:
        """How many signed one-time keys the server should hold for this device."""
        return self._account.max_number_of_one_time_keys

    # -- signing -----------------------------------------------------------------------------

    def sign(self, message: bytes) -> str:
        return self._account.sign(message).to_base64()

    def sign_json(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return signed(obj, self.user_id, f"ed25519:{self.device_id}", self.sign)

    def device_keys(self) -> dict[str, Any]:
        """This device's self-signed device keys object."""
        return self.sign_json(
            {
                "user_id": self.user_id,
                "device_id": self.device_id,
                "algorithms": [OLM, MEGOLM],
                "keys": {
                    f"curve25519:{self.device_id}": self.curve25519,
                    f"ed25519:{self.device_id}": self.ed25519,
                },
            }
        )

    # -- publication ---------------------------------------------------------------------------

    def receive_counts(
        self, counts: Mapping[str, int], unused_fallback_types: list[str] | None
    ) -> None:
        """Sync reported the server's stock: top up one-time keys, replace a used fallback key.

        An empty ``counts`` means the server said nothing (no top-up); ``None`` for the
        fallback types means the same for the fallback key.
        """
        if counts:
            count = counts.get(SIGNED_CURVE25519, 0)
            if count != self.server_otk_count:
                self.server_otk_count = count
                self.dirty = True
            if self.device_keys_uploaded and not self._account.one_time_keys:
                missing = self.target_keys - count
                if missing > 0:
                    self._account.generate_one_time_keys(missing)
                    self.dirty = True
        if (
            unused_fallback_types is not None
            and SIGNED_CURVE25519 not in unused_fallback_types
            and self.device_keys_uploaded
            and not _fallback_key(self._account)
        ):
            _new_fallback_key(self._account)
            self.dirty = True

    def upload_body(self) -> dict[str, Any] | None:
        """The ``/keys/upload`` body for what is not yet published, or ``None``."""
        one_time = {
            f"{SIGNED_CURVE25519}:{key_id}": self.sign_json({"key": key.to_base64()})
            for key_id, key in self._account.one_time_keys.items()
        }
        fallback = {
            f"{SIGNED_CURVE25519}:{key_id}": self.sign_json(
                {"key": key.to_base64(), "fallback": True}
            )
            for key_id, key in _fallback_key(self._account).items()
        }
        if self.device_keys_uploaded and not one_time and not fallback:
            return None
        body: dict[str, Any] = {}
        if not self.device_keys_uploaded:
            body["device_keys"] = self.device_keys()
        if one_time:
            body["one_time_keys"] = one_time
        if fallback:
            body["fallback_keys"] = fallback
        return body

    def mark_uploaded(self, answer: KeysUploadResponse) -> None:
        """The server accepted an upload: those keys are published."""
        self._account.mark_keys_as_published()
        self.device_keys_uploaded = True
        self.server_otk_count = answer.one_time_key_counts.get(SIGNED_CURVE25519, 0)
        self.dirty = True

    # -- Olm sessions ---------------------------------------------------------------------------

    def create_inbound_session(
        self, sender_key: vodozemac.Curve25519PublicKey, message: vodozemac.PreKeyMessage
    ) -> tuple[vodozemac.Session, bytes]:
        """Open the session a pre-key message starts; consumes the one-time key it used
        (so the same message can never open a second session: a replay fails here)."""
        session, plaintext = self._account.create_inbound_session(sender_key, message)
        self.dirty = True
        return session, plaintext

    def create_outbound_session(self, identity_key: str, one_time_key: str) -> vodozemac.Session:
        return self._account.create_outbound_session(
            vodozemac.Curve25519PublicKey.from_base64(identity_key),
            vodozemac.Curve25519PublicKey.from_base64(one_time_key),
        )
