"""SIGKILL the client engine inside an encrypted sync's write, then restart it: no room key
lost, the retained rows heal, and the Olm session from the peer is still in step (a
later key from the same peer, over the same Olm session, decrypts).

A real Synapse and matrix-nio as the peer. The engine runs in a child process that
holds the write at one point (the sync step that carries a to-device message, or the
heal of the rows a key that just arrived decrypts) and says so on stdout; the parent
kills it there. Nothing is assumed after a delay: the parent waits for the line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gapline.history import Engine, OpenRoom
from gapline.matrix import Session
from tests.e2ee.synapse_peers import NioDevice
from tests.history.e2ee_support import peers as peers  # the fixture
from tests.history.test_engine_e2ee_synapse import Sink, gapline, rows, until

pytestmark = [pytest.mark.synapse, pytest.mark.slow, pytest.mark.timeout(300)]

PASSPHRASE = "pw"

# The child: the engine syncing in a loop. `hold` names where the writer thread stops
# for good: "to-device" in the write of a sync that carries to-device events (the Olm
# state, the keys and the token would commit together), "heal" in the write of one chunk
# of a heal (the key it needs was committed before). It prints "held" there.
DRIVER = r"""
import asyncio, json, sys, threading
from gapline.history import Engine, OpenRoom, _heal_pass, _sync
from gapline.matrix import MatrixClient, Session
from gapline.storage import KdfParams

args = json.loads(sys.argv[1])

def holding(fn, when):
    def held(*a, **k):
        if when(*a):
            print("held", flush=True)
            import sys; print([ (e.type, e.sender, getattr(e, "content", {}).get("sender_key")) for e in a[2].to_device.events] if hasattr(a[2], "to_device") else "", file=sys.stderr, flush=True)
            threading.Event().wait()  # the transaction stays open until the kill
        return fn(*a, **k)
    return held

if args["hold"] == "to-device":
    _sync.commit_encrypted_sync = holding(
        _sync.commit_encrypted_sync, lambda store, tx, response, *rest: response.to_device.events
    )
else:  # the heal's chunks: args["chunk"] rows each; held at the write of chunk args["at"]
    _heal_pass.CHUNK = args.get("chunk", _heal_pass.CHUNK)
    writes = []

    def nth_heal(store, tx, room_id, healed, entries):
        if healed:
            writes.append(len(healed))
        return bool(healed) and len(writes) == args.get("at", 1)

    _heal_pass.heal = holding(_heal_pass.heal, nth_heal)

class Quiet:
    async def publish(self, event):
        pass

async def main():
    session = Session.from_dict(args["session"])
    async with MatrixClient(session.homeserver, session=session, trust_env=False) as client:
        async with Engine.open(args["store"], client, passphrase=args["passphrase"],
                               sink=Quiet(), sync=False, e2ee=True,
                               kdf_cost=KdfParams.cheap()) as engine:
            await engine.execute(OpenRoom(args["room"]))
            print("ready", flush=True)
            while True:
                await engine.sync_once(timeout_ms=1000)

asyncio.run(main())
"""


async def killed_at_hold(
    session: Session, store: Path, room: str, hold: str, act: Callable[[], Any], **extra: int
) -> None:
    """Run the child, do ``act`` once it is syncing, and SIGKILL it where it holds."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DRIVER,
        json.dumps({"session": session.to_dict(), "store": str(store),
                    "passphrase": PASSPHRASE, "room": room, "hold": hold, **extra}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    try:
        for expected in (b"ready", b"held"):
            line = await asyncio.wait_for(child.stdout.readline(), 120)
            assert line, (await child.stderr.read()).decode()[-3000:]
            assert line.strip() == expected, line
            if expected == b"ready":
                await act()
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGKILL)
        await child.wait()
    print("CHILD STDERR", (await child.stderr.read()).decode()[-3000:])
    assert child.returncode == -signal.SIGKILL


async def later_key_decrypts(engine: Engine, nio: NioDevice, room: str) -> None:
    """No Olm desync: a new session's key from the same peer, over the Olm session the
    killed step used, decrypts, and so does the message that needs it."""
    nio.olm.rotate_outbound_group_session(room)
    after = await nio.send_text(room, "after the restart")
    await until(engine, room, lambda r: after in r and r[after].body is not None)
    assert rows(engine, room)[after].body == "after the restart"


async def test_sigkill_before_a_to_device_step_commits_loses_no_key(
    synapse_kit: Any, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    store = tmp_path / "alice"
    async with gapline(synapse_kit, alice, store, Sink()) as (engine, _):
        await engine.sync_once()  # the device and its keys are uploaded
    await nio.step()
    sent: list[str] = []

    async def send() -> None:  # its room key goes to the engine over a new Olm session
        sent.append(await nio.send_text(room, "before the kill"))

    await killed_at_hold(alice, store, room, "to-device", send)
    async with gapline(synapse_kit, alice, store, Sink()) as (engine, _):
        await engine.execute(OpenRoom(room))
        # The step never committed, so the server delivers the to-device message again.
        await until(engine, room, lambda r: sent[0] in r and r[sent[0]].body is not None)
        assert rows(engine, room)[sent[0]].body == "before the kill"
        assert rows(engine, room)[sent[0]].decryption is None
        await later_key_decrypts(engine, nio, room)


@pytest.mark.parametrize("at", [1, 2], ids=["first-chunk", "second-chunk"])
async def test_sigkill_after_a_key_arrived_before_its_rows_healed(
    synapse_kit: Any, tmp_path: Path, peers: tuple[Session, NioDevice, str], at: int
) -> None:
    """Killed in the write of a heal's first chunk (nothing healed yet) or its second (the
    first chunk healed): the key was committed first, so the restart heals the rest."""
    alice, nio, room = peers
    store = tmp_path / "alice"
    async with gapline(synapse_kit, alice, store, Sink()) as (engine, _):
        await engine.sync_once()
        await engine.execute(OpenRoom(room))
        await nio.step()
        session_id, held = await nio.hold_back_room_key(room)
        late = [await nio.send_text(room, f"late {i}") for i in range(3)]
        await until(engine, room, lambda r: all(e in r for e in late))
        for event_id in late:
            row = rows(engine, room)[event_id]
            assert row.body is None and row.decryption is not None
            assert row.decryption.session_id == session_id

    async def deliver() -> None:
        async with synapse_kit.client(nio.session) as as_nio:
            await as_nio.send_to_device("m.room.encrypted", held, "late-key")

    await killed_at_hold(alice, store, room, "heal", deliver, chunk=2, at=at)
    async with gapline(synapse_kit, alice, store, Sink()) as (engine, _):
        await engine.execute(OpenRoom(room))
        ids = {e: rows(engine, room)[e].id for e in late}
        healed = [rows(engine, room)[e].body is not None for e in late]
        # Each chunk whole or not at all: the chunks written before the kill, no more.
        assert healed == [True] * (2 * (at - 1)) + [False] * (3 - 2 * (at - 1))
        await until(engine, room, lambda r: all(r[e].body is not None for e in late))
        assert [rows(engine, room)[e].body for e in late] == ["late 0", "late 1", "late 2"]
        assert {e: rows(engine, room)[e].id for e in late} == ids  # healed in place
        await later_key_decrypts(engine, nio, room)
