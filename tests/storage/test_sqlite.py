"""The SQLite backend: the shared contract plus SQLite-only behaviour."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gapline.storage import (
    BackendUnavailable,
    CorruptStore,
    IntegrityError,
    OperationalError,
    open_backend,
    tune_sqlite_writer,
)
from gapline.storage._sqlite import SQLiteBackend, map_sqlite_error
from tests.storage.contract import ITEMS, BackendContract, insert, keys
from tests.storage.contract_hooks import CommitHooksContract


class TestSQLiteBackend(BackendContract, CommitHooksContract):
    @pytest.fixture
    def dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "nested" / "dir" / "store.db")


del BackendContract, CommitHooksContract


async def test_pragmas_wal_full_sync_and_busy_timeout(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "p.db"), busy_timeout_ms=1234)
    assert isinstance(backend, SQLiteBackend)
    try:
        writer = await backend.write(
            lambda tx: (
                tx.one("PRAGMA journal_mode"),
                tx.one("PRAGMA synchronous"),
                tx.one("PRAGMA busy_timeout"),
            )
        )
        reader = await backend.read(
            lambda tx: (tx.one("PRAGMA synchronous"), tx.one("PRAGMA query_only"))
        )
    finally:
        await backend.close()
    assert writer == (("wal",), (2,), (1234,))  # synchronous 2 = FULL
    assert reader == ((1,), (1,))  # synchronous 1 = NORMAL; query_only on


async def test_tune_sqlite_writer_sets_the_writer_cache_and_checkpoint_interval(
    tmp_path: Path,
) -> None:
    backend = await open_backend(str(tmp_path / "tuned.db"))
    try:
        await tune_sqlite_writer(backend, cache_kib=4096, wal_autocheckpoint_pages=2048)
        writer = await backend.write(
            lambda tx: (tx.one("PRAGMA cache_size"), tx.one("PRAGMA wal_autocheckpoint"))
        )
        reader = await backend.read(lambda tx: tx.one("PRAGMA cache_size"))
        again = await backend.write(lambda tx: tx.one("PRAGMA cache_size"))
    finally:
        await backend.close()
    assert writer == ((-4096,), (2048,))  # negative cache_size: KiB, not pages
    assert again == (-4096,)  # it lasts for the writer connection
    assert reader != (-4096,)  # readers keep the default


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a database, just some text\n" * 100,
        bytes(range(256)) * 64,
        b"SQLite format 3\x00" + b"\xff" * 4080,  # a valid magic, garbage header
    ],
    ids=["text", "binary", "bad-header"],
)
async def test_a_file_that_is_not_a_database_is_corrupt_store(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(content)
    with pytest.raises(CorruptStore, match="not a usable SQLite database"):
        await open_backend(str(path))


async def test_a_damaged_database_is_corrupt_store(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    backend = await open_backend(str(path))
    await backend.migrate("contract", ITEMS)
    await backend.write(
        lambda tx: tx.executemany(
            "INSERT INTO items (k, v) VALUES (?, ?)", [(f"k{i}", i) for i in range(2000)]
        )
    )
    await backend.close()
    data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xa5" * 4096  # overwrite the second page (schema/b-tree pages)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStore):
        reopened = await open_backend(str(path))
        try:
            await reopened.read(keys)
            await reopened.read(lambda tx: tx.one("PRAGMA integrity_check"))
            await reopened.read(lambda tx: tx.all("SELECT * FROM items LIMIT 5000"))
        finally:
            await reopened.close()


async def test_an_unopenable_path_is_backend_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BackendUnavailable):
        await open_backend(str(blocker / "store.db"))  # parent is a file


async def test_group_commit_off_still_isolates_and_commits(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "single.db"), group_commit=False)
    try:
        await backend.migrate("contract", ITEMS)
        await backend.write(insert("a"))
        with pytest.raises(IntegrityError):
            await backend.write(insert("a"))
        assert await backend.read(keys) == ["a"]
    finally:
        await backend.close()


def _error(cls: type[sqlite3.Error], message: str, code: int | None = None) -> sqlite3.Error:
    exc = cls(message)
    if code is not None:
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_error(sqlite3.DatabaseError, "file is not a database", 26), CorruptStore),
        (_error(sqlite3.DatabaseError, "database disk image is malformed", 11), CorruptStore),
        (_error(sqlite3.DatabaseError, "file is not a database"), CorruptStore),
        (_error(sqlite3.OperationalError, "unable to open database file", 14), BackendUnavailable),
        (_error(sqlite3.IntegrityError, "UNIQUE constraint failed: t.k", 2067), IntegrityError),
        (_error(sqlite3.IntegrityError, "FOREIGN KEY constraint failed", 787), IntegrityError),
        (_error(sqlite3.OperationalError, "database is locked", 5), OperationalError),
        (_error(sqlite3.OperationalError, 'near "SELEC": syntax error', 1), OperationalError),
        (_error(sqlite3.ProgrammingError, "Incorrect number of bindings"), OperationalError),
        (_error(sqlite3.InterfaceError, "bad parameter"), OperationalError),
        (_error(sqlite3.DataError, "string or blob too big", 18), OperationalError),
        (_error(sqlite3.InternalError, "internal"), OperationalError),
        (_error(sqlite3.NotSupportedError, "not supported"), OperationalError),
    ],
)
def test_every_sqlite_error_class_maps_into_the_tree(
    error: sqlite3.Error, expected: type[Exception]
) -> None:
    mapped = map_sqlite_error(error)
    assert type(mapped) is expected
    assert mapped.__cause__ is error


def test_non_driver_errors_pass_through_the_mapper() -> None:
    error = ValueError("the operation's own")
    assert map_sqlite_error(error) is error


async def test_an_in_memory_database_is_refused() -> None:
    with pytest.raises(BackendUnavailable, match="file path"):
        await open_backend(":memory:")
