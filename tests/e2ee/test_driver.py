"""`CryptoDriver` over a `MatrixClient` (HTTP into the key server) and a SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gapline.e2ee import CryptoDriver, DecryptedEvent, ShareState, load_state
from gapline.matrix import MatrixClient, Session
from gapline.storage import Backend, Tx, open_backend

from .harness import Clock, Room, online
from .keyserver import KeyServer


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[Backend]:
    b = await open_backend(str(tmp_path / "driver.db"))
    try:
        yield b
    finally:
        await b.close()


async def _driver(backend: Backend, server: KeyServer, clock: Clock) -> CryptoDriver:
    server.register("@carol:x", "C1")
    client = MatrixClient(
        "https://hs.example",
        session=Session("https://hs.example", "@carol:x", "C1", "t"),
        transport=server.transport(("@carol:x", "C1")),
    )
    driver = await CryptoDriver.open(backend, client, b"k" * 32, clock=clock)
    await driver.send_outgoing()
    return driver


async def test_the_driver_shares_encrypts_and_decrypts_in_batches(backend: Backend) -> None:
    server, clock = KeyServer(), Clock()
    driver = await _driver(backend, server, clock)
    (bob,) = online(server, clock, ("@bob:x", "B1"))
    assert "@carol:x" in server.device_keys
    room = Room("!r:x", members={"@carol:x", "@bob:x"})
    settings = {"algorithm": "m.megolm.v1.aes-sha2", "rotation_period_msgs": 1000}
    driver.machine.set_room_encryption(room.room_id, settings)
    bob.join(room, settings)
    report = await driver.share_room_key(room.room_id, sorted(room.members))
    assert report.state is ShareState.READY and report.shared_with == (("@bob:x", "B1"),)
    contents = [
        await driver.encrypt(room.room_id, "m.room.message", {"body": f"b{i}"}) for i in range(150)
    ]
    events = [room.add("@carol:x", "m.room.encrypted", c) for c in contents]
    bob.sync()
    assert bob.body(room, events[-1]) == "b149"
    results = await driver.decrypt_room_events(room.room_id, events, batch=64)  # our own messages
    assert [r.content["body"] for r in results if isinstance(r, DecryptedEvent)] == [
        f"b{i}" for i in range(150)
    ]
    await driver.commit()
    state = await backend.read(load_state)
    assert len(state.seen) == 150 and state.outbound_sessions[0].message_count == 150


async def test_a_failed_commit_reopens_the_machine_from_the_store(backend: Backend) -> None:
    server, clock = KeyServer(), Clock()
    driver = await _driver(backend, server, clock)
    before = driver.machine
    driver.machine.set_room_encryption("!r:x", {"algorithm": "m.megolm.v1.aes-sha2"})

    def fail(tx: Tx) -> None:
        raise RuntimeError("the caller's own write failed")

    with pytest.raises(RuntimeError):
        await driver.commit(also=fail)
    assert driver.machine is not before
    assert not driver.machine.is_room_encrypted("!r:x")  # what the store holds
    assert driver.machine.identity_keys == before.identity_keys


def test_an_initial_sync_queries_every_tracked_user_again() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    alice.machine.update_tracked_users(["@bob:x"])
    alice.pump()
    online(server, clock, ("@bob:x", "B2"))
    server.changed[alice.me].clear()  # an initial sync reports no device-list changes
    alice.machine.receive_sync(server.sync(*alice.me), initial=True)
    alice.pump()
    assert {d.device_id for d in alice.machine.devices_of("@bob:x")} == {"B1", "B2"}


class _ChangesDuringWrite:
    """A backend whose next write lets another step change the machine meanwhile (as a
    fill decrypting while a commit of the driver's is under way)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.during_next_write: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def write(self, op: Callable[[Tx], Any]) -> Any:
        result = await self._backend.write(op)
        step, self.during_next_write = self.during_next_write, None
        if step is not None:
            step()
        return result


async def test_changes_made_while_a_commit_runs_are_saved_before_requests_are_sent(
    backend: Backend,
) -> None:
    server, clock = KeyServer(), Clock()
    online(server, clock, ("@bob:x", "B1"))
    racing = _ChangesDuringWrite(backend)
    driver = await _driver(racing, server, clock)  # ty: ignore[invalid-argument-type]
    driver.machine.update_tracked_users(["@bob:x"])  # a change, and a keys query to send
    racing.during_next_write = lambda: driver.machine.set_room_encryption(
        "!other:x", {"algorithm": "m.megolm.v1.aes-sha2"}
    )
    await driver.send_outgoing()  # used to raise UnsavedChanges after its first commit
    assert racing.during_next_write is None and not driver.machine.has_unsaved_changes
    state = await backend.read(load_state)
    assert "!other:x" in {r.room_id for r in state.rooms}
    assert "B1" in {d.device_id for d in driver.machine.devices_of("@bob:x")}
