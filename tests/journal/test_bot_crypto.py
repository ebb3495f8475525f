"""The bot's crypto store in the journal's database: one device identity across restarts,
a wrong passphrase or a damaged pickle refused at open with nothing loaded or written,
on SQLite and PostgreSQL; and `gapline bot` / `gapline journal read` say so clearly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from gapline.cli import main
from gapline.e2ee import CorruptCryptoStore, CryptoStoreError
from gapline.journal._crypto import BotCrypto
from gapline.journal._sealing import SealedContent, Sealing, open_sealing
from gapline.matrix import ClientEvent, MatrixClient
from gapline.storage import Backend, StoreCipher, WrongPassphrase, open_backend

BOT = "@bot:localhost"
DEVICE = "GAPLINETEST"


@pytest.fixture(params=["sqlite", "postgres"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "journal.sqlite3")
    return request.getfixturevalue("postgres_dsn")


async def _open(backend: Backend, passphrase: str, device: str = DEVICE) -> BotCrypto:
    async with MatrixClient("http://127.0.0.1:9") as client:  # never contacted at open
        return await BotCrypto.open(backend, client, passphrase, user_id=BOT, device_id=device)


async def _crypto_rows(backend: Backend) -> list[Any]:
    return await backend.read(
        lambda tx: [
            tuple(r)
            for table in ("e2ee_account", "e2ee_olm_sessions", "e2ee_inbound_sessions")
            for r in tx.all(f"SELECT * FROM {table}")
        ]
    )


async def test_the_device_identity_survives_a_restart(dsn: str) -> None:
    backend = await open_backend(dsn)
    try:
        first = await _open(backend, "pass one")
        keys = first.identity_keys
        again = await _open(backend, "pass one")
        assert again.identity_keys == keys
        assert again.machine.device_id == DEVICE
        with pytest.raises(CryptoStoreError, match="belongs to"):
            await _open(backend, "pass one", device="ANOTHERDEVICE")
    finally:
        await backend.close()


async def test_a_wrong_passphrase_is_refused_before_any_pickle_and_writes_nothing(
    dsn: str,
) -> None:
    backend = await open_backend(dsn)
    try:
        await _open(backend, "right")
        before = await _crypto_rows(backend)
        with pytest.raises(WrongPassphrase):
            await _open(backend, "wrong")
        assert await _crypto_rows(backend) == before
    finally:
        await backend.close()


async def test_a_damaged_pickle_is_refused_at_open_and_nothing_is_loaded(dsn: str) -> None:
    backend = await open_backend(dsn)
    try:
        await _open(backend, "right")
        await backend.write(
            lambda tx: tx.execute("UPDATE e2ee_account SET pickle = ? WHERE id = 1", ("garbage",))
        )
        before = await _crypto_rows(backend)
        with pytest.raises(CorruptCryptoStore, match="account"):
            await _open(backend, "right")
        assert await _crypto_rows(backend) == before
    finally:
        await backend.close()


def test_sealed_values_round_trip_and_a_keyless_reader_refuses_them() -> None:
    sealing = Sealing(StoreCipher(b"k" * 32))
    sealed = sealing.text("a secret body")
    assert sealed is not None and "secret" not in sealed
    assert sealing.open_text(sealed) == "a secret body"
    data = sealing.data(b'{"body": "a secret body"}')
    assert b"secret" not in data and sealing.open_data(data) == b'{"body": "a secret body"}'
    keyless = Sealing()
    assert keyless.open_text("never sealed") == "never sealed"  # rows from before the key
    with pytest.raises(SealedContent, match="passphrase"):
        keyless.open_text(sealed)
    with pytest.raises(SealedContent):
        keyless.open_data(data)


async def test_open_sealing_needs_a_journal_with_a_passphrase(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "plain.sqlite3"))
    try:
        with pytest.raises(SealedContent, match="no passphrase"):
            await open_sealing(backend, "anything")
    finally:
        await backend.close()


def _bot(store: Path, passphrase_file: Path) -> list[str]:
    return [
        "bot",
        "--homeserver",
        "http://127.0.0.1:9",
        "--user",
        BOT,
        "--password",
        "pw",
        "--store",
        str(store),
        "--handler",
        "echo",
        "--passphrase-file",
        str(passphrase_file),
    ]


def test_gapline_bot_says_wrong_passphrase_before_the_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    right, wrong = tmp_path / "right", tmp_path / "wrong"
    right.write_text("right\n")
    wrong.write_text("wrong\n")
    assert main(_bot(store, right)) == 1  # the store is made, then the homeserver fails
    capsys.readouterr()
    assert main(_bot(store, wrong)) == 1
    err = capsys.readouterr().err
    records = [json.loads(line) for line in err.splitlines()]
    failed = records[-1]
    assert failed["msg"] == "bot failed" and failed["error_type"] == "WrongPassphrase"
    assert "passphrase" in failed["error"]
    assert not any(r["msg"] == "logged in" for r in records)
    assert "Traceback" not in err
    # Without its passphrase the bot would read ciphertext: refused, also before the network.
    assert main(_bot(store, right)[:-2]) == 1
    err = capsys.readouterr().err
    failed = json.loads(err.splitlines()[-1])
    assert failed["error_type"] == "SealedContent" and "passphrase" in failed["error"]
    assert "Traceback" not in err
    code = main(
        [
            "journal",
            "read",
            "--store",
            str(store),
            "--principal",
            BOT,
            "--room",
            "!r:localhost",
            "--passphrase-file",
            str(right),
        ]
    )
    assert code == 0  # the right passphrase opens the sealed journal
    capsys.readouterr()
    read = ["journal", "read", "--store", str(store), "--principal", BOT, "--room", "!r:localhost"]
    assert main(read) == 0  # no rows yet: nothing sealed to show
    assert main([*read, "--passphrase-file", str(wrong)]) == 1
    err = capsys.readouterr().err
    assert "passphrase" in err and "Traceback" not in err


@pytest.mark.parametrize("leaves", [True, False])
def test_a_leave_seen_by_ingress_rotates_the_bots_session(leaves: bool) -> None:
    """What ingress hands ``BotCrypto.observe`` for a room (state and timeline) reaches the
    machine: a member leaving who had the session retires it, so the next answer goes out
    under a new one. The control (no leave seen) keeps the session."""
    from gapline.e2ee import CryptoDriver
    from tests.e2ee.harness import Clock, connected, online
    from tests.e2ee.keyserver import KeyServer

    alice, _bob, _carol = online(
        KeyServer(), Clock(), ("@alice:x", "A1"), ("@bob:x", "B1"), ("@carol:x", "C1")
    )
    room = connected([alice, _bob, _carol])
    before = alice.send(room, "all three")
    driver = CryptoDriver(cast(Any, None), cast(Any, None), alice.store_key, alice.machine)
    crypto = BotCrypto(driver, cast(Any, None), "@alice:x")
    membership = "leave" if leaves else "join"
    crypto.observe(
        room.room_id,
        [
            ClientEvent(
                event_id="$m",
                type="m.room.member",
                sender="@carol:x",
                origin_server_ts=1,
                content={"membership": membership},
                state_key="@carol:x",
            )
        ],
    )
    report = alice.share(room)  # the same member list: only the leave can rotate it
    assert report.rotated is leaves
    after = alice.send(room, "next")
    assert (after.content["session_id"] != before.content["session_id"]) is leaves


async def _every_row(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the database, by table (the whole written state)."""
    backend = await open_backend(dsn)
    try:

        def dump(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
            if dsn.startswith("postgresql"):
                names = tx.all(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = current_schema()"
                )
            else:
                names = tx.all("SELECT name FROM sqlite_master WHERE type = 'table'")
            return {
                str(n[0]): sorted(map(tuple, tx.all(f'SELECT * FROM "{n[0]}"')), key=repr)
                for n in names
            }

        return await backend.read(dump)
    finally:
        await backend.close()


def test_a_second_principal_with_a_passphrase_is_refused_and_writes_nothing(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One encrypted device per database: a second bot (another user) started with a
    passphrase on a journal whose encryption state is the first bot's is refused with
    status 1 and a clear error, before anything is written (not its device id, not a
    second account), so the first bot's Olm account is neither shared nor overwritten."""
    secret = tmp_path / "passphrase"
    secret.write_text("one passphrase\n")
    first = _bot(tmp_path / "unused", secret)
    first[first.index("--store") + 1] = dsn
    assert main(first) == 1  # the crypto store is made, then the homeserver fails
    capsys.readouterr()
    before = asyncio.run(_every_row(dsn))
    assert before["e2ee_account"][0][1] == BOT  # the first bot's device is there
    second = list(first)
    second[second.index("--user") + 1] = "@other:localhost"
    assert main(second) == 1
    err = capsys.readouterr().err
    records = [json.loads(line) for line in err.splitlines()]
    failed = records[-1]
    assert failed["msg"] == "bot failed" and failed["error_type"] == "EncryptionStoreTaken"
    assert BOT in failed["error"] and "one encrypted device per database" in failed["error"]
    assert not any(r["msg"] == "logged in" for r in records)
    assert "Traceback" not in err
    assert asyncio.run(_every_row(dsn)) == before
