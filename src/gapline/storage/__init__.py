"""Durable storage for every gapline store: one contract, SQLite and PostgreSQL.

Open a backend with :func:`open_backend` from a DSN: a SQLite file path, or a
``postgresql://`` URL. See :class:`Backend` for the contract every store relies on.
"""

from gapline.storage._backend import Backend, Dialect, Migration, Tx
from gapline.storage._cipher import KdfParams, StoreCipher, change_passphrase, open_cipher
from gapline.storage._errors import (
    BackendClosed,
    BackendUnavailable,
    CipherError,
    CorruptStore,
    IntegrityError,
    MigrationError,
    OperationalError,
    StorageError,
    WrongPassphrase,
)
from gapline.storage._open import open_backend
from gapline.storage._tuning import tune_sqlite_writer

__all__ = [
    "Backend",
    "BackendClosed",
    "BackendUnavailable",
    "CipherError",
    "CorruptStore",
    "Dialect",
    "IntegrityError",
    "KdfParams",
    "Migration",
    "MigrationError",
    "OperationalError",
    "StorageError",
    "StoreCipher",
    "Tx",
    "WrongPassphrase",
    "change_passphrase",
    "open_backend",
    "open_cipher",
    "tune_sqlite_writer",
]
