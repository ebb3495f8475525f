"""The decrypt worker (a large heal's vodozemac calls in another process): the machine's
results from the worker's calls are the ones it makes itself, refusals included, and a
worker that cannot start or dies leaves the caller decrypting in-process, with a warning.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import pytest

from gapline.e2ee import (
    DecryptedEvent,
    DecryptWorkers,
    RefusalCode,
    UnableToDecrypt,
    UtdReason,
    decrypt_worker,
)
from gapline.e2ee._megolm_worker import FRAME_LEN, HELLO
from gapline.matrix import ClientEvent

from .harness import Clock, Room, online
from .keyserver import KeyServer

# greets like a worker, then exits without answering
_DIES = (
    sys.executable,
    "-c",
    f"import sys; sys.stdout.buffer.write({FRAME_LEN.pack(len(HELLO)) + HELLO!r}); sys.stdout.flush()",
)


def _copy(event: ClientEvent, **changes: Any) -> ClientEvent:
    return msgspec.structs.replace(event, **changes)


def _scene():
    """Alice's session read by two devices that joined after its first message (so both
    know it from index 1), and a batch with every kind of outcome."""
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    room = Room("!r:x")
    alice.join(room)
    first = alice.send(room, "before they joined")
    late = online(server, clock, ("@bob:x", "B2"), ("@bob:x", "B3"))
    for p in late:
        p.join(room)
    alice.sync()
    later = [alice.send(room, f"message {i}") for i in range(4)]
    for p in late:
        p.sync()
    sid = later[0].content["session_id"]
    flipped = later[2].content["ciphertext"]
    flipped = flipped[:-8] + ("A" if flipped[-8] != "A" else "B") + flipped[-7:]
    batch = [
        first,  # index 0: before the first known index
        later[0],
        _copy(later[0], event_id="$replayed"),  # the same index under another event
        _copy(later[1], content={**later[1].content, "ciphertext": "not base64 !"}),
        _copy(later[2], event_id="$flipped", content={**later[2].content, "ciphertext": flipped}),
        _copy(later[1], content={**later[1].content, "session_id": "unknown"}),
        _copy(later[1], content={**later[1].content, "algorithm": "m.other"}),
        _copy(later[1], sender="@mallory:x"),  # not the session's owner
        later[1],
        later[2],
        later[3],
        later[0],  # the same event again: not a replay
    ]
    return room, late, batch, sid


def _outcomes(results: list[DecryptedEvent | UnableToDecrypt]) -> list[Any]:
    return [
        ("ok", r.event_id, r.message_index, r.content)
        if isinstance(r, DecryptedEvent)
        else ("utd", r.event_id, r.reason, r.refusal)
        for r in results
    ]


async def test_the_workers_results_are_the_machines_own() -> None:
    room, (here, there), batch, sid = _scene()
    expected = here.machine.decrypt_room_events(room.room_id, batch)
    async with decrypt_worker() as worker:
        assert await worker.started()
        assert await worker.send(there.machine, room.room_id, batch)
        raw = await worker.receive()
    # all but the two refused before any vodozemac call (no key, not Megolm) went there
    assert raw is not None and sum(r is not None for r in raw) == 10
    got = there.machine.decrypt_room_events(room.room_id, batch, raw=raw)
    assert got == expected  # the same values, every detail included
    assert _outcomes(got) == [
        ("utd", batch[0].event_id, UtdReason.UNKNOWN_MESSAGE_INDEX, None),
        ("ok", batch[1].event_id, 1, {"msgtype": "m.text", "body": "message 0"}),
        ("utd", "$replayed", UtdReason.MALFORMED, RefusalCode.MEGOLM_REPLAY),
        ("utd", batch[3].event_id, UtdReason.MALFORMED, RefusalCode.MALFORMED),
        ("utd", "$flipped", UtdReason.MALFORMED, RefusalCode.MALFORMED),
        ("utd", batch[5].event_id, UtdReason.MISSING_ROOM_KEY, None),
        ("utd", batch[6].event_id, UtdReason.MALFORMED, RefusalCode.UNSUPPORTED_ALGORITHM),
        ("utd", batch[7].event_id, UtdReason.UNTRUSTED, RefusalCode.SENDER_MISMATCH),
        ("ok", batch[8].event_id, 2, {"msgtype": "m.text", "body": "message 1"}),
        ("ok", batch[9].event_id, 3, {"msgtype": "m.text", "body": "message 2"}),
        ("ok", batch[10].event_id, 4, {"msgtype": "m.text", "body": "message 3"}),
        ("ok", batch[1].event_id, 1, {"msgtype": "m.text", "body": "message 0"}),
    ]
    # the replay index grew the same way: indexes 1 to 4, each once
    for p in (here, there):
        assert [(s.session_id, s.message_index) for s in p.commit().seen] == [
            (sid, i) for i in (1, 2, 3, 4)
        ]


async def test_jobs_in_flight_together_are_answered_in_the_order_sent() -> None:
    """A heal sends the next chunk before receiving the last: each `receive` answers the
    oldest job, and `forget` first takes the answers still due."""
    room, (_, there), batch, _ = _scene()
    async with decrypt_worker() as worker:
        assert await worker.started()
        first, second = batch[1:2], batch[8:11]
        assert await worker.send(there.machine, room.room_id, first)
        assert await worker.send(there.machine, room.room_id, second)
        assert await worker.send(there.machine, room.room_id, first)
        a, b = await worker.receive(), await worker.receive()
        assert a is not None and [r.index for r in a if r is not None] == [1]
        assert b is not None and [r.index for r in b if r is not None] == [2, 3, 4]
        await worker.forget()  # the third job's answer is taken, then the sessions go
        assert worker.usable and worker._slots == {} and not worker._in_flight
        assert await worker.receive() is None  # nothing is due


async def test_a_worker_that_dies_with_jobs_in_flight_answers_none_for_each() -> None:
    room, (_, there), batch, _ = _scene()
    async with decrypt_worker(_DIES) as worker:
        assert await worker.started()
        assert await worker.send(there.machine, room.room_id, batch[1:2])
        # the child may be gone already: then this send fails (and says so) instead
        await worker.send(there.machine, room.room_id, batch[8:11])
        assert await worker.receive() is None
        assert await worker.receive() is None
        assert worker.failed and not worker._in_flight


async def test_a_worker_that_cannot_start_leaves_decryption_here(caplog) -> None:
    room, (here, _), batch, _ = _scene()
    caplog.set_level(logging.WARNING, "gapline.e2ee.worker")
    async with decrypt_worker(("/nonexistent/python",)) as worker:
        assert not await worker.started()
        assert not await worker.send(here.machine, room.room_id, batch)
        assert await worker.receive() is None
    assert "could not be started" in caplog.text and "decrypting in this process" in caplog.text


@pytest.mark.parametrize("command", [_DIES, (sys.executable, "-c", "pass")])
async def test_a_worker_that_dies_answers_none_and_a_warning(caplog, command) -> None:
    """Dead after its greeting, or before it: the chunk's results are None (the caller
    decrypts in-process) and the cause is logged; later chunks are not sent."""
    room, (here, there), batch, _ = _scene()
    caplog.set_level(logging.WARNING, "gapline.e2ee.worker")
    async with decrypt_worker(command) as worker:
        if await worker.started():
            assert await worker.send(here.machine, room.room_id, batch)
            assert await worker.receive() is None
        assert not worker.usable
        assert not await worker.send(here.machine, room.room_id, batch)
    assert "decrypting in this process instead" in caplog.text
    assert _outcomes(here.machine.decrypt_room_events(room.room_id, batch)) == _outcomes(
        there.machine.decrypt_room_events(room.room_id, batch)
    )


async def test_a_kept_worker_forgets_its_sessions_and_is_replaced_once_it_failed(
    caplog,
) -> None:
    """The engine keeps one worker between heals: each heal ends with the child dropping
    its sessions (the next sends them again), and a worker that died is replaced."""
    room, (_, there), batch, _ = _scene()
    caplog.set_level(logging.WARNING, "gapline.e2ee.worker")
    workers = DecryptWorkers()
    try:
        worker = await workers.get()
        assert await worker.started()
        for _ in range(2):
            assert await worker.send(there.machine, room.room_id, batch[1:2])
            raw = await worker.receive()
            assert raw is not None and raw[0] is not None and raw[0].plaintext is not None
            await worker.forget()
            assert worker._slots == {}
        assert await workers.get() is worker
        proc = worker._proc
        assert proc is not None
        proc.kill()
        await proc.wait()
        if await worker.send(there.machine, room.room_id, batch[1:2]):
            assert await worker.receive() is None
        assert worker.failed and "decrypting in this process instead" in caplog.text
        again = await workers.get()
        assert again is not worker and await again.started()
    finally:
        await workers.aclose()
