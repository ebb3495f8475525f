"""The bridge driving the real Engine, on the in-memory fake homeserver (no Synapse).

Checks what only the pair can show: every event line decodes strictly and
replays into a mirror without a misfit diff, each answer line comes after
the event lines of its outcome, the bridge's DumpState equals that replay and
the engine's own timeline, and EOF closes the room with its Idle.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gapline.history import (
    Bridge,
    Engine,
    EngineConfig,
    EventItem,
    HistoryGapItem,
    LineWriter,
    Mirror,
    Publisher,
    event_from_wire,
    state_from_wire,
)
from gapline.matrix import RetryPolicy
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams

pytestmark = pytest.mark.timeout(60)

NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=1)


async def _no_sleep(_seconds: float) -> None:
    return None


class Output(io.BytesIO):
    """The bridge's stdout; records which request ids have been answered."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: dict[int, asyncio.Event] = {}

    def answer_of(self, request_id: int) -> asyncio.Event:
        return self.answered.setdefault(request_id, asyncio.Event())

    def write(self, data, /) -> int:  # type: ignore[override]
        line = json.loads(bytes(data))
        if "answer" in line and line["id"] is not None:
            self.answer_of(line["id"]).set()
        return super().write(data)


async def _lines(requests: list[Any], out: Output) -> AsyncIterator[bytes]:
    """Each request in turn, the next one once the previous one was answered
    (a request marked ``"pipelined": True`` is sent without waiting)."""
    for request in requests:
        pipelined = request.pop("pipelined", False)
        yield json.dumps(request).encode() + b"\n"
        if not pipelined:
            await out.answer_of(request["id"]).wait()


async def run_bridge(
    store: Path, fake: FakeHomeserver, session, config: EngineConfig, requests: list[Any]
) -> tuple[list[dict[str, Any]], Mirror, tuple]:
    """Serve ``requests`` then EOF; returns the output lines, the bridge's mirror and the
    engine's last timeline of the room opened by the first request (None if closed)."""
    out = Output()
    writer, mirror = LineWriter(out), Mirror()
    async with (
        fake.client(session, retry=NO_RETRY, sleep=_no_sleep) as client,
        Engine.open(
            store,
            client,
            config=config,
            passphrase="pw",
            sink=Publisher([mirror, writer]),
            kdf_cost=KdfParams.cheap(),
            sync=False,
        ) as engine,
    ):
        status = await Bridge(engine, writer, mirror).run(_lines(requests, out))
    assert status == 0
    lines = [json.loads(line) for line in out.getvalue().decode().splitlines()]
    return lines, mirror, ()


def replay(lines: list[dict[str, Any]]) -> Mirror:
    mirror = Mirror()
    for line in lines:
        if "event" in line:
            mirror.apply(event_from_wire(line["event"]))
    return mirror


def answer_at(lines: list[dict[str, Any]], request_id: int) -> int:
    return next(
        i for i, line in enumerate(lines) if line.get("id") == request_id and "answer" in line
    )


async def test_gap_fill_dump_through_the_bridge(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"old {i}" for i in range(8)])
    store = tmp_path / "store"

    # Session 1: everything is retained.
    wait = {"HistoryRepair": {"RetryRecent": {"room_id": room}}}  # joins the running recent load
    lines, _, _ = await run_bridge(
        store, fake, alice, EngineConfig(), [
            # pipelined: the bridge holds RetryRecent until OpenRoom answered
            {"id": 1, "command": {"OpenRoom": {"room_id": room}}, "pipelined": True},
            {"id": 2, "command": wait},
        ],
    )  # fmt: skip
    assert lines[answer_at(lines, 2)] == {"id": 2, "answer": "Ok"}
    assert lines[answer_at(lines, 1)] == {"id": 1, "answer": "Ok"}
    assert lines[-1] == {"event": {"RecentHistoryChanged": {"room_id": room, "state": "Idle"}}}

    # Session 2: 30 newer messages, one page of 5 reaches only the newest: a gap.
    fake.send_messages(alice.user_id, room, [f"new {i}" for i in range(30)])
    small = EngineConfig(page_size=5, recent_pages=1)
    fill = {"HistoryRepair": {"FillGap": {"room_id": room, "gap_id": "?"}}}
    lines, _, _ = await run_bridge(
        store, fake, alice, small, [
            {"id": 1, "command": {"OpenRoom": {"room_id": room}}, "pipelined": True},
            {"id": 2, "command": wait, "pipelined": True},
            {"id": 3, "command": "DumpState"},
        ],
    )  # fmt: skip
    state = state_from_wire(next(line["state"] for line in lines if "state" in line))
    gaps = [i for i in state.timelines[room] if isinstance(i, HistoryGapItem)]
    assert len(gaps) == 1
    assert dict(state.timelines) == dict(replay(lines[: answer_at(lines, 3)]).state.timelines)

    # Session 3: FillGap until the sections join, then a DumpState.
    fill["HistoryRepair"]["FillGap"]["gap_id"] = gaps[0].id
    requests: list[Any] = [
        {"id": 1, "command": {"OpenRoom": {"room_id": room}}},
        {"id": 2, "command": wait},
    ]
    requests += [{"id": 10 + n, "command": dict(fill)} for n in range(3)]
    requests.append({"id": 20, "command": "DumpState"})
    lines, _, _ = await run_bridge(store, fake, alice, small, requests)

    answers = {line["id"]: line["answer"] for line in lines if "answer" in line}
    # 25 missing events, 4 pages of 5 per fill: Budget, then Ready; the third finds no gap
    assert [answers[10], answers[11], answers[12]] == ["Ok", "Ok", "EventNotFound"]
    reports = [
        line["event"]["HistoryRepairChanged"]
        for line in lines
        if "HistoryRepairChanged" in line.get("event", {})
    ]
    assert [(r["phase"], r["stop"], r["continuity"]) for r in reports] == [
        ("Bridging", None, None),
        ("Paused", "Budget", None),
        ("Bridging", None, None),
        ("Ready", None, "Verified"),
    ]
    # each fill's answer follows both its reports
    for request_id, settled in ((10, 1), (11, 3)):
        settled_at = [
            i for i, line in enumerate(lines) if "HistoryRepairChanged" in line.get("event", {})
        ][settled]
        assert settled_at < answer_at(lines, request_id)

    state = state_from_wire(next(line["state"] for line in lines if "state" in line))
    replayed = replay(lines[: answer_at(lines, 20)])
    assert dict(state.timelines) == dict(replayed.state.timelines)
    assert dict(state.repairs) == dict(replayed.state.repairs)
    rows = state.timelines[room]
    assert not any(isinstance(i, HistoryGapItem) for i in rows)
    bodies = [
        getattr(i, "body", None) for i in rows if getattr(i, "event_type", "") == "m.room.message"
    ]
    assert bodies == [f"old {i}" for i in range(8)] + [f"new {i}" for i in range(30)]
    # EOF: the room closed, the mirror forgot it
    assert lines[-1] == {"event": {"RecentHistoryChanged": {"room_id": room, "state": "Idle"}}}
    assert replay(lines).state.timelines == {}


