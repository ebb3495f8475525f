"""The account's access token, sealed in its store with the store key.

The token is a credential (whoever holds it reads and sends as the account), so it is
kept like the device's keys: AES-GCM under the store's key, which only the passphrase
unwraps. The identifiers beside it (user, device, homeserver) are the associated data,
so a sealed token moved to another row or another store does not open. One row: an
account directory holds one login.
"""

from __future__ import annotations

from gapline.history._cache_store import Cipher
from gapline.matrix import Session
from gapline.storage import Backend, Migration, Tx

__all__ = ["SESSION_MIGRATIONS", "SESSION_SCHEMA", "forget_session", "load_session", "save_session"]

SESSION_SCHEMA = "history_session"
_V1 = """
CREATE TABLE history_session (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    homeserver TEXT NOT NULL,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    sealed_token BLOB NOT NULL   -- 0x01 || nonce || AES-256-GCM(store key, token) || tag
)"""
SESSION_MIGRATIONS = [
    Migration(
        1, "the account's access token, sealed", sqlite=_V1, postgres=_V1.replace("BLOB", "BYTEA")
    )
]


def _aad(homeserver: str, user_id: str, device_id: str) -> bytes:
    return "\x00".join(("gapline/history/session/v1", homeserver, user_id, device_id)).encode()


async def load_session(backend: Backend, cipher: Cipher) -> Session | None:
    """The stored login, or None; a token that fails to open raises `CipherError`."""
    await backend.migrate(SESSION_SCHEMA, SESSION_MIGRATIONS)
    row = await backend.read(
        lambda tx: tx.one(
            "SELECT homeserver, user_id, device_id, sealed_token FROM history_session WHERE id = 1"
        )
    )
    if row is None:
        return None
    homeserver, user_id, device_id = str(row[0]), str(row[1]), str(row[2])
    token = cipher.decrypt(bytes(row[3]), _aad(homeserver, user_id, device_id))
    return Session(homeserver, user_id, device_id, token.decode("utf-8"))


async def save_session(backend: Backend, cipher: Cipher, session: Session) -> None:
    """Keep ``session`` as the account's one login (replacing the one before)."""
    await backend.migrate(SESSION_SCHEMA, SESSION_MIGRATIONS)
    sealed = cipher.encrypt(
        session.access_token.encode("utf-8"),
        _aad(session.homeserver, session.user_id, session.device_id),
    )

    def write(tx: Tx) -> None:
        tx.execute("DELETE FROM history_session WHERE id = 1")
        tx.execute(
            "INSERT INTO history_session (id, homeserver, user_id, device_id, sealed_token)"
            " VALUES (1, ?, ?, ?, ?)",
            (session.homeserver, session.user_id, session.device_id, sealed),
        )

    await backend.write(write)


async def forget_session(backend: Backend) -> None:
    """Delete the stored login (after a logout: the token is dead anyway)."""
    await backend.migrate(SESSION_SCHEMA, SESSION_MIGRATIONS)
    await backend.write(lambda tx: tx.execute("DELETE FROM history_session WHERE id = 1"))
