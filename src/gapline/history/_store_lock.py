"""One engine per store directory at a time: an exclusive lock beside the database.

The engine keeps parts of its store in memory between transactions (sender member
records, rooms known to hold no aggregate, the last gap row a fill wrote) and its
crypto machine holds the device's Olm and Megolm ratchets. Both are right only while
this engine is the store's one writer: a second process writing the same file would
leave the first one's memory stale and, worse, advance a ratchet the first one has
already used, which makes later messages undecryptable. So opening a store directory
takes an exclusive ``flock`` on ``history.lock`` in it, and a second open, from this
process or another, fails at once with :class:`StoreInUse` naming the holder.

The lock is the kernel's: it goes with the process, however it ends (a SIGKILL
leaves no stale lock to clean up). The file keeps the holder's pid for the message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Generator
from pathlib import Path

from gapline.storage import StorageError

__all__ = ["LOCK_FILE", "StoreInUse", "store_locked"]

LOCK_FILE = "history.lock"


class StoreInUse(StorageError):
    """Another engine (in this process or another) has this store directory open."""

    def __init__(self, directory: Path, message: str) -> None:
        super().__init__(message)
        self.directory = directory


@contextlib.contextmanager
def store_locked(directory: Path) -> Generator[None]:
    """Hold the directory's lock for the block; :class:`StoreInUse` if it is held. A
    path that is no directory takes no lock (opening the database there reports it)."""
    if not directory.is_dir():
        yield
        return
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            who = f"process {holder}" if holder.isdigit() else "another process"
            raise StoreInUse(
                directory,
                f"it is open in {who} (one gapline client at a time per store:"
                " close the other one first)",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
