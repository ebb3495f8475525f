"""One engine per store directory: a second open fails at once, naming the holder, and
the lock goes with its holder however it ends (closed, or its process killed)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from gapline.history import StoreInUse
from gapline.storage import StorageError
from tests.history.test_engine_support import open_engine


def _mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


async def test_a_second_engine_on_an_open_store_is_refused_until_the_first_closes(
    tmp_path: Path,
) -> None:
    async with open_engine(tmp_path, None):
        with pytest.raises(StoreInUse, match=rf"process {os.getpid()}\b"):
            async with open_engine(tmp_path, None):
                pass
    async with open_engine(tmp_path, None):  # released on close: the store opens again
        pass


async def test_the_refusal_is_a_storage_error_before_the_database_is_touched(
    tmp_path: Path,
) -> None:
    async with open_engine(tmp_path, None):
        before = _mtimes(tmp_path)
        with pytest.raises(StoreInUse) as refused:
            async with open_engine(tmp_path, None, passphrase="not even checked"):
                pass
        assert isinstance(refused.value, StorageError)  # the command lines' store problem
        assert _mtimes(tmp_path) == before


async def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    async with open_engine(tmp_path, None):
        pass  # the store exists; the child below holds its lock and is killed
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from gapline.history._store_lock import store_locked
        with store_locked(Path({str(tmp_path)!r})):
            print("held", flush=True)
            time.sleep(60)
        """
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None and await child.stdout.readline() == b"held\n"
        with pytest.raises(StoreInUse, match=rf"process {child.pid}\b"):
            async with open_engine(tmp_path, None):
                pass
    finally:
        child.send_signal(signal.SIGKILL)
        await asyncio.wait_for(child.wait(), 30)
    async with open_engine(tmp_path, None):
        pass
