"""`DecryptWorker`: a large heal's vodozemac calls on the machine's other core.

A heal of thousands of events of one session is the decrypt calls plus as much work
again in this process (reading the rows back, the machine's checks, rewriting and
showing them); all of it holds the GIL, so a thread cannot overlap the two. A child
process can: while it decrypts chunk k+1, this process checks and writes chunk k.

The child (``_megolm_worker.py``) is given copies of the sessions, pickled under a
random key made for this worker, and the ciphertexts; it returns vodozemac's result
per event (`RawDecryption`). The machine then applies every rule to those results as
to its own calls (`InboundGroupSessions.decrypt_many`), so what a heal stores is the
same whichever process decrypted. The key and the pickles cross only the pipe to the
child; nothing it holds is ever written to disk.

The worker is optional: if it cannot start, dies, or answers something unreadable, a
warning is logged with the cause and the caller decrypts in-process from then on
(`send` and `receive` say so by returning False / None). Until the child says it is
ready (it imports vodozemac, about 0.1 s on a loaded machine) the caller decrypts
in-process too, so starting it never delays a heal.

`DecryptWorkers` keeps one worker between heals (the engine's: started at the first
large heal, again after one failed, stopped with the engine), so only the first heal
pays its start; each heal ends with `DecryptWorker.forget`, and the child holds no key
between heals.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec

from gapline.matrix import ClientEvent

from ._machine import CryptoMachine
from ._megolm_worker import FRAME_LEN, HELLO, Job, RawDecryption
from ._types import MEGOLM

__all__ = ["DecryptWorker", "DecryptWorkers", "decrypt_worker"]

log = logging.getLogger("gapline.e2ee.worker")

_SCRIPT = str(Path(__file__).with_name("_megolm_worker.py"))
COMMAND = (sys.executable, "-I", _SCRIPT)
_CLOSE_S = 5.0  # how long a closed worker may take to exit before it is killed

_encode = msgspec.msgpack.Encoder().encode
_decode_results = msgspec.msgpack.Decoder(list[RawDecryption | None]).decode

_FAILURES = (OSError, EOFError, asyncio.IncompleteReadError, msgspec.DecodeError, ValueError)


class DecryptWorker:
    """One child process and the sessions it was given (see the module doc). Jobs are
    answered in the order they were sent: `receive` returns the oldest one's results. A
    caller may send the next chunk before receiving the last, so the child finds it
    waiting when it is done (it never idles while the caller reads the rows)."""

    def __init__(self, proc: asyncio.subprocess.Process | None) -> None:
        self._proc = proc
        self._key = os.urandom(32)
        self._key_sent = False
        self._slots: dict[tuple[str, str], int] = {}
        self._ready = False
        self._failed = False
        self._in_flight: deque[int] = deque()  # the sizes of the jobs sent, not received
        self._settled = asyncio.Event()  # the child greeted, or failed to
        self._closing = False

    @property
    def usable(self) -> bool:
        """Ready and not failed: a job sent now is decrypted by the child."""
        return self._ready and not self._failed

    async def started(self) -> bool:
        """Wait until the child is ready (True) or has failed to start (False). A heal
        does not wait (it decrypts in-process meanwhile); a caller that must know does."""
        if self._proc is not None:
            await self._settled.wait()
        return self.usable

    @property
    def failed(self) -> bool:
        return self._failed

    @property
    def pid(self) -> int | None:
        """The child's process id (None if it never started): for measuring its CPU."""
        return None if self._proc is None else self._proc.pid

    def _fail(self, what: str, exc: BaseException) -> None:
        if not self._failed and not self._closing:
            log.warning(
                "the decrypt worker %s (%s: %s); decrypting in this process instead",
                what,
                type(exc).__name__,
                exc,
            )
        self._failed = True
        self._in_flight.clear()

    async def _await_hello(self) -> None:
        try:
            if await self._frame() != HELLO:
                raise ValueError("it did not greet as a decrypt worker")
            self._ready = True
        except _FAILURES as exc:
            self._fail("did not start", exc)
        finally:
            self._settled.set()

    async def _frame(self) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        head = await self._proc.stdout.readexactly(FRAME_LEN.size)
        (size,) = FRAME_LEN.unpack(head)
        return await self._proc.stdout.readexactly(size)

    async def send(
        self, machine: CryptoMachine, room_id: str, events: Sequence[ClientEvent]
    ) -> bool:
        """Give the child this chunk's ciphertexts (with any session it lacks); False if
        the worker is not usable (the caller decrypts in-process)."""
        if not self.usable:
            return False
        assert self._proc is not None and self._proc.stdin is not None
        sessions: list[tuple[int, str]] = []
        items: list[tuple[int, str] | None] = []
        for event in events:
            content = event.content
            sid, ciphertext = content.get("session_id"), content.get("ciphertext")
            if not (
                content.get("algorithm") == MEGOLM
                and isinstance(sid, str)
                and isinstance(ciphertext, str)
            ):
                items.append(None)  # refused before any decrypt call: nothing to do there
                continue
            slot = self._slots.get((room_id, sid))
            if slot is None:
                pickle = machine.inbound.worker_pickle(room_id, sid, self._key)
                if pickle is None:
                    items.append(None)  # no key: MissingRoomKey, decided by the machine
                    continue
                slot = self._slots[(room_id, sid)] = len(self._slots)
                sessions.append((slot, pickle))
            items.append((slot, ciphertext))
        job = Job(None if self._key_sent else self._key, sessions, items)
        body = _encode(job)
        try:
            # Not drained here: the loop hands the frame to the pipe as the child reads
            # it, while the caller goes on (it writes the last chunk meanwhile). What is
            # buffered is the ciphertexts of the jobs the caller has in flight (a heal
            # keeps two).
            self._proc.stdin.write(FRAME_LEN.pack(len(body)) + body)
        except _FAILURES as exc:
            self._fail("could not be given a chunk", exc)
            return False
        self._key_sent = True
        self._in_flight.append(len(items))
        return True

    async def receive(self) -> list[RawDecryption | None] | None:
        """The results of the oldest chunk sent and not received, one per event; None if
        the worker failed (or nothing was sent)."""
        if not self._in_flight:
            return None
        expected = self._in_flight[0]
        try:
            results = _decode_results(await self._frame())
            if len(results) != expected:
                raise ValueError(f"{len(results)} results for {expected} events")
        except _FAILURES as exc:
            self._fail("failed", exc)
            return None
        self._in_flight.popleft()
        return results

    async def forget(self) -> None:
        """The child drops every session it holds (a heal is over): the next heal sends
        what it needs again. Jobs still in flight are received (and dropped) first."""
        while self._in_flight:
            await self.receive()
        if not self._slots or not self.usable:
            return
        assert self._proc is not None and self._proc.stdin is not None
        self._slots.clear()
        body = _encode(Job(None, [], [], forget=True))
        try:
            self._proc.stdin.write(FRAME_LEN.pack(len(body)) + body)
        except _FAILURES as exc:
            self._fail("could not be told to forget its sessions", exc)
            return
        self._in_flight.append(0)
        await self.receive()

    async def _close(self) -> None:
        self._closing = True
        proc = self._proc
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()  # the child's read ends: it exits
        try:
            await asyncio.wait_for(proc.wait(), _CLOSE_S)
        except TimeoutError:
            log.warning("the decrypt worker did not exit in %.0f s; killing it", _CLOSE_S)
            proc.kill()
            await proc.wait()
        if self._failed and proc.stderr is not None:
            said = (await proc.stderr.read()).decode(errors="replace").strip()
            if said:
                log.warning("the decrypt worker said: %s", said[-2000:])


