"""`gapline login` and `gapline logout` on a real Synapse: a password from a file, two
accounts in one store chosen by user ID, and a logout that kills the token and the device."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from gapline.clikit import Exit
from gapline.history._session_store import load_session
from gapline.history.cli_session import on_store
from gapline.matrix import MatrixClient, Session, UnknownToken
from tests.fixtures.synapse import SynapseKit

PASSPHRASE = "correct horse"
TIMEOUT = 120


async def gapline(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """Run `gapline ARGS` without a terminal (a prompt would fail, never hang)."""
    env = {k: v for k, v in os.environ.items() if k != "GAPLINE_PASSWORD"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gapline.cli", *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={**env, "GAPLINE_PASSPHRASE": PASSPHRASE, "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def login(kit: SynapseKit, store: Path, user: str, password_file: Path) -> str:
    status, out, err = await gapline(
        "login", "--store", str(store), "--homeserver", kit.base_url, "--user", user,
        "--password-file", str(password_file),
    )  # fmt: skip
    assert status == Exit.OK, err
    assert out == ""
    return err


async def stored(directory: Path) -> Session:
    session = await on_store(
        directory, PASSPHRASE, lambda cache: load_session(cache.backend, cache.cipher)
    )
    assert session is not None
    return session


def _password_file(directory: Path, password: str = "password") -> Path:
    path = directory / "password"
    path.write_text(password + "\n")
    return path


def _file_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.iterdir() if p.is_file())


SHUTDOWN = b'{"id": 1, "command": "Shutdown"}\n'


@pytest.mark.timeout(300)
async def test_login_from_a_password_file_then_the_bridge_needs_no_password(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice", password="s3cret pass")
    password, store = _password_file(tmp_path, "s3cret pass"), tmp_path / "store"

    err = await login(synapse_kit, store, alice.user_id, password)

    directory = store / alice.user_id[1:].replace(":", "_")
    session = await stored(directory)
    assert err.strip() == (
        f"logged in as {alice.user_id} (device {session.device_id}); the session is kept "
        f"sealed in {directory}"
    )
    record = json.loads((directory / "device.json").read_text())
    assert record["device_id"] == session.device_id
    assert record["homeserver"] == synapse_kit.base_url
    assert session.access_token.encode() not in _file_bytes(directory)  # sealed, never in the clear
    async with synapse_kit.client(session) as client:
        assert (await client.whoami()).user_id == alice.user_id

    # No --user, --homeserver nor password: the only account, its sealed session.
    status, out, err = await gapline("bridge", "--store", str(store), stdin=SHUTDOWN)
    assert status == Exit.OK, err
    assert [json.loads(line) for line in out.splitlines()] == [{"id": 1, "answer": "Ok"}]
    assert f"logged in as {alice.user_id} (device {session.device_id})" in err


@pytest.mark.timeout(300)
async def test_two_accounts_in_one_store_are_chosen_by_user_id(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    password, store = _password_file(tmp_path), tmp_path / "store"
    await login(synapse_kit, store, alice.user_id, password)
    await login(synapse_kit, store, bob.user_id, password)
    users = sorted([alice.user_id, bob.user_id])

    status, out, err = await gapline("bridge", "--store", str(store), stdin=SHUTDOWN)
    assert status == Exit.USAGE
    assert out == ""
    assert err.strip() == (
        f"gapline bridge: the store in {store} holds 2 accounts ({', '.join(users)}): "
        "pick one with --user"
    )

    for user in (alice, bob):
        session = await stored(store / user.user_id[1:].replace(":", "_"))
        assert session.user_id == user.user_id
        status, out, err = await gapline(
            "bridge", "--store", str(store), "--user", user.user_id, stdin=SHUTDOWN
        )
        assert status == Exit.OK, err
        assert f"logged in as {user.user_id} (device {session.device_id})" in err


@pytest.mark.timeout(300)
async def test_logout_invalidates_the_token_and_deletes_the_device(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    password, store = _password_file(tmp_path), tmp_path / "store"
    await login(synapse_kit, store, alice.user_id, password)
    directory = store / alice.user_id[1:].replace(":", "_")
    session = await stored(directory)
    async with synapse_kit.client(alice) as client:
        assert session.device_id in (await client.devices()).ids

    status, out, err = await gapline("logout", "--store", str(store))
    assert status == Exit.OK, err
    assert out == ""
    assert err.strip() == (
        f"logged out {alice.user_id} (device {session.device_id} deleted on the homeserver; "
        f"its messages and keys kept in {directory})"
    )

    async with MatrixClient(synapse_kit.base_url, session=session, trust_env=False) as client:
        with pytest.raises(UnknownToken):
            await client.whoami()
    async with synapse_kit.client(alice) as client:
        assert session.device_id not in (await client.devices()).ids

    # The kept data is a logged-out device's: the bridge refuses it and says what to do.
    status, _, err = await gapline("bridge", "--store", str(store), stdin=SHUTDOWN)
    assert status == Exit.STORE
    assert "was logged out" in err and "--local" in err
    status, _, err = await gapline("logout", "--store", str(store), "--local")
    assert status == Exit.OK, err
    assert not directory.exists()
