"""`gapline bridge` end to end: a real process, the real engine, a real Synapse.

The bridge runs with a small page size so a gap is cheap to make: a first run
retains the room's first messages; while it is down, more messages arrive
than the second run's recent load (one page) can reach, so opening the room
again leaves a durable gap between the fresh window and what was retained.
FillGap then walks it until the sections join.

Every event line is decoded with the strict wire decoders and replayed into a
local Mirror, so the test also holds the engine's diff stream to the rows it
claims: a diff that does not fit raises, and the replay must equal the
bridge's own DumpState.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gapline.history import (
    EventItem,
    HistoryGapItem,
    Mirror,
    RecentHistoryKind,
    RepairPhase,
)
from gapline.history._accounts import account_dirname
from gapline.history._wire_decode import event_from_wire, state_from_wire
from tests.fixtures.synapse import SynapseKit

READ_TIMEOUT = 60.0  # a hung bridge fails the test instead of hanging it


class BridgeProcess:
    """`gapline bridge` as a child process, spoken to line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.mirror = Mirror()  # replay of every event line
        self.lines: list[dict[str, Any]] = []
        self._next_id = 0

    @classmethod
    async def start(cls, kit: SynapseKit, user_id: str, store: Path, *extra: str) -> BridgeProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gapline.cli", "bridge",
            "--homeserver", kit.base_url, "--user", user_id, "--password", "password",
            "--store", str(store), "--passphrase", "correct horse",
            "--page-size", "5", "--recent-pages", "1", *extra,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=2**24,
        )  # fmt: skip
        return cls(proc)

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), READ_TIMEOUT)
        if not raw:
            err = await self.stderr()
            raise AssertionError(f"bridge closed stdout; stderr:\n{err}")
        line = json.loads(raw)
        self.lines.append(line)
        if "event" in line:
            self.mirror.apply(event_from_wire(line["event"]))
        return line

    async def request(self, command: Any) -> tuple[list[dict[str, Any]], Any]:
        """Send a command; return the lines read up to its answer, and the answer."""
        self._next_id += 1
        request_id = self._next_id
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": request_id, "command": command}).encode() + b"\n")
        await self.proc.stdin.drain()
        seen = []
        while True:
            line = await self.read()
            seen.append(line)
            if line.get("id") == request_id and "answer" in line:
                return seen, line["answer"]

    async def until(self, predicate) -> None:
        while not predicate():
            await self.read()

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode(errors="replace")

    async def shutdown(self) -> list[dict[str, Any]]:
        seen, answer = await self.request("Shutdown")
        assert answer == "Ok"
        assert self.proc.stdout is not None
        rest = await asyncio.wait_for(self.proc.stdout.read(), READ_TIMEOUT)
        assert rest == b""  # the Shutdown answer is the last line
        assert await asyncio.wait_for(self.proc.wait(), READ_TIMEOUT) == 0
        return seen


def bodies(items) -> list[str]:
    return [i.body for i in items if isinstance(i, EventItem) and i.event_type == "m.room.message"]


def describe(items) -> str:
    return "\n".join(
        f"  {type(i).__name__} {getattr(i, 'body', None) or getattr(i, 'event_type', '')} {i.id}"
        for i in items
    )


def assert_chronological(items) -> None:
    """Index 0 is the oldest row; a gap row sits between two events."""
    stamps = [i.origin_server_ts for i in items if isinstance(i, EventItem)]
    assert stamps == sorted(stamps), "rows out of order:\n" + describe(items)
    for n, item in enumerate(items):
        if isinstance(item, HistoryGapItem):
            assert 0 < n < len(items) - 1, "a gap row at an edge:\n" + describe(items)


def events_between(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line["event"][kind] for line in lines if kind in line.get("event", {})]


async def open_and_load(bridge: BridgeProcess, room: str) -> list[dict[str, Any]]:
    lines, answer = await bridge.request({"OpenRoom": {"room_id": room}})
    assert answer == "Ok"
    kinds = [next(iter(line["event"])) for line in lines if "event" in line]
    assert kinds[0] == "TimelineReset"
    states = events_between(lines, "RecentHistoryChanged")
    assert states[0] == {"room_id": room, "state": "Loading"}

    def settled() -> bool:
        state = bridge.mirror.state.recent(room)
        return state.kind is not RecentHistoryKind.Loading

    await bridge.until(settled)
    assert bridge.mirror.state.recent(room).kind is RecentHistoryKind.Loaded
    return lines


