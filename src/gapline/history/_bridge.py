"""The bridge: the wire protocol as JSON lines over a pair of byte streams.

Input lines are ``{"id": N, "command": <Command>}``; output lines are
``{"id": N, "answer": <Answer>}``, ``{"event": <Event>}`` and, for the
``DumpState`` extension, ``{"id": N, "state": <State>}``, one JSON object per
line, flushed after each.

Ordering: the bridge's :class:`LineWriter` is an :class:`EventSink` behind the
mirror on the engine's publisher, and the engine returns an answer only after
its outcome events were published, so an answer line always follows the
event lines of its outcome and the mirror's application of them.

Commands run concurrently, one task each, so a ``Cancel`` can reach a
``FillGap`` that is still walking; answers are written as commands finish,
each tagged with its request's id. A line that is not a valid request is
answered ``{"id": N-or-null, "answer": {"Invalid": "why"}}`` at once and the
bridge keeps reading. Blank lines are skipped. Commands reach the engine in the
order their lines were read, and ``OpenRoom``/``CloseRoom`` are barriers for
their room: a later command for the same room waits until they answered, so a
client may pipeline ``OpenRoom`` and ``FillGap`` without seeing
``RoomNotOpen``. Nothing else is serialised: a second ``FillGap`` overlapping
a running one still answers ``RoomBusy``, since a room runs one operation at a time.

``"Shutdown"`` stops reading and is passed to the engine, which interrupts
running commands (they answer ``Interrupted``) and closes every room, each
publishing its ``Idle``; the bridge returns once every command answered. At
end of input nothing is interrupted: the commands already read finish and
answer, then the bridge sends ``Shutdown`` itself (writing no answer line for
it), so a scripted pipe such as ``printf '...' | gapline bridge`` runs every
command to its end before the rooms close.

``"DumpState"`` (extension) is answered by the bridge from its mirror, never
sent to the engine: once every command read before it has answered, it writes
``{"id": N, "state": <State>}`` then ``{"id": N, "answer": "Ok"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from gapline.history._mirror import Mirror
from gapline.history._types import (
    Answer,
    CloseRoom,
    Command,
    DumpState,
    Event,
    Failed,
    Invalid,
    Ok,
    OpenRoom,
    Shutdown,
)
from gapline.history._wire import Json, WireError, dumps, loads, to_wire
from gapline.history._wire_decode import command_from_wire

__all__ = ["Bridge", "CommandExecutor", "LineWriter", "Request", "parse_request", "stream_lines"]

log = logging.getLogger("gapline.history.bridge")


class CommandExecutor(Protocol):
    """What the bridge drives: the engine's command entry point.

    ``execute`` returns the command's answer after publishing its outcome.
    On ``Shutdown`` it interrupts running commands (they answer
    ``Interrupted``), closes every open room and answers.
    """

    async def execute(self, command: Command) -> Answer: ...


class LineWriter:
    """Writes JSON lines to a binary stream, flushing each; an :class:`EventSink`.

    Writes are synchronous on the event loop's thread, so a line is never
    interleaved with another; a reader that stops reading blocks the bridge,
    which is the backpressure a pipe should give. A reader that went away
    (``BrokenPipeError``) turns the writer ``broken``: later lines are
    dropped instead of failing the engine's publish, and the bridge stops.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._broken = asyncio.Event()

    @property
    def broken(self) -> bool:
        return self._broken.is_set()

    async def wait_broken(self) -> None:
        await self._broken.wait()

    def write(self, data: Json) -> None:
        if self.broken:
            return
        try:
            self._stream.write(dumps(data).encode() + b"\n")
            self._stream.flush()
        except (BrokenPipeError, ConnectionResetError):
            log.warning("output closed by the reader; dropping further lines")
            self._broken.set()

    async def publish(self, event: Event) -> None:
        self.write({"event": to_wire(event)})

    def answer(self, request_id: int | None, answer: Answer) -> None:
        self.write({"id": request_id, "answer": to_wire(answer)})


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed input line: its id (``None`` when unusable), and its command or the error."""

    id: int | None
    command: Command | None
    error: str | None


MAX_LINE = 1 << 20
"""Longest request line accepted, in bytes (a request is a few hundred)."""

TOO_LONG = b"\x00 line too long\n"
"""What the reader yields for a line over MAX_LINE (never valid JSON)."""

MAX_DEPTH = 32
"""Deepest nesting of a request line (a command nests four levels)."""


def _decode_line(line: bytes | str) -> Json:
    """``loads`` with the line's nesting and numbers bounded; every refusal a WireError.

    ``json`` itself gives up past the interpreter's recursion limit (RecursionError)
    and on integers of over 4,300 digits (ValueError); both are bad input, never a
    reason for the bridge to stop.
    """
    try:
        data = loads(line)
    except RecursionError:
        raise WireError(f"not JSON: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # WireError is not one; json's own number limit is
        raise WireError(f"not JSON: {exc}") from None
    if isinstance(line, bytes):
        opened = line.count(b"[") + line.count(b"{")
    else:
        opened = line.count("[") + line.count("{")
    if opened > MAX_DEPTH:  # only then can the nesting exceed the bound
        stack: list[tuple[Json, int]] = [(data, 0)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise WireError(f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(node, dict):
                stack.extend((child, depth + 1) for child in node.values())
            elif isinstance(node, list):
                stack.extend((child, depth + 1) for child in node)
    return data


def parse_request(line: bytes | str) -> Request:
    """Parse one input line; never raises (a bad line becomes a Request with an ``error``)."""
    if line == TOO_LONG:
        return Request(None, None, f"line longer than {MAX_LINE} bytes")
    try:
        data = _decode_line(line)
    except WireError as exc:
        return Request(None, None, str(exc))
    if not isinstance(data, dict):
        return Request(None, None, 'a request is an object {"id": N, "command": ...}')
    raw_id = data.get("id")
    request_id = raw_id if isinstance(raw_id, int) and not isinstance(raw_id, bool) else None
    if "id" not in data:
        return Request(None, None, 'missing field "id"')
    if request_id is None:
        return Request(None, None, f"id: expected an integer, got {dumps(raw_id)[:60]}")
    unknown = [k for k in data if k not in ("id", "command")]
    if unknown:
        return Request(request_id, None, f'unknown field "{unknown[0]}" (fields: id, command)')
    if "command" not in data:
        return Request(request_id, None, 'missing field "command"')
    try:
        return Request(request_id, command_from_wire(data["command"]), None)
    except WireError as exc:
        return Request(request_id, None, str(exc))


def _raw_lines(stream: BinaryIO) -> Iterator[bytes]:
    """Lines of ``stream``, read with ``os.read`` on its descriptor when it has one.

    ``os.read`` takes no Python-level lock, unlike ``stream.readline`` on a
    buffered reader: a daemon thread blocked in ``readline`` at interpreter
    exit makes CPython abort ("could not acquire lock for <stdin> at
    interpreter shutdown"), turning a clean exit 0 into SIGABRT.
    """
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        yield from iter(stream.readline, b"")
        return
    pending = bytearray()
    skipping = False  # inside a line that already exceeded MAX_LINE
    while chunk := os.read(fd, 1 << 16):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            piece = chunk[start : end + 1]
            if skipping:
                skipping = False
            elif len(pending) + len(piece) > MAX_LINE:
                yield TOO_LONG
            else:
                yield bytes(pending) + piece
            pending.clear()
            start = end + 1
        rest = chunk[start:]
        if skipping:
            continue
        if len(pending) + len(rest) > MAX_LINE:
            # Answer at once and drop the rest of the line as it arrives, so
            # a runaway writer cannot make the bridge buffer without bound.
            pending.clear()
            skipping = True
            yield TOO_LONG
        else:
            pending += rest
    if pending and not skipping:
        yield bytes(pending)


async def stream_lines(stream: BinaryIO) -> AsyncIterator[bytes]:
    """Lines of a blocking binary stream (stdin), read on a daemon thread.

    A daemon thread rather than ``connect_read_pipe`` because stdin may be a
    pipe, a terminal or a regular file, and rather than ``asyncio.to_thread``
    because a read blocked at exit must not keep the process alive.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def pump() -> None:
        try:
            for line in _raw_lines(stream):
                loop.call_soon_threadsafe(queue.put_nowait, line)
        except (OSError, ValueError, RuntimeError) as exc:
            # A closed or broken stdin ends the input; RuntimeError: the loop is gone.
            log.debug("reading input stopped: %s", exc)
        finally:
            # RuntimeError: the loop is gone, so nobody is reading any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=pump, name="bridge-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line


class Bridge:
    """Runs requests from ``lines`` against ``executor``; answers go to ``writer``.

    The caller wires the publishing side: the engine publishes into a
    Publisher whose sinks are ``mirror`` (first) then ``writer``.
    """

    def __init__(
        self,
        executor: CommandExecutor,
        writer: LineWriter,
        mirror: Mirror,
        *,
        state_line: Callable[[Mirror], Json] | None = None,
    ) -> None:
        self._executor = executor
        self._writer = writer
        self._mirror = mirror
        self._state_line = state_line or (lambda m: to_wire(m.state))
        # room -> the last OpenRoom/CloseRoom of that room still running
        self._lifecycle: dict[str, asyncio.Task[None]] = {}

    async def run(self, lines: AsyncIterator[bytes]) -> int:
        """Serve until EOF or ``Shutdown``; returns the exit status (0)."""
        in_flight: set[asyncio.Task[None]] = set()
        async with asyncio.TaskGroup() as tasks:
            # Each command is a task. asyncio starts ready tasks in creation
            # order, so the engine is entered in the order lines were read.
            def track(task: asyncio.Task[None]) -> None:
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)

            async with contextlib.aclosing(self._until_broken(lines)) as source:
                async for line in source:
                    if line is None:
                        # Nobody reads the answers: stop as for Shutdown, unanswered.
                        log.info("output closed: shutting down")
                        tasks.create_task(self._shutdown(None, set(in_flight), answer=False))
                        break
                    if not line.strip():
                        continue
                    request = parse_request(line)
                    if request.command is None:
                        log.info("invalid request: %s", request.error)
                        self._writer.answer(request.id, Invalid(request.error or "invalid request"))
                        continue
                    match request.command:
                        case Shutdown():
                            # Explicit stop: the engine interrupts what still runs.
                            log.info("Shutdown requested")
                            tasks.create_task(self._shutdown(request.id, set(in_flight)))
                            break
                        case DumpState():
                            track(tasks.create_task(self._dump_state(request.id, set(in_flight))))
                        case command:
                            room_id = getattr(command, "room_id", None)
                            before = self._lifecycle.get(room_id) if room_id else None
                            task = tasks.create_task(self._execute(request.id, command, before))
                            track(task)
                            if isinstance(command, OpenRoom | CloseRoom):
                                self._mark_lifecycle(command.room_id, task)
                else:
                    # End of input is not a request to interrupt: the commands
                    # already read finish and answer, then the rooms close.
                    log.info(
                        "end of input: waiting for %d command(s), then closing", len(in_flight)
                    )
                    if in_flight:
                        await asyncio.wait(set(in_flight))
                    tasks.create_task(self._shutdown(None, set(), answer=False))
        log.info("bridge done")
        return 0

    async def _until_broken(
        self, lines: AsyncIterator[bytes]
    ) -> AsyncGenerator[bytes | None, None]:
        """``lines``, then one ``None`` as soon as the output breaks (even mid-wait)."""
        source = aiter(lines)

        async def next_line() -> bytes:
            return await anext(source)

        # Both tasks are owned here: each is awaited, or cancelled and awaited on the
        # way out, whichever way the generator ends (exhausted, closed, cancelled).
        broken = asyncio.create_task(self._writer.wait_broken())
        line: asyncio.Task[bytes] | None = None
        try:
            while not broken.done():
                line = asyncio.create_task(next_line())
                await asyncio.wait({line, broken}, return_when=asyncio.FIRST_COMPLETED)
                if not line.done():
                    line.cancel()  # the output broke while waiting for a line
                    break
                read, line = line, None
                try:
                    value = read.result()
                except StopAsyncIteration:
                    return
                yield value
            yield None
        finally:
            pending = [task for task in (line, broken) if task is not None]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _dump_state(self, request_id: int | None, earlier: set[asyncio.Task[None]]) -> None:
        # A barrier: the state shows the outcome of every command read before
        # it, so a script can open, fill and dump without watching answers.
        if earlier:
            await asyncio.wait(earlier)
        self._writer.write({"id": request_id, "state": self._state_line(self._mirror)})
        self._writer.answer(request_id, Ok())

    async def _shutdown(
        self, request_id: int | None, others: set[asyncio.Task[None]], *, answer: bool = True
    ) -> None:
        result = await self._call(Shutdown())
        # The interrupted commands answer first: the Shutdown answer is the last line.
        if others:
            await asyncio.wait(others)
        if answer:
            self._writer.answer(request_id, result)
        elif not isinstance(result, Ok):
            log.warning("Shutdown answered %s", result)

    def _mark_lifecycle(self, room_id: str, task: asyncio.Task[None]) -> None:
        self._lifecycle[room_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._lifecycle.get(room_id) is done:
                del self._lifecycle[room_id]

        task.add_done_callback(forget)

    async def _execute(
        self, request_id: int | None, command: Command, before: asyncio.Task[None] | None = None
    ) -> None:
        if before is not None and not before.done():
            # An OpenRoom/CloseRoom of this room read earlier is still running:
            # a pipelined FillGap must find the room open, not RoomNotOpen.
            await asyncio.wait({before})
        self._writer.answer(request_id, await self._call(command))

    async def _call(self, command: Command) -> Answer:
        try:
            return await self._executor.execute(command)
        except Exception as exc:
            # An engine bug must not take the other commands down with it; the
            # traceback goes to stderr, the client gets a Failed answer.
            log.exception("%s raised", type(command).__name__)
            return Failed(f"internal error: {type(exc).__name__}: {exc}")
