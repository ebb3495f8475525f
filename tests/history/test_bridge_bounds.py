"""The bridge's input bounds: a huge, deeply nested or oversized-number line is answered
``Invalid`` and the bridge keeps running, in-process and as a process on real pipes."""

from __future__ import annotations

import pytest

from gapline.history._bridge import MAX_DEPTH, MAX_LINE, parse_request
from tests.history.test_bridge import ROOM, Harness
from tests.history.test_bridge_process import Child

pytestmark = pytest.mark.timeout(120)

DEEP = "[" * 100_000 + "]" * 100_000  # past the interpreter's recursion limit
NESTED = '{"id": 3, "command": {"OpenRoom": {"room_id": ' + "[" * 40 + "]" * 40 + "}}}"
BIG_INT = '{"id": ' + "9" * 5000 + ', "command": "Shutdown"}'
BIG_ID = '{"id": [' + ",".join(["1"] * 10_000) + '], "command": "Shutdown"}'
UNSAFE = '{"id": 5, "command": {"PaginateBackwards": {"room_id": "!r:x", "count": 1' + "0" * 20
UNSAFE += "}}}"


@pytest.mark.parametrize(
    ("line", "expected_id", "message"),
    [
        (DEEP, None, "nested deeper"),
        (NESTED, None, f"nested deeper than {MAX_DEPTH} levels"),
        (BIG_INT, None, "not JSON"),
        (BIG_ID, None, "id: expected an integer"),
        (UNSAFE, 5, "outside -(2^53-1)..2^53-1"),
    ],
)
def test_unbounded_lines_are_invalid(line: str, expected_id: int | None, message: str) -> None:
    for form in (line, line.encode()):
        request = parse_request(form)
        assert request.command is None and request.id == expected_id
        assert request.error is not None and message in request.error
        assert len(request.error) < 400  # the answer never echoes the line back


def test_ordinary_nesting_still_parses() -> None:
    request = parse_request('{"id": 1, "command": {"OpenRoom": {"room_id": "!r:x"}}}')
    assert request.error is None and request.command is not None


async def test_the_bridge_answers_invalid_and_keeps_going() -> None:
    h = Harness()
    await h.run(
        DEEP,
        BIG_INT,
        NESTED,
        {"id": 4, "command": {"OpenRoom": {"room_id": ROOM}}},
        {"id": 5, "command": {"CloseRoom": {"room_id": ROOM}}},
    )
    answers = [line for line in h.lines() if "answer" in line]
    assert [a["id"] for a in answers[:3]] == [None, None, None]
    assert all("Invalid" in a["answer"] for a in answers[:3])
    assert {"id": 4, "answer": "Ok"} in answers and {"id": 5, "answer": "Ok"} in answers


def test_the_bridge_process_survives_hostile_lines() -> None:
    child = Child()
    for line in (DEEP, BIG_INT, BIG_ID, "x" * (MAX_LINE + 10)):
        child.send(line)
        assert "Invalid" in child.read_until_answer(None)[-1]["answer"]
    child.send({"id": 1, "command": {"OpenRoom": {"room_id": ROOM}}})
    assert child.read_until_answer(1)[-1] == {"id": 1, "answer": "Ok"}
    child.send({"id": 2, "command": "Shutdown"})
    _, err = child.proc.communicate(timeout=30)
    assert child.proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err