class DecryptWorkers:
    """The one decrypt worker of an owner (the engine's crypto), kept between heals:
    started by the first `get`, started again after it failed, stopped by `aclose`."""

    def __init__(self, command: Sequence[str] = COMMAND) -> None:
        self._command = tuple(command)
        self._current: DecryptWorker | None = None
        self._hello: asyncio.Task[None] | None = None  # owned: awaited when it stops

    async def get(self) -> DecryptWorker:
        """The running worker, or a new one starting (usable once it greets)."""
        current = self._current
        if current is not None and not current.failed:
            return current
        await self.aclose()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            worker = DecryptWorker(None)
            worker._fail("could not be started", exc)
        else:
            worker = DecryptWorker(proc)
            self._hello = asyncio.create_task(
                worker._await_hello(), name="e2ee-decrypt-worker-hello"
            )
        self._current = worker
        return worker

    @property
    def current(self) -> DecryptWorker | None:
        """The worker started last, if it was not stopped."""
        return self._current

    async def aclose(self) -> None:
        """Stop the worker (if any) and wait for it to exit."""
        worker, hello = self._current, self._hello
        self._current = self._hello = None
        if worker is not None:
            await worker._close()
        if hello is not None:
            await hello  # ends once the child's stdout closes


@asynccontextmanager
async def decrypt_worker(command: Sequence[str] = COMMAND) -> AsyncGenerator[DecryptWorker]:
    """A worker process for the block, stopped (and waited for) when it ends. It starts in
    the background: `DecryptWorker.usable` says when jobs go to it."""
    workers = DecryptWorkers(command)
    try:
        yield await workers.get()
    finally:
        await workers.aclose()
