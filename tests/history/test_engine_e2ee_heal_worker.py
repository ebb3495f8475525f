"""A large heal decrypts in a worker process: the engine stores the same rows and
publishes the same ``Set`` diffs as when it decrypts in-process, refusals included, and a
worker that cannot start or dies leaves the heal to finish in-process, with a warning.

The sizes are shrunk (a first chunk of 2, then 3, a worker from one row) so a few events take every
path; the heal waits for the worker to be ready, which a real one does not.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import pytest

from gapline.e2ee import DecryptWorker, DecryptWorkers
from gapline.e2ee._megolm_worker import FRAME_LEN, HELLO
from gapline.history import EventItem, OpenRoom, Set, TimelineChanged, _crypto, _heal_pass
from tests.history.e2ee_support import ROOM, scene

_DIES = (
    sys.executable,
    "-c",
    f"import sys; sys.stdout.buffer.write({FRAME_LEN.pack(len(HELLO)) + HELLO!r}); sys.stdout.flush()",
)

_GET = DecryptWorkers.get  # the real one (each heal below wraps it anew)


async def _heal(tmp_path, monkeypatch, *, offload: bool, command=None) -> dict[str, Any]:
    """Ten messages, a replay of one and a ciphertext that does not decode, all retained
    without their key; then the key. What the timeline shows and what it was told."""
    monkeypatch.setattr(_heal_pass, "CHUNK", 3)
    monkeypatch.setattr(_heal_pass, "FIRST", 2)
    monkeypatch.setattr(_heal_pass, "OFFLOAD_MIN", 1 if offload else 10**9)
    answered: list[int] = []
    workers: list[DecryptWorker] = []

    async def ready_get(self: DecryptWorkers) -> DecryptWorker:
        worker = await _GET(self)
        await worker.started()
        if worker not in workers:
            workers.append(worker)
            receive = worker.receive

            async def counted():
                raw = await receive()
                answered.append(0 if raw is None else sum(r is not None for r in raw))
                return raw

            worker.receive = counted
        return worker

    monkeypatch.setattr(DecryptWorkers, "get", ready_get)
    if command is not None:
        monkeypatch.setattr(_crypto, "DecryptWorkers", lambda: DecryptWorkers(command))
    async with scene(tmp_path) as s:
        await s.join_encrypted_room()
        await s.engine.execute(OpenRoom(ROOM))
        s.server.hold_to_device = True
        events = [s.encrypted(f"message {i}") for i in range(10)]
        replay = msgspec.structs.replace(events[4], event_id="$replay")
        content = {**events[6].content, "ciphertext": "not base64 !"}
        bad = msgspec.structs.replace(events[6], event_id="$bad", content=content)
        await s.sync(*events[:5], replay, *events[5:], bad)
        await s.engine.flush_history(ROOM)
        s.sink.events.clear()
        s.server.release_to_device()
        await s.sync()
        await s.engine.flush_history(ROOM)
        rows = [  # the session's id is random: each scene has its own
            (r.event_id, r.body, r.decryption and r.decryption.reason, r.encrypted)
            for r in s.rows()
            if isinstance(r, EventItem)
        ]
        sets = [
            (d.value.event_id, d.value.body)
            for e in s.sink.events
            if isinstance(e, TimelineChanged)
            for d in e.diffs
            if isinstance(d, Set) and isinstance(d.value, EventItem)
        ]
        if workers and not workers[-1].failed:
            assert workers[-1]._slots == {}  # the heal over, the worker holds no session
        return {"rows": rows, "sets": sets, "answered": answered, "workers": workers}


async def test_a_heal_in_the_worker_stores_and_shows_what_one_in_process_does(
    tmp_path, monkeypatch
) -> None:
    here = await _heal(tmp_path / "here", monkeypatch, offload=False)
    there = await _heal(tmp_path / "there", monkeypatch, offload=True)
    assert here["answered"] == []
    assert sum(there["answered"]) == 12  # every retained row decrypted in the worker
    assert there["rows"] == here["rows"]
    assert there["sets"] == here["sets"]
    bodies = {event_id: body for event_id, body, _, _ in here["rows"]}
    assert bodies["$replay"] is None and bodies["$bad"] is None  # refused either way
    assert sorted(b for _, b in here["sets"]) == sorted(f"message {i}" for i in range(10))


@pytest.mark.parametrize(
    ("command", "said"),
    [(("/nonexistent/python",), "could not be started"), (_DIES, "failed")],
)
async def test_a_heal_whose_worker_fails_finishes_in_process_with_a_warning(
    tmp_path, monkeypatch, caplog, command, said: str
) -> None:
    caplog.set_level(logging.WARNING, "gapline.e2ee.worker")
    here = await _heal(tmp_path / "here", monkeypatch, offload=False)
    there = await _heal(tmp_path / "there", monkeypatch, offload=True, command=command)
    assert sum(there["answered"]) == 0
    assert there["rows"] == here["rows"] and there["sets"] == here["sets"]
    assert f"the decrypt worker {said}" in caplog.text
    assert "decrypting in this process instead" in caplog.text
