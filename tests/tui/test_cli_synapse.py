"""`gapline tui` on a real Synapse: the failures a person meets before the screen opens
are one line on stderr and exit status 1, and a good login records its device."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gapline.history import Engine
from gapline.storage import KdfParams
from tests.fixtures.synapse import SynapseKit


async def _tui(kit: SynapseKit, user: str, password: str, store: Path, passphrase: str):
    password_file = store.parent / "password"
    password_file.write_text(password + "\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gapline.cli", "tui",
        "--homeserver", kit.base_url, "--user", user,
        "--password-file", str(password_file), "--store", str(store),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "GAPLINE_PASSPHRASE": passphrase, "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip
    out, err = await process.communicate()
    return process.returncode, out.decode(), err.decode()


async def test_bad_password_and_wrong_passphrase_exit_1(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice", password="right-password")
    store = tmp_path / "store"

    status, out, err = await _tui(synapse_kit, alice.user_id, "wrong", store, "pp")
    assert status == 1
    assert out == ""
    assert err.startswith(f"gapline tui: login as {alice.user_id} failed:")
    assert len(err.strip().splitlines()) == 1

    # a store made with another passphrase
    async with Engine.open(store, None, passphrase="first", kdf_cost=KdfParams.cheap()):
        pass
    status, out, err = await _tui(synapse_kit, alice.user_id, "right-password", store, "second")
    assert status == 1
    assert err.startswith(f"gapline tui: cannot open the store in {store}")
    assert len(err.strip().splitlines()) == 1
    # the login before it succeeded, and its device is remembered (no token on disk)
    device = json.loads((store / "device.json").read_text())
    assert device["user_id"] == alice.user_id and device["device_id"]
    assert "access_token" not in device
