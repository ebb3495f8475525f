"""The JSON-lines bridge against a scripted executor.

The fake executor keeps the engine's publishing contract (outcome events are
published, through a Publisher whose first sink is the mirror, before the
answer is returned), so these tests check what the bridge adds: parsing,
ids, Invalid answers, concurrency, DumpState, EOF and Shutdown, and that no
answer line ever precedes the event lines of its outcome.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import AsyncIterator

import pytest

from gapline.history import (
    Answer,
    Command,
    EventItem,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    Interrupted,
    Mirror,
    Ok,
    OpenRoom,
    PushBack,
    RecentHistoryChanged,
    RecentHistoryState,
    Remove,
    RepairPhase,
    RepairStop,
    RoomNotOpen,
    SendMessage,
    Shutdown,
    State,
    TimelineChanged,
    TimelineReset,
)
from gapline.history._bridge import Bridge, LineWriter, parse_request, stream_lines
from gapline.history._publish import Publisher
from gapline.history._types import Cancel, CloseRoom, Continuity
from gapline.history._wire_decode import state_from_wire

pytestmark = pytest.mark.timeout(60)

ROOM = "!room:example.org"
E1 = EventItem(
    id="row1", event_id="$e1:x", sender="@a:x", origin_server_ts=1, event_type="m.room.message",
    body="old",
)  # fmt: skip
E2 = EventItem(
    id="row2", event_id="$e2:x", sender="@a:x", origin_server_ts=2, event_type="m.room.message",
    body="new",
)  # fmt: skip
GAP = HistoryGapItem(id="gap1", older_boundary="$e1:x", newer_boundary="$e2:x")


class FakeEngine:
    """Scripted engine: one room with a gap; FillGap blocks until released or cancelled."""

    def __init__(self, publisher: Publisher, mirror: Mirror) -> None:
        self.publisher = publisher
        self.mirror = mirror
        self.open: set[str] = set()
        self.fill_started = asyncio.Event()
        self.release_fill = asyncio.Event()
        self.cancel_fill = asyncio.Event()
        self.executed: list[Command] = []
        # the mirror state seen at each answer: proves the mirror applied first
        self.mirror_at_answer: list[tuple[Command, State]] = []

    async def execute(self, command: Command) -> Answer:
        self.executed.append(command)
        answer = await self._execute(command)
        self.mirror_at_answer.append((command, self.mirror.state))
        return answer

    async def _execute(self, command: Command) -> Answer:
        pub = self.publisher.publish
        match command:
            case OpenRoom(room_id=room):
                # like the real engine, read the store before the room counts as open:
                # without the bridge's per-room barrier a pipelined command would
                # answer RoomNotOpen
                for _ in range(3):
                    await asyncio.sleep(0)
                self.open.add(room)
                await pub(TimelineReset(room, (E1, GAP, E2)))
                await pub(RecentHistoryChanged(room, RecentHistoryState.LOADING))
                await pub(RecentHistoryChanged(room, RecentHistoryState.LOADED))
                return Ok()
            case CloseRoom(room_id=room):
                if room not in self.open:
                    return RoomNotOpen()
                self.open.discard(room)
                await pub(RecentHistoryChanged(room, RecentHistoryState.IDLE))
                return Ok()
            case SendMessage(room_id=room, body=body):
                if room not in self.open:
                    return RoomNotOpen()
                item = EventItem(
                    id="row3", event_id="$e3:x", sender="@me:x", origin_server_ts=3,
                    event_type="m.room.message", body=body,
                )  # fmt: skip
                await pub(TimelineChanged(room, (PushBack(item),)))
                return Ok()
            case HistoryRepair(command=FillGap(room_id=room, gap_id=gap)):
                if room not in self.open:
                    return RoomNotOpen()
                await pub(HistoryRepairChanged(HistoryRepairReport(room_id=room, gap_id=gap)))
                self.fill_started.set()
                release = asyncio.create_task(self.release_fill.wait())
                cancel = asyncio.create_task(self.cancel_fill.wait())
                await asyncio.wait({release, cancel}, return_when=asyncio.FIRST_COMPLETED)
                release.cancel()
                cancel.cancel()
                if self.cancel_fill.is_set():
                    report = HistoryRepairReport(
                        room_id=room, gap_id=gap, pages=1, events=10, phase=RepairPhase.Paused,
                        stop=RepairStop.Cancelled,
                    )  # fmt: skip
                    await pub(HistoryRepairChanged(report))
                    return Interrupted()
                await pub(TimelineChanged(room, (Remove(1),)))
                report = HistoryRepairReport(
                    room_id=room, gap_id=gap, pages=2, events=63, phase=RepairPhase.Ready,
                    continuity=Continuity.Verified,
                )  # fmt: skip
                await pub(HistoryRepairChanged(report))
                return Ok()
            case HistoryRepair(command=Cancel()):
                self.cancel_fill.set()
                return Ok()
            case Shutdown():
                self.cancel_fill.set()
                for room in sorted(self.open):
                    await pub(RecentHistoryChanged(room, RecentHistoryState.IDLE))
                self.open.clear()
                return Ok()
        raise RuntimeError(f"the fake does not script {command!r}")


class Feed:
    """Input lines the test pushes while the bridge runs."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def send(self, obj: object) -> None:
        self.queue.put_nowait((obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n")

    def close(self) -> None:
        self.queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (line := await self.queue.get()) is not None:
            yield line


class Harness:
    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.writer = LineWriter(self.out)
        self.mirror = Mirror()
        self.publisher = Publisher([self.mirror, self.writer])
        self.engine = FakeEngine(self.publisher, self.mirror)
        self.bridge = Bridge(self.engine, self.writer, self.mirror)
        self.feed = Feed()

    def lines(self) -> list[dict]:
        raw = self.out.getvalue().decode()
        assert raw == "" or raw.endswith("\n")
        return [json.loads(line) for line in raw.splitlines()]

    async def run(self, *requests: object, close: bool = True) -> int:
        for request in requests:
            self.feed.send(request)
        if close:
            self.feed.close()
        return await self.bridge.run(aiter(self.feed))


def answer_index(lines: list[dict], request_id: int) -> int:
    return next(
        i for i, line in enumerate(lines) if line.get("id") == request_id and "answer" in line
    )


async def test_open_send_close_then_eof() -> None:
    h = Harness()
    status = await h.run(
        {"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}},
        {"id": 2, "command": {"SendMessage": {"room_id": ROOM, "body": "hello"}}},
        {"id": 3, "command": {"CloseRoom": {"room_id": ROOM}}},
    )
    assert status == 0
    lines = h.lines()
    # SendMessage and CloseRoom were read while OpenRoom ran: they waited for its answer
    kinds = [next(iter(line["event"])) if "event" in line else line["id"] for line in lines]
    assert kinds[:4] == ["TimelineReset", "RecentHistoryChanged", "RecentHistoryChanged", 1]
    assert lines[0]["event"]["TimelineReset"]["items"][1]["HistoryGap"]["id"] == "gap1"
    assert lines[1]["event"]["RecentHistoryChanged"]["state"] == "Loading"
    assert lines[2]["event"]["RecentHistoryChanged"]["state"] == "Loaded"
    assert lines[3] == {"id": 1, "answer": "Ok"}
    assert {"id": 2, "answer": "Ok"} in lines
    assert {"id": 3, "answer": "Ok"} in lines
    # EOF sends Shutdown to the engine, which closes nothing more: room 1 is closed
    assert isinstance(h.engine.executed[-1], Shutdown)
    # no answer for the implicit Shutdown at EOF
    assert [line["id"] for line in lines if "answer" in line] == [1, 2, 3]


async def test_answer_follows_its_outcome_events_and_the_mirror() -> None:
    h = Harness()
    fill = {"HistoryRepair": {"FillGap": {"room_id": ROOM, "gap_id": "gap1"}}}
    task = asyncio.create_task(
        h.run(
            {"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}},
            {"id": 2, "command": fill},
            close=False,
        )
    )
    await h.engine.fill_started.wait()
    h.engine.release_fill.set()
    h.feed.close()
    assert await task == 0
    lines = h.lines()
    settled = next(
        i for i, line in enumerate(lines)
        if "HistoryRepairChanged" in line.get("event", {})
        and line["event"]["HistoryRepairChanged"]["phase"] == "Ready"
    )  # fmt: skip
    removed = next(i for i, line in enumerate(lines) if "TimelineChanged" in line.get("event", {}))
    assert removed < settled < answer_index(lines, 2)
    assert lines[answer_index(lines, 2)] == {"id": 2, "answer": "Ok"}
    # the mirror had applied the outcome before the answer was released
    command, state = h.engine.mirror_at_answer[1]
    assert isinstance(command, HistoryRepair)
    assert state.repairs[ROOM].phase is RepairPhase.Ready
    assert state.timelines[ROOM] == (E1, E2)


async def test_cancel_reaches_a_running_fill() -> None:
    h = Harness()
    fill = {"HistoryRepair": {"FillGap": {"room_id": ROOM, "gap_id": "gap1"}}}
    task = asyncio.create_task(
        h.run(
            {"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}},
            {"id": 2, "command": fill},
            close=False,
        )
    )
    await h.engine.fill_started.wait()
    h.feed.send({"id": 3, "command": {"HistoryRepair": {"Cancel": {"room_id": ROOM}}}})
    h.feed.close()
    assert await task == 0
    lines = h.lines()
    assert lines[answer_index(lines, 2)] == {"id": 2, "answer": "Interrupted"}
    assert lines[answer_index(lines, 3)] == {"id": 3, "answer": "Ok"}
    reports = [
        line["event"]["HistoryRepairChanged"]
        for line in lines
        if "HistoryRepairChanged" in line.get("event", {})
    ]
    assert [r["phase"] for r in reports] == ["Bridging", "Paused"]
    assert reports[1]["stop"] == "Cancelled"
    assert reports[1]["failure"] is None


async def test_shutdown_interrupts_closes_rooms_and_answers_last() -> None:
    h = Harness()
    fill = {"HistoryRepair": {"FillGap": {"room_id": ROOM, "gap_id": "gap1"}}}
    task = asyncio.create_task(
        h.run(
            {"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}},
            {"id": 2, "command": fill},
            close=False,
        )
    )
    await h.engine.fill_started.wait()
    h.feed.send({"id": 9, "command": "Shutdown"})
    h.feed.send(
        {"id": 10, "command": {"OpenRoom": {"room_id": ROOM}}}
    )  # after Shutdown: never read
    assert await task == 0
    lines = h.lines()
    idle = [
        i for i, line in enumerate(lines)
        if line.get("event", {}).get("RecentHistoryChanged", {}).get("state") == "Idle"
    ]  # fmt: skip
    assert len(idle) == 1
    assert lines[answer_index(lines, 2)] == {"id": 2, "answer": "Interrupted"}
    assert lines[-1] == {"id": 9, "answer": "Ok"}
    assert idle[0] < len(lines) - 1
    assert all(line.get("id") != 10 for line in lines)
    assert h.mirror.state.recent_history == {}
    assert h.mirror.state.timelines == {}


@pytest.mark.parametrize(
    ("line", "expected_id", "message"),
    [
        ("not json", None, "not JSON"),
        ("[1, 2]", None, "a request is an object"),
        ('{"command": "Shutdown"}', None, 'missing field "id"'),
        ('{"id": "7", "command": "Shutdown"}', None, "id: expected an integer"),
        ('{"id": true, "command": "Shutdown"}', None, "id: expected an integer"),
        ('{"id": 7}', 7, 'missing field "command"'),
        ('{"id": 7, "command": "Shutdown", "extra": 1}', 7, 'unknown field "extra"'),
        ('{"id": 7, "command": "Reboot"}', 7, 'unknown variant "Reboot"'),
        ('{"id": 7, "command": {"OpenRoom": {"room_id": 5}}}', 7, "command.OpenRoom.room_id"),
    ],
)
def test_parse_request_never_raises(line: str, expected_id: int | None, message: str) -> None:
    request = parse_request(line)
    assert request.command is None
    assert request.id == expected_id
    assert request.error is not None
    assert message in request.error


async def test_malformed_lines_are_answered_invalid_and_the_bridge_keeps_going() -> None:
    h = Harness()
    await h.run(
        "garbage",
        "",
        {"id": 4, "command": {"HistoryRepair": {"FillGap": {"room_id": ROOM}}}},
        {"id": 5, "command": {"SendMessage": {"room_id": ROOM, "body": "x"}}},
    )
    lines = h.lines()
    assert lines[0]["id"] is None
    assert lines[0]["answer"]["Invalid"].startswith("not JSON")
    assert lines[1] == {
        "id": 4,
        "answer": {"Invalid": 'command.HistoryRepair.FillGap: missing field "gap_id"'},
    }
    assert lines[2] == {"id": 5, "answer": "RoomNotOpen"}  # the bridge kept running
    assert len(lines) == 3  # the blank line was skipped


async def test_dump_state_prints_the_mirror() -> None:
    h = Harness()
    await h.run(
        {"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}},
        {"id": 2, "command": "DumpState"},
    )
    lines = h.lines()
    state_line = next(line for line in lines if "state" in line)
    assert state_line["id"] == 2
    assert state_line["state"] == {
        "recent_history": {ROOM: "Loaded"},
        "repairs": {},
        "timelines": {
            ROOM: [json.loads(json.dumps(x)) for x in state_line["state"]["timelines"][ROOM]]
        },
    }
    assert [next(iter(i)) for i in state_line["state"]["timelines"][ROOM]] == [
        "Event",
        "HistoryGap",
        "Event",
    ]
    assert state_from_wire(state_line["state"]).timelines[ROOM] == (E1, GAP, E2)
    assert lines[answer_index(lines, 2)] == {"id": 2, "answer": "Ok"}
    assert answer_index(lines, 2) == lines.index(state_line) + 1
    # DumpState is answered by the bridge, never sent to the engine
    assert not any(type(c).__name__ == "DumpState" for c in h.engine.executed)


async def test_an_engine_bug_answers_failed_and_the_bridge_survives() -> None:
    h = Harness()
    await h.run(
        {"id": 1, "command": {"PaginateBackwards": {"room_id": ROOM, "count": 5}}},  # not scripted
        {"id": 2, "command": {"CloseRoom": {"room_id": ROOM}}},
    )
    lines = h.lines()
    assert lines[0]["id"] == 1
    assert lines[0]["answer"]["Failed"].startswith("internal error: RuntimeError")
    assert lines[1] == {"id": 2, "answer": "RoomNotOpen"}


async def test_stream_lines_reads_a_real_pipe_to_eof() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        with os.fdopen(write_fd, "wb") as writer:
            writer.write(b'{"id": 1, "command": "Shutdown"}\nsecond\n\ntail')
        got = [line async for line in stream_lines(reader)]
    assert got == [b'{"id": 1, "command": "Shutdown"}\n', b"second\n", b"\n", b"tail"]


class ClosingStream(io.BytesIO):
    """Output whose reader goes away once ``close_reader`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.close_reader = False
        self.dumped = asyncio.Event()

    def write(self, data, /) -> int:  # type: ignore[override]
        if self.close_reader:
            raise BrokenPipeError(32, "Broken pipe")
        if b'"state"' in bytes(data):
            self.dumped.set()
        return super().write(data)


async def test_a_reader_that_goes_away_stops_the_bridge_without_failing_the_engine() -> None:
    h = Harness()
    stream = ClosingStream()
    h.writer._stream = stream  # the same writer the publisher and the bridge hold
    task = asyncio.create_task(
        h.run({"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}}, close=False)
    )
    h.feed.send({"id": 2, "command": "DumpState"})  # a barrier: runs after OpenRoom answered
    await stream.dumped.wait()
    stream.close_reader = True
    h.feed.send({"id": 3, "command": {"SendMessage": {"room_id": ROOM, "body": "lost"}}})
    # the input stays open: the bridge stops because its output broke
    assert await task == 0
    assert h.writer.broken
    # the engine ran SendMessage 3 (its publish did not raise), then was shut down
    assert [type(c).__name__ for c in h.engine.executed] == ["OpenRoom", "SendMessage", "Shutdown"]
    assert h.mirror.state.timelines == {}


async def test_an_over_long_line_is_answered_and_dropped_without_buffering_it() -> None:
    from gapline.history._bridge import MAX_LINE

    read_fd, write_fd = os.pipe()
    huge = b'{"id": 1, "command": {"SendMessage": {"room_id": "!r:x", "body": "' + b"x" * (
        3 * MAX_LINE
    )

    def writer_side() -> None:
        with os.fdopen(write_fd, "wb") as writer:
            writer.write(b'{"id": 0, "command": "DumpState"}\n')
            writer.write(huge + b'"}}}\n')
            writer.write(b'{"id": 2, "command": {"CloseRoom": {"room_id": "!r:x"}}}\n')
            writer.write(b"x" * (2 * MAX_LINE))  # unterminated at EOF: dropped too

    with os.fdopen(read_fd, "rb") as reader:
        h = Harness()
        writing = asyncio.get_running_loop().run_in_executor(None, writer_side)
        status = await h.bridge.run(stream_lines(reader))
        await writing
    assert status == 0
    answers = [line for line in h.lines() if "answer" in line]
    assert answers[0] == {"id": 0, "answer": "Ok"}
    assert answers[1] == {"id": None, "answer": {"Invalid": f"line longer than {MAX_LINE} bytes"}}
    assert answers[2] == {"id": 2, "answer": "RoomNotOpen"}
    assert answers[3] == {"id": None, "answer": {"Invalid": f"line longer than {MAX_LINE} bytes"}}
    assert len(answers) == 4
