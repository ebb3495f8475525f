"""`gapline tui` without a terminal, on a real Synapse: the login and the store check
happen (one line each when they fail, see test_cli_synapse.py), then a missing terminal is
one line and status 5 instead of a traceback from the screen."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gapline.clikit import Exit
from gapline.history._accounts import account_dirname
from tests.fixtures.synapse import SynapseKit


async def test_no_terminal_after_a_good_login_is_one_line_and_status_5(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice", password="right-password")
    store = tmp_path / "store"
    password = tmp_path / "password"
    password.write_text("right-password\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gapline.cli", "tui",
        "--homeserver", synapse_kit.base_url, "--user", alice.user_id,
        "--password-file", str(password), "--store", str(store), "--device-id", "GAPLINETUI1",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "GAPLINE_PASSPHRASE": "pp", "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == Exit.NO_TERMINAL
    assert out == b""
    assert err.decode().splitlines() == [
        "gapline tui: the terminal client needs a terminal on stdin and stdout "
        "(for scripts: gapline bridge speaks the same engine as JSON lines)"
    ]
    # The login went through on the device asked for, and the store opened.
    assert (
        json.loads((store / account_dirname(alice.user_id) / "device.json").read_text())[
            "device_id"
        ]
        == "GAPLINETUI1"
    )
