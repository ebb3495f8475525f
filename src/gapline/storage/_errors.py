"""The storage exception tree, shaped after PEP 249.

    StorageError
    ├── BackendClosed        the backend was closed; nothing more is accepted
    ├── BackendUnavailable   the database cannot be reached or opened (server down, permissions)
    ├── CorruptStore         the file is not a database, or not a gapline database, or is damaged
    ├── MigrationError       a migration failed or the database is newer than this code
    ├── IntegrityError       a constraint refused the write (unique key, foreign key, check)
    ├── OperationalError     any other driver failure during an operation
    └── CipherError
        └── WrongPassphrase  the store key cannot be unwrapped with the passphrase given

Each backend maps its driver's errors into this tree in exactly one place, so callers
branch on these types and never import sqlite3 or psycopg.
"""

from __future__ import annotations

__all__ = [
    "BackendClosed",
    "BackendUnavailable",
    "CipherError",
    "CorruptStore",
    "IntegrityError",
    "MigrationError",
    "OperationalError",
    "StorageError",
    "WrongPassphrase",
]


class StorageError(Exception):
    """Base of every error the storage layer raises."""


class BackendClosed(StorageError):
    """The backend is closed (or closing) and accepts no more work."""


class BackendUnavailable(StorageError):
    """The database cannot be reached or opened."""


class CorruptStore(StorageError):
    """The file is not a database, not a gapline database, or is damaged."""


class MigrationError(StorageError):
    """A migration failed, or the database was written by a newer gapline."""


class IntegrityError(StorageError):
    """A constraint refused the write: for admission, 'already there'."""


class OperationalError(StorageError):
    """Any other failure of the driver while running an operation."""


class CipherError(StorageError):
    """The at-rest cipher could not seal or open a value."""


class WrongPassphrase(CipherError):
    """The passphrase does not unwrap this store's key."""