async def test_busy_and_unknown_answers_through_the_bridge(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="r")
    lines, _, _ = await run_bridge(
        tmp_path / "store", fake, alice, EngineConfig(), [
            {"id": 1, "command": {"CloseRoom": {"room_id": room}}},
            {"id": 2, "command": {"HistoryRepair": {"FillGap": {"room_id": room, "gap_id": "nope"}}}},
            {"id": 3, "command": {"OpenRoom": {"room_id": room}}},
            {"id": 4, "command": {"HistoryRepair": {"RetryRecent": {"room_id": room}}}},
            {"id": 5, "command": {"HistoryRepair": {"FillGap": {"room_id": room, "gap_id": "nope"}}}},
            {"id": 6, "command": {"OpenRoom": {"room_id": "no-sigil"}}},
            {"id": 7, "command": {"PaginateBackwards": {"room_id": room, "count": 10}}},
        ],
    )  # fmt: skip
    answers = {line["id"]: line["answer"] for line in lines if "answer" in line}
    assert answers[1] == "RoomNotOpen"
    assert answers[2] == "RoomNotOpen"
    assert answers[3] == "Ok"
    assert answers[4] == "Ok"  # joined the running recent load
    assert answers[5] == "EventNotFound"
    assert answers[6] == {
        "Invalid": "command.OpenRoom.room_id: expected a Matrix room ID starting with '!', "
        'got "no-sigil"'
    }
    assert answers[7] == "Ok"  # the whole room is loaded: nothing older to add
    assert len(answers) == 7


async def test_a_queued_message_through_the_bridge(tmp_path: Path) -> None:
    """SendMessage's answer comes after its Pending row and the queue's count (the worker
    is not started here, so the message waits); a CancelSend naming no echo row is
    Invalid."""
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="r")
    lines, _, _ = await run_bridge(
        tmp_path / "store", fake, alice, EngineConfig(), [
            {"id": 1, "command": {"OpenRoom": {"room_id": room}}},
            {"id": 2, "command": {"SendMessage": {"room_id": room, "body": "hello"}}},
            {"id": 3, "command": "DumpState"},
            {"id": 4, "command": {"CancelSend": {"room_id": room, "id": "?"}}},
        ],
    )  # fmt: skip
    answers = {line["id"]: line["answer"] for line in lines if "answer" in line}
    assert answers[2] == "Ok"
    sent_at = answer_at(lines, 2)
    before = lines[answer_at(lines, 1) + 1 : sent_at]
    [count] = [line["event"] for line in before if "SendQueueChanged" in line["event"]]
    assert count == {"SendQueueChanged": {"pending": 1, "failed": 0}}
    state = state_from_wire(next(line["state"] for line in lines if "state" in line))
    [row] = [
        i for i in state.timelines[room] if isinstance(i, EventItem) and i.send_state is not None
    ]
    assert row.body == "hello" and row.id.startswith("echo:")
    assert replay(lines[:sent_at]).state.timelines[room][-1] == row
    assert answers[4] == {"Invalid": "not a queued message's row id: '?'"}
