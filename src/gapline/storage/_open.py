"""``open_backend``: one entry point from a DSN to a :class:`Backend`."""

from __future__ import annotations

from typing import Any

from gapline.storage._backend import Backend

__all__ = ["open_backend"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


async def open_backend(dsn: str, **opts: Any) -> Backend:
    """Open the database named by ``dsn``.

    A ``postgresql://`` or ``postgres://`` URL opens PostgreSQL (the ``postgres``
    extra must be installed); anything else is a SQLite file path, whose parent
    directory is created. ``opts`` go to the backend (``group_commit``,
    ``max_batch``, ``readers``; SQLite also ``busy_timeout_ms``;
    PostgreSQL also ``writers``).
    """
    if dsn.startswith(_POSTGRES_SCHEMES):
        from gapline.storage._postgres import open_postgres

        return await open_postgres(dsn, **opts)
    from gapline.storage._sqlite import open_sqlite

    return await open_sqlite(dsn, **opts)
