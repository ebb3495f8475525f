"""Durable storage for every gapline store: one contract, SQLite and PostgreSQL.

Open a backend with :func:`open_backend` from a DSN: a SQLite file path, or a
``postgresql://`` URL. See :class:`Backend` for the contract every store relies on.
"""

from gapline.storage._backend import Backend, Dialect, Migration, Tx
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

__all__ = [
    "Backend",
    "BackendClosed",
    "BackendUnavailable",
    "CipherError",
    "CorruptStore",
    "Dialect",
    "IntegrityError",
    "Migration",
    "MigrationError",
    "OperationalError",
    "StorageError",
    "Tx",
    "WrongPassphrase",
]
