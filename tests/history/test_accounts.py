"""Several accounts in one store directory: names, choosing by user ID, the in-place move of
a store from before accounts, and the sealed access token."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from gapline.clikit import CommandError, Exit
from gapline.history._accounts import (
    DeviceRecord,
    account_dirname,
    accounts,
    choose_account,
    read_record,
    write_record,
)
from gapline.history._engine import Engine
from gapline.history._session_store import load_session, save_session
from gapline.matrix import Session
from gapline.storage import CipherError, KdfParams

SESSION = Session("https://hs.example", "@me:example.org", "DEVICE1", "syt_secret_token_value")


def _file_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.iterdir() if p.is_file())


def test_account_names_keep_the_old_default_store_names_and_stay_one_path_segment() -> None:
    # `gapline tui`'s default store was .../gapline/me_example.org: it is this account now.
    assert account_dirname("@me:example.org") == "me_example.org"
    assert account_dirname("@me:host:8448") == "me_host_8448"
    assert account_dirname("@a/b:hs") == "a%2Fb_hs"
    assert account_dirname("@..:hs") == "%2E._hs"
    assert account_dirname("@é:hs") == "%C3%A9_hs"


def test_one_account_is_the_default_and_several_need_user(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as none:
        choose_account(tmp_path, None)
    assert none.value.status == Exit.STORE
    assert "gapline login --store" in none.value.message

    for user in ("@me:example.org", "@bot:example.org"):
        account = choose_account(tmp_path, user, create=True)
        write_record(account.directory, DeviceRecord(user, "D", "https://hs.example"))
        if user == "@me:example.org":
            assert choose_account(tmp_path, None).user_id == user  # the only one
    with pytest.raises(CommandError) as several:
        choose_account(tmp_path, None)
    assert several.value.status == Exit.USAGE
    assert several.value.message == (
        f"the store in {tmp_path} holds 2 accounts (@bot:example.org, @me:example.org): "
        "pick one with --user"
    )
    chosen = choose_account(tmp_path, "@bot:example.org")
    assert chosen.directory == tmp_path / "bot_example.org"
    assert [a.user_id for a in accounts(tmp_path)] == ["@bot:example.org", "@me:example.org"]
    with pytest.raises(CommandError, match=r"no account @nobody:example\.org in"):
        choose_account(tmp_path, "@nobody:example.org")


def test_a_directory_named_for_two_users_is_refused_not_shared(tmp_path: Path) -> None:
    # "@a_b:c" and "@a:b_c" share a name; the directory belongs to the one it records.
    directory = tmp_path / "a_b_c"
    directory.mkdir()
    write_record(directory, DeviceRecord("@a_b:c", "D"))
    with pytest.raises(CommandError, match="holds the account @a_b:c, not @a:b_c"):
        choose_account(tmp_path, "@a:b_c", create=True)


async def test_a_single_account_store_moves_into_its_account_directory(tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with Engine.open(
        store, None, passphrase="pp", sync=False, kdf_cost=KdfParams.cheap()
    ) as engine:
        await save_session(engine.store.backend, engine.store.cipher, SESSION)
    # The layout before accounts: the database (with its WAL, if any) and device.json.
    (store / "device.json").write_text(
        json.dumps(
            {"user": "@me:example.org", "user_id": "@me:example.org", "device_id": "DEVICE1"}
        )
    )
    before = sorted(p.name for p in store.iterdir())
    assert "history.sqlite3" in before

    account = choose_account(store, None)  # no --user: device.json says whose it is

    assert account.user_id == "@me:example.org"
    assert account.directory == store / "me_example.org"
    assert sorted(p.name for p in store.iterdir()) == ["me_example.org"]
    assert sorted(p.name for p in account.directory.iterdir()) == before
    async with Engine.open(account.directory, None, passphrase="pp", sync=False) as engine:
        assert await load_session(engine.store.backend, engine.store.cipher) == SESSION
    assert read_record(account.directory) == DeviceRecord("@me:example.org", "DEVICE1")


def test_an_interrupted_move_is_finished_by_the_next_start(tmp_path: Path) -> None:
    store = tmp_path / "store"
    staging = store / ".account-migration"
    staging.mkdir(parents=True)
    # The crash came after the database and device.json moved, before its WAL did.
    (staging / "history.sqlite3").write_bytes(b"db")
    (staging / "device.json").write_text(json.dumps({"user_id": "@me:example.org"}))
    (store / "history.sqlite3-wal").write_bytes(b"wal")

    account = choose_account(store, None)

    assert sorted(os.listdir(store)) == ["me_example.org"]
    assert sorted(os.listdir(account.directory)) == [
        "device.json",
        "history.sqlite3",
        "history.sqlite3-wal",
    ]
    assert (account.directory / "history.sqlite3-wal").read_bytes() == b"wal"


def test_a_store_that_names_no_one_moves_only_with_user(tmp_path: Path) -> None:
    (tmp_path / "history.sqlite3").write_bytes(b"db")
    with pytest.raises(CommandError, match="give --user MXID") as refused:
        choose_account(tmp_path, None)
    assert refused.value.status == Exit.USAGE
    assert (tmp_path / "history.sqlite3").exists()  # nothing moved
    account = choose_account(tmp_path, "@me:example.org", create=True)
    assert (account.directory / "history.sqlite3").read_bytes() == b"db"


async def test_the_token_is_sealed_and_bound_to_its_identifiers(tmp_path: Path) -> None:
    async with Engine.open(
        tmp_path, None, passphrase="pp", sync=False, kdf_cost=KdfParams.cheap()
    ) as engine:
        await save_session(engine.store.backend, engine.store.cipher, SESSION)
    raw = _file_bytes(tmp_path)
    assert SESSION.access_token.encode() not in raw
    # Moved to another user's row, the sealed token does not open.
    db = sqlite3.connect(tmp_path / "history.sqlite3")
    with db:
        db.execute("UPDATE history_session SET user_id = '@mallory:example.org'")
    db.close()
    async with Engine.open(tmp_path, None, passphrase="pp", sync=False) as engine:
        with pytest.raises(CipherError):
            await load_session(engine.store.backend, engine.store.cipher)


def test_device_json_names_the_device_and_never_holds_the_token(tmp_path: Path) -> None:
    assert read_record(tmp_path) is None
    write_record(tmp_path, DeviceRecord(SESSION.user_id, SESSION.device_id, SESSION.homeserver))
    assert read_record(tmp_path) == DeviceRecord(
        SESSION.user_id, SESSION.device_id, SESSION.homeserver
    )
    assert SESSION.access_token not in (tmp_path / "device.json").read_text()
    (tmp_path / "device.json").write_text("{not json")
    assert read_record(tmp_path) is None  # unreadable: a warning, no account
