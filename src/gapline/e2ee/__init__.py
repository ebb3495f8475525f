"""End-to-end encryption for Matrix rooms (Olm and Megolm), sans-I/O.

`CryptoMachine` is fed what the homeserver said and returns decrypted events,
undecryptable-event values, and the requests to send next (as
`gapline.matrix` requests); its state changes come out as one `Changes` value
the caller saves with `save_changes(tx, changes)` in the transaction of what
caused them. `open_machine` loads it from a `gapline.storage` backend;
`CryptoDriver` is a thin async shell over a `MatrixClient` and a backend.
Primitives are vodozemac's; see docs/e2ee.md.
"""

from ._canonical import canonical_json, signing_bytes
from ._changes import Changes
from ._driver import CryptoDriver, SendResult, merge_updates
from ._errors import (
    CorruptCryptoStore,
    CryptoStoreError,
    E2eeError,
    EncryptionRefused,
    EncryptionRefusedReason,
    UnknownRequest,
    UnsavedChanges,
    WrongStoreKey,
)
from ._key_export import (
    ExportedSession,
    ImportReport,
    KeyExportError,
    KeyExportProblem,
    decrypt_key_file,
    encrypt_key_file,
    export_room_keys,
    import_room_keys,
)
from ._machine import CryptoMachine
from ._open import open_machine
from ._schema import E2EE_MIGRATIONS, E2EE_SCHEMA
from ._store import StoredState, load_state, save_changes
from ._types import (
    MEGOLM,
    OLM,
    DecryptedEvent,
    DecryptedToDevice,
    Device,
    EncryptionSettings,
    KeyUpdates,
    OutgoingRequest,
    Refusal,
    RefusalCode,
    RequestKind,
    RoomKeyId,
    ShareReport,
    ShareState,
    TrustLevel,
    UnableToDecrypt,
    UtdReason,
)

__all__ = [
    "E2EE_MIGRATIONS",
    "E2EE_SCHEMA",
    "MEGOLM",
    "OLM",
    "Changes",
    "CorruptCryptoStore",
    "CryptoDriver",
    "CryptoMachine",
    "CryptoStoreError",
    "DecryptedEvent",
    "DecryptedToDevice",
    "Device",
    "E2eeError",
    "EncryptionRefused",
    "EncryptionRefusedReason",
    "EncryptionSettings",
    "ExportedSession",
    "ImportReport",
    "KeyExportError",
    "KeyExportProblem",
    "KeyUpdates",
    "OutgoingRequest",
    "Refusal",
    "RefusalCode",
    "RequestKind",
    "RoomKeyId",
    "SendResult",
    "ShareReport",
    "ShareState",
    "StoredState",
    "TrustLevel",
    "UnableToDecrypt",
    "UnknownRequest",
    "UnsavedChanges",
    "UtdReason",
    "WrongStoreKey",
    "canonical_json",
    "decrypt_key_file",
    "encrypt_key_file",
    "export_room_keys",
    "import_room_keys",
    "load_state",
    "merge_updates",
    "open_machine",
    "save_changes",
    "signing_bytes",
]
