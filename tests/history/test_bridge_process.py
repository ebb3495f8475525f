"""The bridge as a process: real pipes, line flushing, stderr-only logs, exit status.

The child runs :func:`main`: the real ``Bridge``, ``LineWriter`` on stdout and
``stream_lines`` on stdin, around the scripted engine of test_bridge.py. The
test talks to it line by line without closing stdin, so an unflushed line
would hang it (the pytest timeout turns that into a failure).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pytest

from gapline.history._bridge import Bridge, LineWriter, stream_lines
from gapline.history._mirror import Mirror
from gapline.history._publish import Publisher
from tests.history.test_bridge import ROOM, FakeEngine

pytestmark = pytest.mark.timeout(120)


def main() -> None:
    async def serve() -> int:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO)
        writer = LineWriter(sys.stdout.buffer)
        mirror = Mirror()
        engine = FakeEngine(Publisher([mirror, writer]), mirror)
        return await Bridge(engine, writer, mirror).run(stream_lines(sys.stdin.buffer))

    raise SystemExit(asyncio.run(serve()))


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.history.test_bridge_process import main; main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def send(self, obj: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            (json.dumps(obj) if not isinstance(obj, str) else obj).encode() + b"\n"
        )
        self.proc.stdin.flush()

    def read_until_answer(self, request_id: int | None) -> list[dict]:
        assert self.proc.stdout is not None
        lines = []
        while True:
            raw = self.proc.stdout.readline()
            assert raw, "the bridge closed stdout before answering"
            line = json.loads(raw)
            lines.append(line)
            if "answer" in line and line["id"] == request_id:
                return lines


def test_a_session_over_real_pipes() -> None:
    child = Child()
    child.send({"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}})
    opened = child.read_until_answer(1)
    assert [next(iter(line.get("event", {"answer": 0}))) for line in opened] == [
        "TimelineReset",
        "RecentHistoryChanged",
        "RecentHistoryChanged",
        "answer",
    ]
    child.send("{broken")
    assert child.read_until_answer(None)[-1]["answer"]["Invalid"].startswith("not JSON")
    child.send(
        {"id": 2, "command": {"HistoryRepair": {"FillGap": {"room_id": ROOM, "gap_id": "gap1"}}}}
    )
    child.send({"id": 3, "command": {"HistoryRepair": {"Cancel": {"room_id": ROOM}}}})
    lines = child.read_until_answer(2)
    assert lines[-1] == {"id": 2, "answer": "Interrupted"}
    settled = [line["event"]["HistoryRepairChanged"] for line in lines if "event" in line]
    assert settled[-1]["stop"] == "Cancelled"
    child.send({"id": 4, "command": "DumpState"})
    lines = child.read_until_answer(4)
    state = next(line["state"] for line in lines if "state" in line)
    assert state["recent_history"] == {ROOM: "Loaded"}
    assert state["repairs"][ROOM]["stop"] == "Cancelled"
    child.send({"id": 5, "command": "Shutdown"})
    out, err = child.proc.communicate(timeout=30)
    rest = [json.loads(line) for line in out.decode().splitlines()]
    assert rest[-1] == {"id": 5, "answer": "Ok"}
    assert {"event": {"RecentHistoryChanged": {"room_id": ROOM, "state": "Idle"}}} in rest
    assert child.proc.returncode == 0
    assert b"Shutdown requested" in err  # logs went to stderr


def test_end_of_input_closes_rooms_and_exits_zero() -> None:
    child = Child()
    child.send({"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}})
    out, err = child.proc.communicate(timeout=30)
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert {"id": 1, "answer": "Ok"} in lines
    assert lines[-1] == {"event": {"RecentHistoryChanged": {"room_id": ROOM, "state": "Idle"}}}
    assert child.proc.returncode == 0, err.decode()


def test_shutdown_exits_zero_while_stdin_stays_open() -> None:
    """The stdin reader thread is still blocked in a read when the process exits."""
    child = Child()
    child.send({"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}})
    child.send({"id": 2, "command": "Shutdown"})
    lines = child.read_until_answer(2)
    assert {"event": {"RecentHistoryChanged": {"room_id": ROOM, "state": "Idle"}}} in lines
    # stdin is not closed: the exit must not wait for it, nor abort on it
    assert child.proc.wait(timeout=30) == 0
    assert child.proc.stdin is not None
    child.proc.stdin.close()
