"""The exceptions `gapline.e2ee` raises.

Decryption failures are *values* (`UnableToDecrypt`), and inputs refused by a
rule are `Refusal` values that are also logged; exceptions are kept for what
the caller must not carry on past::

    E2eeError                    base of everything below
    ├── CryptoStoreError         the stored crypto state cannot be opened
    │   ├── WrongStoreKey        the store key does not open this state
    │   └── CorruptCryptoStore   a row is damaged (a pickle fails, a row is missing)
    ├── EncryptionRefused        fail closed: nothing may be sent into this room now
    │                            (``reason``: an `EncryptionRefusedReason`)
    ├── UnsavedChanges           requests were asked for while a step's changes were
    │                            not yet taken (send only what is saved)
    └── UnknownRequest           an answer was reported for a request that is not out
"""

from __future__ import annotations

import enum

__all__ = [
    "CorruptCryptoStore",
    "CryptoStoreError",
    "E2eeError",
    "EncryptionRefused",
    "EncryptionRefusedReason",
    "UnknownRequest",
    "UnsavedChanges",
    "WrongStoreKey",
]


class E2eeError(Exception):
    """Base class of every error raised by `gapline.e2ee`."""


class CryptoStoreError(E2eeError):
    """The stored encryption state cannot be opened; nothing of it was loaded."""


class WrongStoreKey(CryptoStoreError):
    """The store key given at open is not the one this state was written with."""


class CorruptCryptoStore(CryptoStoreError):
    """A stored row is damaged: a pickle that does not open, or inconsistent rows."""


class EncryptionRefusedReason(enum.StrEnum):
    NOT_SHARED = "not_shared"  # share_room_key has not made the room's session ready
    EXPIRED = "expired"  # the session reached its rotation period: share again
    UNSUPPORTED_ALGORITHM = "unsupported_algorithm"  # m.room.encryption names another algorithm
    NOT_ENCRYPTED = "not_encrypted"  # the room is not known as encrypted (no settings)


class EncryptionRefused(E2eeError):
    """The machine will not encrypt for this room now, so the event must not be sent.

    A caller that gets this for a room whose state says it is encrypted must not
    fall back to sending plaintext.
    """

    def __init__(self, room_id: str, reason: EncryptionRefusedReason, detail: str = "") -> None:
        self.room_id = room_id
        self.reason = reason
        super().__init__(
            f"cannot encrypt for {room_id}: {reason.value}{': ' + detail if detail else ''}"
        )


class UnsavedChanges(E2eeError):
    """``outgoing_requests`` was called while state changes were waiting in the machine.

    Take them (`CryptoMachine.take_changes`) and save them first: a request sent
    before the ratchet state that produced it is durable can desynchronise a session.
    """


class UnknownRequest(E2eeError):
    """An answer was reported for a request ID that is not outstanding."""
