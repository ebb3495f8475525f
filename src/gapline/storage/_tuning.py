"""Connection tuning a store may ask for beyond the backends' defaults."""

from __future__ import annotations

from gapline.storage._backend import Backend, Dialect, Tx

__all__ = ["tune_sqlite_writer"]


async def tune_sqlite_writer(
    backend: Backend, *, cache_kib: int, wal_autocheckpoint_pages: int
) -> None:
    """Give a SQLite backend's writer connection a larger page cache and rarer checkpoints.

    For a store whose commits land on many random index pages (an index keyed by
    hashes, say): a page cache of ``cache_kib`` KiB keeps those pages in memory
    instead of re-reading them from the OS, and checkpointing every
    ``wal_autocheckpoint_pages`` WAL pages instead of SQLite's 1,000 copies a
    page that many commits rewrite to the database file once rather than once
    per commit or two. Durability is unchanged: every COMMIT still fsyncs the
    WAL (the writer runs ``synchronous=FULL``); only when pages reach the main
    file changes, and the WAL may grow to about ``wal_autocheckpoint_pages``
    pages between checkpoints.

    The settings hold for the writer connection until the backend closes;
    readers keep the defaults. PostgreSQL has no per-connection equivalent
    worth setting here, so on any other dialect this does nothing.
    """
    if backend.dialect is not Dialect.SQLITE:
        return
    cache_size = -int(cache_kib)  # negative: a size in KiB rather than in pages
    pages = int(wal_autocheckpoint_pages)

    def tune(tx: Tx) -> None:
        tx.execute(f"PRAGMA cache_size={cache_size}")
        tx.execute(f"PRAGMA wal_autocheckpoint={pages}")

    await backend.write(tune)