# Room version 12 (Synapse's default) IDs have no ":server" part; 10 has one.
@pytest.mark.parametrize("room_version", ["10", "12"])
async def test_open_gap_fill_send_dump_over_the_bridge(
    synapse_kit: SynapseKit, tmp_path: Path, room_version: str
) -> None:
    alice = await synapse_kit.user("alice")
    async with synapse_kit.client(alice) as client:
        room = await client.create_room(
            name="bridge e2e", room_version=room_version, preset="private_chat"
        )
    store = tmp_path / "store"
    first = [f"first {i}" for i in range(3)]
    await synapse_kit.send_messages(alice, room, first)

    # Run 1: the room's history is retained.
    bridge = await BridgeProcess.start(synapse_kit, alice.user_id, store)
    await open_and_load(bridge, room)
    assert bodies(bridge.mirror.items(room) or ())[-3:] == first
    await bridge.shutdown()
    device = json.loads((store / account_dirname(alice.user_id) / "device.json").read_text())[
        "device_id"
    ]

    # While the bridge is down, more arrives than one page of 5 can reach.
    later = [f"later {i}" for i in range(40)]
    await synapse_kit.send_messages(alice, room, later)

    # Run 2: the recent load leaves a gap between the fresh window and run 1's events.
    bridge = await BridgeProcess.start(synapse_kit, alice.user_id, store)
    await open_and_load(bridge, room)
    assert (
        json.loads((store / account_dirname(alice.user_id) / "device.json").read_text())[
            "device_id"
        ]
        == device
    )
    items = bridge.mirror.items(room) or ()
    gaps = [i for i in items if isinstance(i, HistoryGapItem)]
    assert gaps, "expected a gap row:\n" + describe(items)
    assert_chronological(items)
    assert bodies(items)[-1] == later[-1]

    # FillGap walks it (4 pages of 5 per fill) until the older section is reached.
    gap_id = gaps[0].id
    for _ in range(10):
        lines, answer = await bridge.request(
            {"HistoryRepair": {"FillGap": {"room_id": room, "gap_id": gap_id}}}
        )
        assert answer == "Ok", answer
        reports = events_between(lines, "HistoryRepairChanged")
        assert len(reports) == 2  # one as it starts, one as it settles
        assert reports[0]["phase"] == "Bridging"
        settled = reports[1]
        assert settled["gap_id"] == gap_id
        # the answer follows the settled report and the mirror shows it
        assert bridge.mirror.state.repairs[room].phase.value == settled["phase"]
        if settled["phase"] == "Ready":
            assert settled["continuity"] == "Verified"
            break
        assert settled["stop"] == "Budget"
        assert settled["pages"] == 4
    else:
        pytest.fail("the gap never joined")
    items = bridge.mirror.items(room) or ()
    assert not any(isinstance(i, HistoryGapItem) and i.id == gap_id for i in items)
    assert_chronological(items)
    assert bodies(items)[-(len(first) + len(later)) :] == first + later, describe(items)

    # A gap that joined is gone.
    _, answer = await bridge.request(
        {"HistoryRepair": {"FillGap": {"room_id": room, "gap_id": gap_id}}}
    )
    assert answer == "EventNotFound"

    # Sending lands in the timeline (through sync).
    _, answer = await bridge.request({"SendMessage": {"room_id": room, "body": "hello"}})
    assert answer == "Ok"
    await bridge.until(lambda: bodies(bridge.mirror.items(room) or ())[-1:] == ["hello"])

    # DumpState: the bridge's mirror equals the replay of every event line.
    lines, answer = await bridge.request("DumpState")
    assert answer == "Ok"
    state = state_from_wire(next(line["state"] for line in lines if "state" in line))
    assert dict(state.timelines) == dict(bridge.mirror.state.timelines)
    assert dict(state.recent_history) == dict(bridge.mirror.state.recent_history)
    assert state.repairs[room].phase is RepairPhase.Ready

    # A bad line is answered and the bridge keeps going.
    _, answer = await bridge.request({"OpenRoom": {"room_id": 42}})
    assert "Invalid" in answer

    # TimelineReset is sent once, as the room opened; history came as diffs.
    assert sum("TimelineReset" in line.get("event", {}) for line in bridge.lines) == 1

    lines = await bridge.shutdown()
    assert {"RecentHistoryChanged": {"room_id": room, "state": "Idle"}} in [
        line["event"] for line in lines if "event" in line
    ]
    assert bridge.mirror.state.timelines == {}


async def run_bridge_to_exit(
    kit: SynapseKit, user_id: str, store: Path, *args: str, password: str = "password"
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gapline.cli", "bridge",
        "--homeserver", kit.base_url, "--user", user_id, "--password", password,
        "--store", str(store), *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(
        proc.communicate(b'{"id": 1, "command": "Shutdown"}\n'), READ_TIMEOUT
    )
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_bad_login_and_wrong_passphrase_are_clear_errors(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    store = tmp_path / "store"

    # The store opens (and is created, keyed with "one") before the login is refused.
    status, out, err = await run_bridge_to_exit(
        synapse_kit, alice.user_id, store, "--passphrase", "one", password="wrong"
    )
    assert status == 1
    assert out == ""  # stdout carries protocol lines only
    assert f"login as {alice.user_id} failed" in err
    assert "Traceback" not in err

    status, out, err = await run_bridge_to_exit(
        synapse_kit, alice.user_id, store, "--passphrase", "one"
    )
    assert status == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [{"id": 1, "answer": "Ok"}]

    status, out, err = await run_bridge_to_exit(
        synapse_kit, alice.user_id, store, "--passphrase", "two"
    )
    assert status == 1
    assert out == ""
    assert "wrong passphrase" in err
    assert "Traceback" not in err
