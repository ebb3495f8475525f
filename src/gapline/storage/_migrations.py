"""Versioned migrations, applied once each and in order, inside one write transaction.

Bookkeeping lives in ``gapline_schema_migrations(schema, version, name, applied_at)``;
each store names its own ``schema`` so stores evolve independently in one database.

Concurrency: the whole check-and-apply runs as one write operation. On SQLite
that is a ``BEGIN IMMEDIATE`` transaction, which takes the database's write lock
before reading, so a second process waits (``busy_timeout``) and then sees the
versions the first applied. On PostgreSQL the operation first takes a
transaction-scoped advisory lock, *before* ``CREATE TABLE IF NOT EXISTS`` (which
is itself not safe against a concurrent twin), so two processes serialise.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gapline.storage._backend import Dialect, Migration
from gapline.storage._errors import MigrationError, StorageError

__all__ = ["MIGRATIONS_TABLE", "apply_migrations", "split_sqlite_statements"]

MIGRATIONS_TABLE = "gapline_schema_migrations"

# A fixed 64-bit key for pg_advisory_xact_lock, shared by every gapline process.
_PG_LOCK_KEY = int.from_bytes(b"gplnmigr", "big", signed=True)

_CREATE = f"""
CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
    schema TEXT NOT NULL,
    version INTEGER NOT NULL,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL,
    PRIMARY KEY (schema, version)
)"""


def split_sqlite_statements(text: str) -> list[str]:
    """Split a migration text into complete statements (``;`` inside literals is kept).

    ``sqlite3.Connection.execute`` runs one statement, and ``executescript``
    would COMMIT the surrounding transaction, so migrations are split here.
    """
    statements: list[str] = []
    current = ""
    for piece in text.split(";"):
        current = f"{current};{piece}" if current else piece
        if sqlite3.complete_statement(current + ";"):
            if current.strip() and not _only_comments(current):
                statements.append(current.strip())
            current = ""
    if current.strip() and not _only_comments(current):
        statements.append(current.strip())
    return statements


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())


def _validate(schema: str, migrations: Sequence[Migration]) -> list[Migration]:
    if not schema:
        raise MigrationError("a migration schema needs a name")
    ordered = sorted(migrations, key=lambda m: m.version)
    versions = [m.version for m in ordered]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"schema {schema!r}: duplicate migration versions {versions}")
    if versions and versions[0] < 1:
        raise MigrationError(f"schema {schema!r}: migration versions start at 1")
    return ordered


def apply_migrations(tx: Any, schema: str, migrations: Sequence[Migration]) -> list[int]:
    """Apply the migrations of ``schema`` this database lacks; return their versions.

    Runs inside a write operation (so it is all-or-nothing). Raises
    :class:`MigrationError` when the database already holds a version newer than
    every migration given, or when a migration's SQL fails.
    """
    ordered = _validate(schema, migrations)
    dialect: Dialect = tx.dialect
    if dialect is Dialect.POSTGRES:
        tx.one("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK_KEY,))
    tx.execute(_CREATE)
    applied = {
        int(row[0])
        for row in tx.all(f"SELECT version FROM {MIGRATIONS_TABLE} WHERE schema = ?", (schema,))
    }
    known = ordered[-1].version if ordered else 0
    newest = max(applied, default=0)
    if newest > known:
        raise MigrationError(
            f"the database holds schema {schema!r} at version {newest}, newer than this "
            f"gapline knows (up to {known}); upgrade gapline to open it"
        )
    done: list[int] = []
    for migration in ordered:
        if migration.version in applied:
            continue
        text = migration.text_for(dialect)
        try:
            if dialect is Dialect.SQLITE:
                for statement in split_sqlite_statements(text):
                    tx.execute(statement)
            else:
                tx.execute(text)  # no parameters: the server runs several statements at once
        except StorageError as exc:
            raise MigrationError(
                f"schema {schema!r} migration {migration.version} ({migration.name}) failed: {exc}"
            ) from exc
        tx.execute(
            f"INSERT INTO {MIGRATIONS_TABLE} (schema, version, name, applied_at) VALUES (?, ?, ?, ?)",
            (schema, migration.version, migration.name, datetime.now(UTC).isoformat()),
        )
        done.append(migration.version)
    return done
