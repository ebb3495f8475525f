"""End-to-end encryption for Matrix rooms (Olm and Megolm), sans-I/O.

`CryptoMachine` is fed what the homeserver said and returns decrypted events,
undecryptable-event values, and the requests to send next (as
`gapline.matrix` requests); its state changes come out as one `Changes` value
the caller saves with `save_changes(tx, changes)` in the transaction of what
caused them. `open_machine` loads it from a `gapline.storage` backend;
`CryptoDriver` is a thin async shell over a `MatrixClient` and a backend.
Primitives are vodozemac's; see docs/e2ee.md.
"""

from ._backup import (
    BackupTrust,
    BackupUpload,
    KeyBackup,
    RestoreReport,
)
from ._backup_crypto import (
    BACKUP_ALGORITHM,
    BackupEntryInvalid,
    BackupKey,
)
from ._canonical import canonical_json, signing_bytes
from ._changes import Changes
from ._cross_signing import (
    CrossSigning,
    CrossSigningBootstrap,
)
from ._decrypt_worker import DecryptWorker, DecryptWorkers, decrypt_worker
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
from ._inbound import (
    RoomKey,
)
from ._key_driver import (
    BackupEntries,
    bootstrap_cross_signing,
    enable_backup,
    fetch_backup_room,
    fetch_backup_sessions,
    fetch_secret_storage,
    recover_from_server,
    restore_backup,
    set_up_recovery,
    sign_own_device,
    upload_backup,
    verify_user,
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
from ._megolm_worker import RawDecryption
from ._open import open_machine
from ._recovery import (
    RECOVERABLE_SECRETS,
    RecoverySetup,
    SecretStorageState,
    recover,
    setup_recovery,
)
from ._recovery_key import (
    RecoveryKeyInvalid,
    decode_recovery_key,
    encode_recovery_key,
)
from ._sas import EMOJI, ShortString
from ._schema import E2EE_MIGRATIONS, E2EE_SCHEMA
from ._secret_storage import (
    SecretStorageError,
    SecretStorageKey,
    WrongRecoveryKey,
)
from ._sharing_policy import SharingPolicy
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
from ._vault import (
    BACKUP_SECRET,
    MASTER_SECRET,
    SELF_SIGNING_SECRET,
    USER_SIGNING_SECRET,
    SecretVault,
)
from ._verification import FLOW_TIMEOUT_MS, STEP_TIMEOUT_MS, Verifications
from ._verification_driver import (
    publish_verified,
    request_verification_in_room,
    send_verification,
)
from ._verification_types import (
    CancelCode,
    VerificationEvent,
    VerificationMessage,
    VerificationState,
    VerificationStatus,
)
from ._verified import VerifiedMarks

__all__ = [
    "BACKUP_ALGORITHM",
    "BACKUP_SECRET",
    "E2EE_MIGRATIONS",
    "E2EE_SCHEMA",
    "EMOJI",
    "FLOW_TIMEOUT_MS",
    "MASTER_SECRET",
    "MEGOLM",
    "OLM",
    "RECOVERABLE_SECRETS",
    "SELF_SIGNING_SECRET",
    "STEP_TIMEOUT_MS",
    "USER_SIGNING_SECRET",
    "BackupEntries",
    "BackupEntryInvalid",
    "BackupKey",
    "BackupTrust",
    "BackupUpload",
    "CancelCode",
    "Changes",
    "CorruptCryptoStore",
    "CrossSigning",
    "CrossSigningBootstrap",
    "CryptoDriver",
    "CryptoMachine",
    "CryptoStoreError",
    "DecryptWorker",
    "DecryptWorkers",
    "DecryptedEvent",
    "DecryptedToDevice",
    "Device",
    "E2eeError",
    "EncryptionRefused",
    "EncryptionRefusedReason",
    "EncryptionSettings",
    "ExportedSession",
    "ImportReport",
    "KeyBackup",
    "KeyExportError",
    "KeyExportProblem",
    "KeyUpdates",
    "OutgoingRequest",
    "RawDecryption",
    "RecoveryKeyInvalid",
    "RecoverySetup",
    "Refusal",
    "RefusalCode",
    "RequestKind",
    "RestoreReport",
    "RoomKey",
    "RoomKeyId",
    "SecretStorageError",
    "SecretStorageKey",
    "SecretStorageState",
    "SecretVault",
    "SendResult",
    "ShareReport",
    "ShareState",
    "SharingPolicy",
    "ShortString",
    "StoredState",
    "TrustLevel",
    "UnableToDecrypt",
    "UnknownRequest",
    "UnsavedChanges",
    "UtdReason",
    "VerificationEvent",
    "VerificationMessage",
    "VerificationState",
    "VerificationStatus",
    "Verifications",
    "VerifiedMarks",
    "WrongRecoveryKey",
    "WrongStoreKey",
    "bootstrap_cross_signing",
    "canonical_json",
    "decode_recovery_key",
    "decrypt_key_file",
    "decrypt_worker",
    "enable_backup",
    "encode_recovery_key",
    "encrypt_key_file",
    "export_room_keys",
    "fetch_backup_room",
    "fetch_backup_sessions",
    "fetch_secret_storage",
    "import_room_keys",
    "load_state",
    "merge_updates",
    "open_machine",
    "publish_verified",
    "recover",
    "recover_from_server",
    "request_verification_in_room",
    "restore_backup",
    "save_changes",
    "send_verification",
    "set_up_recovery",
    "setup_recovery",
    "sign_own_device",
    "signing_bytes",
    "upload_backup",
    "verify_user",
]
