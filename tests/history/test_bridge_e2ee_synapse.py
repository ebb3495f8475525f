"""`gapline bridge` in an encrypted room on a real Synapse, with matrix-nio as the peer.

The bridge process reads what nio encrypted (a row with the plaintext, marked
``encrypted``), sends encrypted (nio reads it), and shows nio's messages whose
key is held back as UTD rows that become the message by ``Set`` diffs once the
key arrives.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gapline.history import EventItem
from gapline.history._accounts import account_dirname
from gapline.matrix import Session
from tests.e2ee.synapse_peers import NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.history.test_bridge_synapse import BridgeProcess, open_and_load

pytestmark = pytest.mark.timeout(240)


def _row(bridge: BridgeProcess, room: str, event_id: str) -> EventItem | None:
    for item in bridge.mirror.items(room) or ():
        if isinstance(item, EventItem) and item.event_id == event_id:
            return item
    return None


async def _sees_device(nio: NioDevice, user_id: str, device_id: str) -> None:
    for _ in range(40):
        await nio.step(timeout_ms=500)
        if any(
            d.device_id == device_id for d in nio.client.device_store.active_user_devices(user_id)
        ):
            return
    raise AssertionError("nio never saw the bridge's device keys")


async def test_the_bridge_reads_sends_and_heals_in_an_encrypted_room(
    synapse_kit: SynapseKit, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    store = tmp_path / "store"
    bridge = await BridgeProcess.start(synapse_kit, alice.user_id, store)
    try:
        await open_and_load(bridge, room)
        device = json.loads((store / account_dirname(alice.user_id) / "device.json").read_text())[
            "device_id"
        ]
        await _sees_device(nio, alice.user_id, device)

        # nio's key is held back: the bridge shows UTD rows, then heals them in place.
        session_id, held = await nio.hold_back_room_key(room)
        late = await nio.send_text(room, "read me later")
        await bridge.until(lambda: _row(bridge, room, late) is not None)
        utd = _row(bridge, room, late)
        assert utd is not None and utd.body is None and utd.encrypted
        assert utd.decryption is not None and utd.decryption.session_id == session_id
        mark = len(bridge.lines)
        async with synapse_kit.client(nio.session) as as_nio:
            await as_nio.send_to_device("m.room.encrypted", held, "late-key")
        await bridge.until(lambda: (r := _row(bridge, room, late)) is not None and bool(r.body))
        healed = _row(bridge, room, late)
        assert healed is not None and healed.id == utd.id and healed.body == "read me later"
        assert healed.decryption is None
        after = [line["event"] for line in bridge.lines[mark:] if "event" in line]
        assert not any("TimelineReset" in e for e in after)
        sets = [
            d["Set"]["value"]["Event"]["event_id"]
            for e in after
            if "TimelineChanged" in e
            for d in e["TimelineChanged"]["diffs"]
            if isinstance(d, dict) and "Set" in d and "Event" in d["Set"]["value"]
        ]
        assert sets == [late]

        # The session is known now: nio's next message decrypts as it arrives.
        first = await nio.send_text(room, "nio to the bridge")
        await bridge.until(lambda: (r := _row(bridge, room, first)) is not None and bool(r.body))
        row = _row(bridge, room, first)
        assert row is not None and row.encrypted and row.body == "nio to the bridge"

        _, answer = await bridge.request(
            {"SendMessage": {"room_id": room, "body": "bridge to nio"}}
        )
        assert answer == "Ok"
        await nio.wait_until(lambda: "bridge to nio" in nio.bodies.values())
        await bridge.shutdown()
    finally:
        if bridge.proc.returncode is None:
            bridge.proc.kill()
            await asyncio.wait_for(bridge.proc.wait(), 30)
