"""Accounts: each account's authoritative device state, its devices and their certificates,
the authentication challenges issued for it and the sessions they opened.

A device is valid at instant t when the account's current state lists it and
``not_before <= t < expires_at`` (its certificate's window). Publishing a state replaces
the account's device list whole; certificates stay per device after it leaves the state,
so a sync page can still carry the certificate of a sender device since removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gapline.relay._errors import RelayFailure
from gapline.relay._store import _sql_postgres
from gapline.relay._store._rows import chunks
from gapline.storage import Backend, Dialect, IntegrityError, Tx

__all__ = [
    "DEVICE_STATE_CHANNEL",
    "READ_DEVICE_STATE",
    "Accounts",
    "DeviceEntry",
    "NewState",
    "Session",
    "certificates",
    "device_windows",
    "expire",
]

# Notification channel (Tx.notify): payload "<account> <revision>".
DEVICE_STATE_CHANNEL = "meshline_device_state"


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    device_id: str
    not_before: int
    expires_at: int
    certificate: str  # canonical JSON of the DeviceCertificate


@dataclass(frozen=True, slots=True)
class NewState:
    """A verified ``AccountDeviceState``."""

    account: str
    revision: int
    canonical: str
    devices: tuple[DeviceEntry, ...]


@dataclass(frozen=True, slots=True)
class Session:
    account: str
    mode: str  # "device" | "account"
    device_id: str | None
    origin: str
    expires_at: int


# The current revision of an account's state, read before replacing it. SQLite has one
# writer, so nothing changes the row between this read and the write that follows it.
# Twin: _sql_postgres.LOCK_DEVICE_STATE, which locks the row for that on PostgreSQL.
READ_DEVICE_STATE = "SELECT revision, canonical FROM device_states WHERE account = ?"

# Every device of some accounts with its validity window (covered by the primary key
# (account, device_id)). A device state holds at most 8 certificates
# (DEVICE_STATE_MAX_CERTIFICATES): the LIMIT of 64 per account bounds the read without
# ever cutting a real state short.
DEVICE_WINDOWS = (
    "SELECT account, device_id, not_before, expires_at FROM account_devices"
    " WHERE account IN ({marks}) LIMIT ?"
)


def device_windows(tx: Tx, accounts: list[str]) -> dict[str, list[tuple[str, int, int]]]:
    """(device_id, not_before, expires_at) of every device of each of ``accounts``."""
    windows: dict[str, list[tuple[str, int, int]]] = {a: [] for a in accounts}
    for part in chunks(accounts):
        sql = DEVICE_WINDOWS.format(marks=", ".join("?" * len(part)))
        for account, device_id, not_before, expires_at in tx.all(sql, (*part, 64 * len(part))):
            windows[str(account)].append((str(device_id), int(not_before), int(expires_at)))
    return windows


def certificates(tx: Tx, device_ids: Sequence[str]) -> tuple[str, ...]:
    """The stored certificate of each of ``device_ids`` that has one."""
    if not device_ids:
        return ()
    marks = ",".join("?" * len(device_ids))
    return tuple(
        str(r[0])
        for r in tx.all(
            f"SELECT certificate FROM device_certificates WHERE device_id IN ({marks})",
            device_ids,
        )
    )


def expire(tx: Tx, now: int) -> None:
    """Delete the challenges and sessions past their deadline."""
    tx.execute("DELETE FROM auth_challenges WHERE expires_at <= ?", (now,))
    tx.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))


class Accounts:
    """Device states, certificates, challenges and sessions. Each method is one operation."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # -- device state ------------------------------------------------------------------

    async def publish_state(self, state: NewState) -> bool:
        """Accept ``state`` as authoritative. True when it is new (not an identical repeat).

        Raises ``stale_state`` for a lower revision and ``state_conflict`` for an equal
        revision with different canonical content. Device sessions of devices that left
        the state are deleted in the same transaction.
        """

        def op(tx: Tx) -> bool:
            postgres = tx.dialect is Dialect.POSTGRES
            current = _sql_postgres.LOCK_DEVICE_STATE if postgres else READ_DEVICE_STATE
            cur = tx.one(current, (state.account,))
            if cur is not None:
                if state.revision < int(cur[0]):
                    raise RelayFailure("stale_state", "a higher revision is already accepted")
                if state.revision == int(cur[0]):
                    if state.canonical == cur[1]:
                        return False
                    raise RelayFailure(
                        "state_conflict", "this revision was accepted with different content"
                    )
                tx.execute(
                    "UPDATE device_states SET revision = ?, canonical = ? WHERE account = ?",
                    (state.revision, state.canonical, state.account),
                )
            else:
                tx.execute(
                    "INSERT INTO device_states (account, revision, canonical) VALUES (?, ?, ?)",
                    (state.account, state.revision, state.canonical),
                )
            tx.execute("DELETE FROM account_devices WHERE account = ?", (state.account,))
            tx.executemany(
                "INSERT INTO account_devices (account, device_id, not_before, expires_at) "
                "VALUES (?, ?, ?, ?)",
                [(state.account, d.device_id, d.not_before, d.expires_at) for d in state.devices],
            )
            for d in state.devices:
                tx.execute(
                    "INSERT INTO device_certificates (device_id, account, certificate) "
                    "VALUES (?, ?, ?) ON CONFLICT (device_id) DO UPDATE SET "
                    "certificate = excluded.certificate, account = excluded.account",
                    (d.device_id, state.account, d.certificate),
                )
            keep = [d.device_id for d in state.devices]
            marks = ",".join("?" * len(keep))
            tx.execute(
                "DELETE FROM sessions WHERE account = ? AND mode = 'device'"
                + (f" AND device_id NOT IN ({marks})" if keep else ""),
                (state.account, *keep),
            )
            tx.notify(DEVICE_STATE_CHANNEL, f"{state.account} {state.revision}")
            return True

        try:
            return await self.backend.write(op)
        except IntegrityError as exc:  # a concurrent first publish for the same account
            raise RelayFailure("state_conflict", "concurrent device state publish") from exc

    async def resolve_state(self, account: str) -> str | None:
        def op(tx: Tx) -> str | None:
            row = tx.one("SELECT canonical FROM device_states WHERE account = ?", (account,))
            return None if row is None else str(row[0])

        return await self.backend.read(op)

    async def device_window(self, account: str, device_id: str) -> tuple[int, int] | None:
        """(not_before, expires_at) of ``device_id`` in ``account``'s current state, if present."""

        def op(tx: Tx) -> tuple[int, int] | None:
            row = tx.one(
                "SELECT not_before, expires_at FROM account_devices "
                "WHERE account = ? AND device_id = ?",
                (account, device_id),
            )
            return None if row is None else (int(row[0]), int(row[1]))

        return await self.backend.read(op)

    async def remember_certificate(self, device_id: str, account: str, certificate: str) -> None:
        """Keep a remote sender's certificate for sync pages (a known device's stays)."""
        await self.backend.write(
            lambda tx: tx.execute(
                "INSERT INTO device_certificates (device_id, account, certificate) "
                "VALUES (?, ?, ?) ON CONFLICT (device_id) DO NOTHING",
                (device_id, account, certificate),
            )
        )

    async def certificate(self, device_id: str) -> str | None:
        def op(tx: Tx) -> str | None:
            row = tx.one(
                "SELECT certificate FROM device_certificates WHERE device_id = ?", (device_id,)
            )
            return None if row is None else str(row[0])

        return await self.backend.read(op)

    # -- challenges and sessions -------------------------------------------------------

    async def add_challenge(self, nonce: str, account: str, expires_at: int) -> None:
        def op(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO auth_challenges (nonce, account, expires_at) VALUES (?, ?, ?)",
                (nonce, account, expires_at),
            )

        await self.backend.write(op)

    async def consume_challenge(self, nonce: str) -> tuple[str, int] | None:
        """(account, expires_at) of ``nonce``, deleting it: a nonce is consumed on first use."""

        def op(tx: Tx) -> tuple[str, int] | None:
            row = tx.one(
                "DELETE FROM auth_challenges WHERE nonce = ? RETURNING account, expires_at",
                (nonce,),
            )
            return None if row is None else (str(row[0]), int(row[1]))

        return await self.backend.write(op)

    async def add_session(self, token_hash: str, session: Session) -> None:
        def op(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO sessions (token_hash, account, mode, device_id, origin, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    token_hash,
                    session.account,
                    session.mode,
                    session.device_id,
                    session.origin,
                    session.expires_at,
                ),
            )

        await self.backend.write(op)

    async def get_session(self, token_hash: str) -> Session | None:
        def op(tx: Tx) -> Session | None:
            row = tx.one(
                "SELECT account, mode, device_id, origin, expires_at FROM sessions "
                "WHERE token_hash = ?",
                (token_hash,),
            )
            if row is None:
                return None
            return Session(str(row[0]), str(row[1]), row[2], str(row[3]), int(row[4]))

        return await self.backend.read(op)
