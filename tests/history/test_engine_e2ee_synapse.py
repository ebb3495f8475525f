"""The client engine in encrypted rooms on a real Synapse, with matrix-nio as the peer.

nio (vodozemac through its own crypto) sends and the engine's rows show the
plaintext; the engine sends and nio reads it; nio's key arrives late and the
engine's UTD rows heal by ``Set`` diffs (same row ids, no reset); the engine
restarts between messages on its store and is the same device; after a
session nothing of the plaintext or the keys is readable in the store's files.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest

from gapline.history import (
    Engine,
    Event,
    EventItem,
    Ok,
    OpenRoom,
    SendMessage,
    Set,
    TimelineChanged,
    TimelineReset,
    UtdReason,
)
from gapline.matrix import MatrixClient, Session
from gapline.storage import KdfParams
from tests.e2ee.synapse_peers import NioDevice

pytestmark = pytest.mark.timeout(240)

ROUNDS = 40


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)


@contextlib.asynccontextmanager
async def gapline(
    kit: Any, session: Session, store: Path, sink: Sink
) -> AsyncGenerator[tuple[Engine, MatrixClient]]:
    async with (
        MatrixClient(kit.base_url, session=session, trust_env=False) as client,
        Engine.open(
            store, client, passphrase="pw", sink=sink, sync=False, send=True, e2ee=True,
            kdf_cost=KdfParams.cheap(),
        ) as engine,
    ):  # fmt: skip
        yield engine, client


def rows(engine: Engine, room: str) -> dict[str, EventItem]:
    return {r.event_id: r for r in engine.timeline(room).state.items if isinstance(r, EventItem)}


async def until(engine: Engine, room: str, done: Callable[[dict[str, EventItem]], bool]) -> None:
    for _ in range(ROUNDS):
        await engine.sync_once(timeout_ms=1000)
        await engine.flush_history(room)
        if done(rows(engine, room)):
            return
    raise AssertionError("the engine never showed what was expected")


async def test_nio_and_the_engine_read_each_other_across_a_restart(
    synapse_kit: Any, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    store = tmp_path / "alice"
    sink = Sink()
    async with gapline(synapse_kit, alice, store, sink) as (engine, _):
        await engine.sync_once()
        await engine.execute(OpenRoom(room))
        await nio.step()
        first = await nio.send_text(room, "hello from nio")
        await until(engine, room, lambda r: first in r and r[first].body is not None)
        nio_key = str(nio.olm.outbound_group_sessions[room].session_key).encode()
        row = rows(engine, room)[first]
        assert row.body == "hello from nio" and row.encrypted and row.decryption is None
        assert engine.crypto is not None and engine.crypto.driver is not None
        keys = engine.crypto.driver.machine.identity_keys
        assert await engine.execute(SendMessage(room, "hello from gapline")) == Ok()
        await engine.send_queue.wait_sent(1)  # queued, then sent before the engine closes
    await nio.wait_until(lambda: "hello from gapline" in nio.bodies.values())
    async with gapline(synapse_kit, alice, store, sink) as (engine, _):
        await engine.sync_once()
        assert engine.crypto is not None and engine.crypto.driver is not None
        assert engine.crypto.driver.machine.identity_keys == keys  # the same device
        await engine.execute(OpenRoom(room))
        second = await nio.send_text(room, "after the restart")
        await until(engine, room, lambda r: second in r and r[second].body is not None)
        assert rows(engine, room)[first].body == "hello from nio"  # kept, decrypted
        assert await engine.execute(SendMessage(room, "gapline after the restart")) == Ok()
        await engine.send_queue.wait_sent(1)
        secrets = [b"hello from nio", b"after the restart", b"hello from gapline",
                   b"gapline after the restart", nio_key, nio_key[:43]]  # fmt: skip
        files = [p.name for p in store.rglob("*")]
        assert "history.sqlite3-wal" in files, files  # open: the WAL holds the latest writes
        _assert_nothing_readable(store, secrets)
    await nio.wait_until(lambda: "gapline after the restart" in nio.bodies.values())
    _assert_nothing_readable(store, secrets)  # and closed


async def test_a_late_nio_key_heals_the_rows_by_set_diffs(
    synapse_kit: Any, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    sink = Sink()
    async with gapline(synapse_kit, alice, tmp_path / "alice", sink) as (engine, _):
        await engine.sync_once()
        await engine.execute(OpenRoom(room))
        await nio.step()
        session_id, held = await nio.hold_back_room_key(room)
        late = [await nio.send_text(room, f"later {i}") for i in range(2)]
        await until(engine, room, lambda r: all(e in r for e in late))
        for event_id in late:
            row = rows(engine, room)[event_id]
            assert row.body is None and row.decryption is not None
            assert row.decryption.reason is UtdReason.MISSING_ROOM_KEY
            assert row.decryption.session_id == session_id
        ids = [r.id for r in engine.timeline(room).state.items]
        sink.events.clear()
        async with synapse_kit.client(nio.session) as as_nio:
            await as_nio.send_to_device("m.room.encrypted", held, "late-key")
        await until(engine, room, lambda r: all(r[e].body is not None for e in late))
        assert [rows(engine, room)[e].body for e in late] == ["later 0", "later 1"]
        assert [r.id for r in engine.timeline(room).state.items] == ids
        assert not any(isinstance(e, TimelineReset) for e in sink.events)
        sets = [
            d.value.event_id
            for e in sink.events
            if isinstance(e, TimelineChanged)
            for d in e.diffs
            if isinstance(d, Set) and isinstance(d.value, EventItem)
        ]
        assert sorted(sets) == sorted(late)


def _assert_nothing_readable(store: Path, secrets: list[bytes]) -> None:
    """Every file under the store (database, WAL, shared memory) holds none of these."""
    files = [p for p in store.rglob("*") if p.is_file()]
    assert any(p.name == "history.sqlite3" for p in files), files
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret not in data, f"{secret!r} readable in {path.name}"
