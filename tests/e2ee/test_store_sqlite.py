"""The e2ee store on SQLite: the shared contract, and no secret in the clear on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.storage import open_backend

from .harness import export_session
from .store_contract import CryptoStoreContract, paired
from .store_contract_keys import KeyStoreContract


def _store_bytes(directory: Path) -> bytes:
    return b"".join(
        p.read_bytes() for p in sorted(directory.iterdir()) if p.name.startswith("secret.db")
    )


class TestSQLiteCryptoStore(CryptoStoreContract, KeyStoreContract):
    @pytest.fixture
    def dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "e2ee.db")


del CryptoStoreContract, KeyStoreContract


async def test_no_plaintext_and_no_session_key_reaches_the_files(tmp_path: Path) -> None:
    path = tmp_path / "secret.db"
    backend = await open_backend(str(path))
    try:
        _server, _clock, alice, bob, room = await paired(backend)
        event = alice.send(room, "zebra-quartz-unmistakable")
        bob.sync()
        assert bob.body(room, event) == "zebra-quartz-unmistakable"
        reply = bob.send(room, "walrus-obsidian-unmistakable")
        await bob.flush()
        session = alice.machine.inbound._sessions[
            (room.room_id, event.content["session_id"])
        ].session
        secrets = [
            b"zebra-quartz-unmistakable",
            b"walrus-obsidian-unmistakable",
            export_session(session).encode(),  # alice's session key, as bob holds it
            bob.machine.outbound._sessions[room.room_id].session.session_key.to_base64().encode(),
        ]
        assert reply.content["session_id"]
        data_open = _store_bytes(tmp_path)  # the database and its WAL, still open
    finally:
        await backend.close()
    data = data_open + _store_bytes(tmp_path)
    assert (
        len(data) > 10_000 and bob.machine.identity_keys["curve25519"].encode() in data
    )  # public keys are there
    for secret in secrets:
        assert secret not in data, secret[:20]
