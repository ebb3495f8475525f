"""The at-rest cipher, on both backends where the database matters."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gapline.storage import (
    Backend,
    CipherError,
    KdfParams,
    Migration,
    StoreCipher,
    WrongPassphrase,
    change_passphrase,
    open_backend,
    open_cipher,
)

CHEAP = KdfParams.cheap()
SECRET_TEXT = b"the-distinctive-plaintext-7f3a9c-never-on-disk"
SECRET_ID = "@distinctive-user-5b1e:example.org"

VAULT = [
    Migration(
        1,
        "vault",
        sqlite="CREATE TABLE vault (lookup BLOB PRIMARY KEY, sealed BLOB NOT NULL)",
        postgres="CREATE TABLE vault (lookup BYTEA PRIMARY KEY, sealed BYTEA NOT NULL)",
    )
]


async def test_values_round_trip_with_associated_data(backend: Backend) -> None:
    cipher = await open_cipher(backend, "correct horse", kdf_cost=CHEAP)
    for plaintext in (b"", b"x", SECRET_TEXT, bytes(range(256)) * 40):
        sealed = cipher.encrypt(plaintext, aad=b"room-1/event-9")
        # A short plaintext can occur in random ciphertext by chance (one byte:
        # ~11% of the time), so only long ones say anything about sealing.
        assert len(plaintext) < 16 or plaintext not in sealed
        assert cipher.decrypt(sealed, aad=b"room-1/event-9") == plaintext
    assert cipher.decrypt(cipher.encrypt(b"no aad")) == b"no aad"
    assert cipher.encrypt(b"same") != cipher.encrypt(b"same")  # fresh nonce each time


async def test_wrong_passphrase_is_refused(backend: Backend) -> None:
    await open_cipher(backend, "correct horse", kdf_cost=CHEAP)
    with pytest.raises(WrongPassphrase, match="wrong passphrase"):
        await open_cipher(backend, "battery staple", kdf_cost=CHEAP)


async def test_tampered_truncated_or_misplaced_values_are_refused(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "c.db"))
    try:
        cipher = await open_cipher(backend, "pw", kdf_cost=CHEAP)
    finally:
        await backend.close()
    sealed = cipher.encrypt(SECRET_TEXT, aad=b"row-1")
    for i in (0, 1, 13, len(sealed) // 2, len(sealed) - 1):
        tampered = bytearray(sealed)
        tampered[i] ^= 0x01
        with pytest.raises(CipherError):
            cipher.decrypt(bytes(tampered), aad=b"row-1")
    with pytest.raises(CipherError):
        cipher.decrypt(sealed[:-1], aad=b"row-1")
    with pytest.raises(CipherError):
        cipher.decrypt(sealed[:10], aad=b"row-1")
    with pytest.raises(CipherError):
        cipher.decrypt(sealed, aad=b"row-2")  # moved to another row
    other = StoreCipher(bytes(32))
    with pytest.raises(CipherError):
        other.decrypt(sealed, aad=b"row-1")


async def _store_secret(path: Path, cipher_on: bool) -> None:
    backend = await open_backend(str(path))
    try:
        await backend.migrate("vault", VAULT)
        if cipher_on:
            cipher = await open_cipher(backend, "pw", kdf_cost=CHEAP)
            lookup, sealed = cipher.lookup_key(SECRET_ID), cipher.encrypt(SECRET_TEXT)
        else:
            lookup, sealed = SECRET_ID.encode(), SECRET_TEXT
        await backend.write(
            lambda tx: tx.execute(
                "INSERT INTO vault (lookup, sealed) VALUES (?, ?)", (lookup, sealed)
            )
        )
    finally:
        await backend.close()


def _bytes_on_disk(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


@pytest.mark.parametrize("cipher_on", [True, False], ids=["sealed", "control-plaintext"])
async def test_no_plaintext_reaches_the_database_file(tmp_path: Path, cipher_on: bool) -> None:
    path = tmp_path / "vault.db"
    await _store_secret(path, cipher_on)
    on_disk = _bytes_on_disk(path)
    # The control run proves the search would find the plaintext if it were there.
    assert (SECRET_TEXT in on_disk) is not cipher_on
    assert (SECRET_ID.encode() in on_disk) is not cipher_on


async def test_lookup_keys_and_values_survive_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "reopen.db")
    backend = await open_backend(path)
    try:
        cipher = await open_cipher(backend, "pw", kdf_cost=CHEAP)
        lookup = cipher.lookup_key(SECRET_ID)
        sealed = cipher.encrypt(SECRET_TEXT, aad=lookup)
    finally:
        await backend.close()
    backend = await open_backend(path)
    try:
        again = await open_cipher(backend, "pw")  # stored KDF settings win over the default
    finally:
        await backend.close()
    assert again.lookup_key(SECRET_ID) == lookup
    assert again.lookup_key(SECRET_ID + "x") != lookup
    assert len(lookup) == 32
    assert again.decrypt(sealed, aad=lookup) == SECRET_TEXT


async def test_concurrent_first_opens_agree_on_one_key(backend: Backend) -> None:
    first, second = await asyncio.gather(
        open_cipher(backend, "pw", kdf_cost=CHEAP), open_cipher(backend, "pw", kdf_cost=CHEAP)
    )
    assert second.decrypt(first.encrypt(b"shared")) == b"shared"
    assert first.lookup_key("a") == second.lookup_key("a")


async def test_kdf_settings_are_stored_and_default_is_memory_hard(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "kdf.db"))
    try:
        await open_cipher(backend, "pw")
        row = await backend.read(lambda tx: tx.one("SELECT kdf FROM gapline_cipher_key"))
    finally:
        await backend.close()
    assert row is not None
    stored = json.loads(row[0])
    assert stored["name"] == "argon2id"
    assert stored["memory_kib"] >= 65536
    assert KdfParams.from_json(row[0]) == KdfParams.default()


async def test_changing_the_passphrase_rewraps_the_same_key(backend: Backend) -> None:
    cipher = await open_cipher(backend, "old", kdf_cost=CHEAP)
    sealed = cipher.encrypt(SECRET_TEXT)
    with pytest.raises(WrongPassphrase):
        await change_passphrase(backend, "not-old", "new")
    await change_passphrase(
        backend, "old", "new", kdf_cost=KdfParams(memory_kib=16, iterations=1, lanes=1)
    )
    with pytest.raises(WrongPassphrase):
        await open_cipher(backend, "old")
    renewed = await open_cipher(backend, "new")
    assert renewed.decrypt(sealed) == SECRET_TEXT


def test_values_sealed_together_open_alone_each_under_its_own_nonce() -> None:
    cipher = StoreCipher(bytes(range(32)))
    items = [(f"value {i}".encode(), f"row {i}".encode()) for i in range(50)] + [(b"x", b"")]
    sealed = cipher.encrypt_many(items)
    assert [cipher.decrypt(s, aad) for s, (_, aad) in zip(sealed, items, strict=True)] == [
        p for p, _ in items
    ]
    assert len({s[1:13] for s in sealed}) == len(items)  # one nonce per value
    with pytest.raises(CipherError):
        cipher.decrypt(sealed[0], b"row 1")  # bound to its own associated data
    assert cipher.encrypt_many([]) == []
