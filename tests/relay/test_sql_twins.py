"""The PostgreSQL forms of store rules agree with their generic twins.

Each statement of ``gapline.relay._store._sql_postgres`` restates a rule whose generic form
lives in a sibling module. Here both forms run on their own databases (the generic one on
SQLite, the PostgreSQL one on PostgreSQL) with the same inputs: the outcome of every
operation, the rows left behind and the notifications sent must be equal. A comparison
that cannot fail proves nothing, so each also runs with one twin slightly changed (the
kind of slip a later edit could make) and must then find a difference.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gapline.relay import TimelineStore
from gapline.relay._errors import RelayFailure
from gapline.relay._store import (
    TIMELINE_CHANNEL,
    DeviceEntry,
    KeyBox,
    NewSend,
    NewState,
    Session,
    _accounts,
    _sql_postgres,
    _timeline,
)
from gapline.storage import Backend, Dialect, OperationalError, open_backend
from tests.relay.store_inputs import new_send

pytestmark = pytest.mark.postgres

T = 1_800_000_000
RETENTION = 50

# Device windows chosen so that sends land before, on and after their edges.
DEVICES = {
    "alice": [("a0", 0, T + 1000), ("a1", T + 10, T + 20)],
    "bob": [("b0", 0, T + 1000), ("b1", 0, T + 5)],
    "carol": [("c0", T + 3, T + 1000)],
}

Run = dict[str, Any]

# The tables each rule writes, with their primary keys (the order rows are compared in).
SEND_ROWS = {
    "sends": "from_account, message_id",
    "account_heads": "account",
    "timeline_records": "account, sequence",
    "timeline_visibility": "account, device_id, sequence",
}
STATE_ROWS = {
    "device_states": "account",
    "account_devices": "account, device_id",
    "device_certificates": "device_id",
    "sessions": "token_hash",
}


def _send(sender: str, to: str, message_id: str, now: int, **changes: Any) -> NewSend:
    own = {a: [d for d, _, _ in devices] for a, devices in DEVICES.items()}
    return new_send(sender, to, message_id, own, now=now, retention=RETENTION, **changes)


SENDS = [
    _send("alice", "bob", "m1", T),  # both bob devices, alice's a0 only
    _send("bob", "alice", "m2", T + 4),  # b1's last valid second
    _send("bob", "alice", "m3", T + 5),  # b1 expired exactly now
    _send("alice", "carol", "m4", T + 2),  # carol's only device not yet valid
    _send("alice", "carol", "m4", T + 3),  # ... valid from now: the key is still new
    _send("alice", "carol", "m4", T + 9),  # a retry: the stored result
    _send("alice", "carol", "m4", T + 9, digest="other"),  # a retry with other content
    _send("carol", "alice", "m5", T + 10),  # a1's first valid second
    _send("carol", "alice", "m6", T + 20),  # a1 expired exactly now
    _send("alice", "bob", "m7", T + 6, sender_boxes=None),  # no sent record
    _send("alice", "alice", "m8", T + 12, sender_boxes=None),  # self-delivery
    _send("alice", "bob", "m9", T + 6, sender_boxes=(KeyBox("a1", "{}"),)),  # a1 not valid
    _send("alice", "bob", "m10", T, refusal=RelayFailure("message_expired", "too old")),
    _send("alice", "bob", "m1", T + 30, refusal=RelayFailure("clock_skew", "late")),  # retry
    _send("bob", "carol", "m11", T + 7, recipient_boxes=(KeyBox("c9", "{}"),)),  # unknown
    _send("alice", "bob", "m12", T + 5, recipient_boxes=(KeyBox("b1", "{}"),)),  # b1 expired
]


def _outcome_of(result: Any) -> tuple[Any, ...]:
    if isinstance(result, RelayFailure):
        return ("failed", result.code, result.message)
    if isinstance(result, bool):  # a publish: new, or an identical repeat
        return ("published", result)
    return ("accepted", result.result.to_json(), result.duplicate, result.appended)


async def _attempt(operation: Awaitable[Any]) -> tuple[Any, ...]:
    try:
        return _outcome_of(await operation)
    except RelayFailure as failure:
        return _outcome_of(failure)


async def _rows(backend: Backend, tables: dict[str, str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of each table, in primary-key order."""

    def dump(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
        return {
            table: [tuple(r) for r in tx.all(f"SELECT * FROM {table} ORDER BY {key} LIMIT 1000")]
            for table, key in tables.items()
        }

    return await backend.read(dump)


async def _notified(backend: Backend, scenario: Callable[[], Awaitable[None]]) -> list[str]:
    """The timeline notifications ``scenario`` sent, in order (read up to an end marker).

    The subscription ends when the backend closes.
    """
    notes = backend.subscribe(TIMELINE_CHANNEL)
    await scenario()
    await backend.write(lambda tx: tx.notify(TIMELINE_CHANNEL, "end"))
    seen: list[str] = []
    async with asyncio.timeout(30):
        async for note in notes:
            if note == "end":
                return seen
            seen.append(note)
    raise AssertionError("the notifications ended before the end marker")


async def _both(
    run: Callable[[Backend], Awaitable[Run]], backends: dict[Dialect, Backend]
) -> tuple[Run, Run]:
    """``run`` on the generic form's database, then on PostgreSQL."""
    return await run(backends[Dialect.SQLITE]), await run(backends[Dialect.POSTGRES])


@pytest.fixture
async def backends(tmp_path: Path, postgres_dsn: str) -> AsyncIterator[dict[Dialect, Backend]]:
    """A migrated store database on each side: the generic form's and PostgreSQL's."""
    opened = {
        Dialect.SQLITE: await open_backend(str(tmp_path / "twins.db")),
        Dialect.POSTGRES: await open_backend(postgres_dsn),
    }
    try:
        for backend in opened.values():
            await TimelineStore(backend, lambda: T).migrate()
        yield opened
    finally:
        for backend in opened.values():
            await backend.close()


# -- accepting a send: _sends.accept_batch + _timeline.append vs send_in_one_statement --


async def _send_run(backend: Backend) -> Run:
    store = TimelineStore(backend, lambda: T)
    for account, devices in DEVICES.items():
        entries = tuple(DeviceEntry(d, nb, exp, f"cert-{d}") for d, nb, exp in devices)
        await store.accounts.publish_state(NewState(account, 1, f"state-{account}", entries))
    outcomes: list[tuple[Any, ...]] = []

    async def scenario() -> None:
        for send in SENDS:
            outcomes.append(await _attempt(store.sends.accept(send)))

    notes = await _notified(backend, scenario)
    return {"outcomes": outcomes, "notifications": notes, "rows": await _rows(backend, SEND_ROWS)}


async def _send_runs(backends: dict[Dialect, Backend]) -> tuple[Run, Run]:
    return await _both(_send_run, backends)


async def test_a_send_has_the_same_outcome_and_rows_on_both_paths(
    backends: dict[Dialect, Backend],
) -> None:
    generic, postgres = await _send_runs(backends)
    assert postgres == generic
    # The scenario reaches every kind of outcome, and both edges of a device window.
    kinds = {
        o[1] if o[0] == "failed" else ("duplicate" if o[2] else "new") for o in generic["outcomes"]
    }
    assert kinds == {"new", "duplicate", "device_unknown", "state_conflict", "message_expired"}
    assert len(generic["notifications"]) == sum(
        len(o[3]) for o in generic["outcomes"] if o[0] == "accepted"
    )


async def test_a_changed_postgres_send_is_caught(
    backends: dict[Dialect, Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _sql_postgres.send_in_one_statement

    def off_by_a_second(**kw: Any) -> tuple[str, tuple[Any, ...]]:
        sql, params = real(**kw)
        changed = sql.replace("expires_at > ?", "expires_at >= ?")  # a device valid one more second
        assert changed != sql
        return changed, params

    monkeypatch.setattr(_sql_postgres, "send_in_one_statement", off_by_a_second)
    generic, postgres = await _send_runs(backends)
    assert postgres != generic


async def test_a_changed_generic_send_is_caught(
    backends: dict[Dialect, Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _timeline._heads_sql

    def skips_a_sequence(accounts: int) -> str:
        sql = real(accounts)
        changed = sql.replace("+ excluded.head + 1", "+ excluded.head + 2")
        assert changed != sql
        return changed

    monkeypatch.setattr(_timeline, "_heads_sql", skips_a_sequence)
    generic, postgres = await _send_runs(backends)
    assert postgres != generic


# -- publishing a device state: READ_DEVICE_STATE vs LOCK_DEVICE_STATE ------------------------


def _state(revision: int, devices: list[str], *, content: str = "") -> NewState:
    entries = tuple(DeviceEntry(d, 0, T + 1000, f"cert-{d}{content}") for d in devices)
    return NewState("alice", revision, f"state-{revision}{content}", entries)


PUBLISHES = [
    _state(2, ["a0", "a1"]),  # first state
    _state(2, ["a0", "a1"]),  # identical repeat
    _state(2, ["a0"], content="-other"),  # same revision, other content
    _state(1, ["a0"]),  # stale
    _state(5, ["a0"]),  # replaces: a1 leaves, its session goes
    _state(5, ["a0"]),  # identical repeat
    _state(4, ["a0", "a1"]),  # stale
    _state(6, ["a1"], content="-new"),  # a1 back, a0 leaves; certificates updated
]


async def _state_run(backend: Backend) -> Run:
    store = TimelineStore(backend, lambda: T)
    for device in ("a0", "a1"):
        session = Session("alice", "device", device, "https://relay", T + 100)
        await store.accounts.add_session(f"token-{device}", session)
    outcomes = [await _attempt(store.accounts.publish_state(s)) for s in PUBLISHES]
    # Each database's own form of the read, directly (a locking read needs a write).
    twin = _sql_postgres.LOCK_DEVICE_STATE
    read = twin if backend.dialect is Dialect.POSTGRES else _accounts.READ_DEVICE_STATE
    current = await backend.write(lambda tx: tx.one(read, ("alice",)))
    return {"outcomes": outcomes, "current": current, "rows": await _rows(backend, STATE_ROWS)}


async def _state_runs(backends: dict[Dialect, Backend]) -> tuple[Run, Run]:
    return await _both(_state_run, backends)


def test_the_postgres_state_read_is_the_generic_read_plus_the_lock() -> None:
    """The PostgreSQL form is the generic read plus the row lock, nothing else."""
    assert _sql_postgres.LOCK_DEVICE_STATE == _accounts.READ_DEVICE_STATE + " FOR UPDATE"


async def test_a_publish_has_the_same_outcome_and_rows_on_both_paths(
    backends: dict[Dialect, Backend],
) -> None:
    generic, postgres = await _state_runs(backends)
    assert postgres == generic
    assert [o[1] for o in generic["outcomes"]] == [
        True,
        False,
        "state_conflict",
        "stale_state",
        True,
        False,
        "stale_state",
        True,
    ]


async def test_a_changed_postgres_state_read_is_caught(
    backends: dict[Dialect, Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    changed = _sql_postgres.LOCK_DEVICE_STATE.replace("SELECT revision,", "SELECT revision + 1,")
    assert changed != _sql_postgres.LOCK_DEVICE_STATE
    monkeypatch.setattr(_sql_postgres, "LOCK_DEVICE_STATE", changed)
    generic, postgres = await _state_runs(backends)
    assert postgres != generic


async def test_the_postgres_state_read_locks_the_row(postgres_dsn: str) -> None:
    """What the lock is for: while one relay process decides a publish, another cannot."""
    holder, other = await open_backend(postgres_dsn), await open_backend(postgres_dsn)
    try:
        await TimelineStore(holder, lambda: T).migrate()
        await TimelineStore(holder, lambda: T).accounts.publish_state(_state(1, ["a0"]))

        def probe(tx: Any) -> Any:
            sql = "SELECT 1 FROM device_states WHERE account = ? FOR UPDATE NOWAIT"
            return tx.one(sql, ("alice",))

        async def locked_while_held(read: str) -> bool:
            started, release = threading.Event(), threading.Event()

            def hold(tx: Any) -> None:
                tx.one(read, ("alice",))
                started.set()
                if not release.wait(30):
                    raise AssertionError("never released")

            async with asyncio.TaskGroup() as group:
                group.create_task(holder.write(hold))
                assert await asyncio.to_thread(started.wait, 30)
                try:
                    await other.write(probe)
                except OperationalError as exc:
                    assert getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_not_available
                    return True
                finally:
                    release.set()
            return False

        assert await locked_while_held(_sql_postgres.LOCK_DEVICE_STATE)
        # The check can fail: the generic read takes no lock, so the probe gets the row.
        assert not await locked_while_held(_accounts.READ_DEVICE_STATE)
    finally:
        await holder.close()
        await other.close()
