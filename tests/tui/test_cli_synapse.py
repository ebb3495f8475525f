"""`gapline tui` on a real Synapse: the failures a person meets before the screen opens
are one line on stderr and exit status 1, and a good login records its device."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gapline.history._accounts import account_dirname
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

    # the store opened (made with "pp") before that login was refused; another
    # passphrase is refused before any login
    account = store / account_dirname(alice.user_id)
    assert (account / "history.sqlite3").exists()
    status, out, err = await _tui(synapse_kit, alice.user_id, "right-password", store, "second")
    assert status == 1
    assert err.startswith(f"gapline tui: cannot open the store in {account}: wrong passphrase")
    assert len(err.strip().splitlines()) == 1
    assert not (account / "device.json").exists()
    # with its passphrase the login goes through: the device is named, the token sealed
    status, out, err = await _tui(synapse_kit, alice.user_id, "right-password", store, "pp")
    assert status == 5  # no terminal, after the login
    device = json.loads((account / "device.json").read_text())
    assert device["user_id"] == alice.user_id and device["device_id"]
    assert "access_token" not in device
