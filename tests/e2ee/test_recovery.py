"""Recovery keys, secret storage and recovering the held private keys on a new device."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from gapline.e2ee import (
    BACKUP_SECRET,
    MASTER_SECRET,
    CryptoMachine,
    RecoveryKeyInvalid,
    SecretStorageError,
    SecretStorageState,
    WrongRecoveryKey,
    decode_recovery_key,
    encode_recovery_key,
    recover,
    setup_recovery,
)
from gapline.e2ee._recovery_key import _b58decode, _b58encode
from gapline.e2ee._secret_storage import check_key, decrypt_secret, encrypt_secret, new_key


def test_base58_against_published_vectors() -> None:
    # From the Base58 encoding draft (draft-msporny-base58): text, and leading zero bytes.
    assert _b58encode(b"Hello World!") == "2NEpo7TZRRrLZSi2U"
    assert _b58encode(bytes.fromhex("0000287fb4cd")) == "11233QC4"
    assert _b58decode("11233QC4") == bytes.fromhex("0000287fb4cd")


def test_recovery_key_round_trip_and_shape() -> None:
    key = os.urandom(32)
    text = encode_recovery_key(key)
    groups = text.split(" ")
    assert all(len(g) == 4 for g in groups[:-1]) and len(groups) == 12
    assert text.startswith("Es")  # every key with the 0x8B 0x01 prefix reads so, as in Element
    assert decode_recovery_key(text) == key
    assert decode_recovery_key(text.replace(" ", "")) == key


@pytest.mark.parametrize("where", [2, 20, 40])
def test_a_mistyped_character_fails_the_parity_or_prefix_check(where: int) -> None:
    text = encode_recovery_key(os.urandom(32)).replace(" ", "")
    swapped = "2" if text[where] != "2" else "3"
    with pytest.raises(RecoveryKeyInvalid):
        decode_recovery_key(text[:where] + swapped + text[where + 1 :])


def test_not_base58_or_wrong_length_is_refused() -> None:
    with pytest.raises(RecoveryKeyInvalid, match="Base58"):
        decode_recovery_key("EsT0 0000")
    with pytest.raises(RecoveryKeyInvalid, match="35"):
        decode_recovery_key("EsTc")


def test_secret_encryption_follows_the_construction() -> None:
    """AES-256-CTR and HMAC-SHA-256 under HKDF(zero salt, the secret's name): decrypting
    with the other name, or a flipped MAC, fails; the description check finds the key."""
    key = new_key()
    encrypted = encrypt_secret(key.key, BACKUP_SECRET, "c2VjcmV0")
    assert decrypt_secret(key.key, BACKUP_SECRET, encrypted) == "c2VjcmV0"
    assert base64.b64decode(encrypted["iv"])[8] & 0x80 == 0
    with pytest.raises(SecretStorageError, match="MAC"):
        decrypt_secret(key.key, MASTER_SECRET, encrypted)
    check_key(key.description, key.key)
    with pytest.raises(WrongRecoveryKey):
        check_key(key.description, os.urandom(32))


def _server_after(requests: Any) -> dict[str, dict[str, Any]]:
    """The account data the setup's PUT requests leave on the server."""
    return {r.path.rsplit("/", 1)[-1]: r.json for r in requests}


def _state(user: str, data: dict[str, dict[str, Any]]) -> SecretStorageState:
    from urllib.parse import unquote

    data = {unquote(k): v for k, v in data.items()}
    return SecretStorageState.from_account_data(data.get("m.secret_storage.default_key"), data)


def _machines() -> tuple[CryptoMachine, CryptoMachine]:
    old = CryptoMachine.create(os.urandom(32), "@me:x", "OLD")
    new = CryptoMachine.create(os.urandom(32), "@me:x", "NEW")
    old.take_changes(), new.take_changes()
    return old, new


@pytest.mark.parametrize("use_passphrase", [False, True])
def test_setup_then_recover_on_a_new_device(use_passphrase: bool) -> None:
    old, new = _machines()
    old.vault.put(BACKUP_SECRET, "YmFja3VwIGtleQ")
    old.vault.put(MASTER_SECRET, "bWFzdGVyIHNlZWQ")
    setup = setup_recovery(old, passphrase="long passphrase" if use_passphrase else None)
    assert set(setup.secrets) == {BACKUP_SECRET, MASTER_SECRET}
    data = _server_after(setup.requests)
    assert "YmFja3VwIGtleQ" not in json.dumps(data)
    state = _state("@me:x", data)
    kwargs = {"passphrase": "long passphrase"} if use_passphrase else {}
    names = recover(new, state, recovery_key=setup.recovery_key, **kwargs)
    assert set(names) == {BACKUP_SECRET, MASTER_SECRET}
    assert new.vault.get(BACKUP_SECRET) == "YmFja3VwIGtleQ"
    changes = new.take_changes()
    assert [s.name for s in changes.secrets] == sorted(names)
    assert b"YmFja3VwIGtleQ" not in b"".join(s.sealed for s in changes.secrets)


def test_a_wrong_recovery_key_or_passphrase_changes_nothing() -> None:
    old, new = _machines()
    old.vault.put(BACKUP_SECRET, "YmFja3VwIGtleQ")
    state = _state("@me:x", _server_after(setup_recovery(old, passphrase="right").requests))
    with pytest.raises(WrongRecoveryKey, match="wrong recovery key"):
        recover(new, state, recovery_key=encode_recovery_key(os.urandom(32)))
    with pytest.raises(WrongRecoveryKey):
        recover(new, state, passphrase="wrong")
    assert new.vault.names() == [] and not new.has_unsaved_changes


def test_a_damaged_secret_fails_its_mac_and_nothing_is_kept() -> None:
    old, new = _machines()
    old.vault.put(BACKUP_SECRET, "YmFja3VwIGtleQ")
    old.vault.put(MASTER_SECRET, "bWFzdGVyIHNlZWQ")
    setup = setup_recovery(old)
    data = _server_after(setup.requests)
    entry = data[MASTER_SECRET]["encrypted"][setup.key_id]
    raw = bytearray(base64.b64decode(entry["ciphertext"]))
    raw[0] ^= 1
    entry["ciphertext"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(SecretStorageError, match="MAC"):
        recover(new, _state("@me:x", data), recovery_key=setup.recovery_key)
    assert new.vault.names() == []  # the backup key, which was fine, was not kept either


def test_no_secret_storage_is_a_clear_error() -> None:
    _old, new = _machines()
    with pytest.raises(SecretStorageError, match="no default secret storage key"):
        recover(new, SecretStorageState(None, None, {}), recovery_key="x")
