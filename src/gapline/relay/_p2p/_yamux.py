"""Yamux (``/yamux/1.0.0``) stream multiplexing over one secure channel.

Frames are a 12-byte header (version 0, type, flags, stream ID, length) and, for data,
the payload. Each stream has a 256 KiB receive window that the reader re-opens as it
consumes; a peer that sends past the window, uses an unknown frame type or version, or
reuses a stream ID breaks the session (GoAway, connection closed). The dialer opens
odd stream IDs, the listener even ones. Inbound streams wait in a bounded backlog; one
over the bound is reset, so a peer cannot queue unbounded work.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Protocol

__all__ = ["INITIAL_WINDOW", "StreamReset", "YamuxError", "YamuxSession", "YamuxStream"]

INITIAL_WINDOW = 256 * 1024
_HEADER = struct.Struct(">BBHII")
_DATA, _WINDOW, _PING, _GO_AWAY = 0, 1, 2, 3
_SYN, _ACK, _FIN, _RST = 1, 2, 4, 8
_MAX_FRAME_DATA = 64 * 1024 - 256  # a data frame plus header fits one Noise message
_GO_AWAY_PROTOCOL_ERROR = 1


class YamuxError(Exception):
    """A session-level protocol violation: the connection is closed."""


class StreamReset(Exception):
    """The stream was reset (by either side) or its session ended."""


class Channel(Protocol):
    """An ordered, reliable, already-secured byte channel."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    async def read(self) -> bytes: ...  # the next chunk; b"" at end of channel

    def close(self) -> None: ...


def _frame(kind: int, flags: int, stream_id: int, length: int, data: bytes = b"") -> bytes:
    return _HEADER.pack(0, kind, flags, stream_id, length) + data


class YamuxStream:
    """One bidirectional stream; ``read`` gives b"" after the peer's FIN."""

    def __init__(self, session: YamuxSession, stream_id: int) -> None:
        self._session = session
        self.id = stream_id
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._send_window = INITIAL_WINDOW
        self._recv_window = INITIAL_WINDOW
        self._consumed = 0
        self.remote_closed = False
        self.local_closed = False
        self.reset_ = False

    # -- session side -------------------------------------------------------------
    def _on_data(self, data: bytes) -> None:
        if len(data) > self._recv_window:
            raise YamuxError("peer sent past the stream's receive window")
        self._recv_window -= len(data)
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
        self._readable.set()

    def _on_window(self, delta: int) -> None:
        self._send_window += delta
        if self._send_window > 0:
            self._writable.set()

    def _on_fin(self) -> None:
        self.remote_closed = True
        self._readable.set()

    def _on_reset(self) -> None:
        self.reset_ = True
        self._readable.set()
        self._writable.set()

    # -- user side ----------------------------------------------------------------
    async def read(self, limit: int = 65536) -> bytes:
        while not self._chunks:
            if self.reset_:
                raise StreamReset(f"stream {self.id} reset")
            if self.remote_closed:
                return b""
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        if len(chunk) > limit:
            self._chunks.appendleft(chunk[limit:])
            chunk = chunk[:limit]
        self._buffered -= len(chunk)
        self._consumed += len(chunk)
        if self._consumed >= INITIAL_WINDOW // 2 and not self.reset_:
            self._recv_window += self._consumed
            self._session._send(_frame(_WINDOW, 0, self.id, self._consumed))
            self._consumed = 0
        return chunk

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.reset_:
                raise StreamReset(f"stream {self.id} reset")
            if self.local_closed:
                raise StreamReset("write after close")
            if self._send_window <= 0:
                self._writable.clear()
                await self._writable.wait()
                continue
            size = min(len(view), self._send_window, _MAX_FRAME_DATA)
            self._send_window -= size
            # The channel keeps what it is given until its flush: never a view of a
            # buffer the caller may reuse, and no copy of a whole immutable payload.
            whole = isinstance(data, bytes) and size == len(data)
            self._session._send(
                _frame(_DATA, 0, self.id, size), data if whole else bytes(view[:size])
            )
            view = view[size:]
        await self._session._drain()

    def send_now(self, data: bytes) -> None:
        """Queue a small write without waiting for the window (negotiation lines)."""
        if self.reset_ or self.local_closed:
            raise StreamReset(f"stream {self.id} is closed")
        self._send_window -= len(data)
        self._session._send(_frame(_DATA, 0, self.id, len(data)), bytes(data))

    async def close(self) -> None:
        """Half-close: send FIN (reading stays possible)."""
        if self.local_closed or self.reset_:
            return
        self.local_closed = True
        self._session._send(_frame(_WINDOW, _FIN, self.id, 0))
        self._session._maybe_forget(self)
        await self._session._drain()

    def reset(self) -> None:
        """Abort the stream both ways (RST)."""
        if self.reset_:
            return
        self._on_reset()
        self._session._send(_frame(_WINDOW, _RST, self.id, 0))
        self._session._forget(self)


class YamuxSession:
    """The multiplexer of one connection. ``run`` is its reader; its owner awaits it."""

    def __init__(self, channel: Channel, *, client: bool, backlog: int = 256) -> None:
        self._channel = channel
        self._next_id = 1 if client else 2
        self._streams: dict[int, YamuxStream] = {}
        self._inbound: asyncio.Queue[YamuxStream | None] = asyncio.Queue()
        self._backlog = backlog
        self._closed = False
        self.ended = asyncio.Event()
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._ping_id = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def _send(self, frame: bytes, data: bytes = b"") -> None:
        """A frame's header, then its data (the channel coalesces them into one write)."""
        if not self._closed:
            self._channel.write(frame)
            if data:
                self._channel.write(data)

    async def _drain(self) -> None:
        if not self._closed:
            await self._channel.drain()

    def _forget(self, stream: YamuxStream) -> None:
        self._streams.pop(stream.id, None)

    def _maybe_forget(self, stream: YamuxStream) -> None:
        if stream.local_closed and stream.remote_closed:
            self._forget(stream)

    def open_stream(self) -> YamuxStream:
        if self._closed:
            raise StreamReset("session closed")
        stream = YamuxStream(self, self._next_id)
        self._next_id += 2
        self._streams[stream.id] = stream
        self._send(_frame(_WINDOW, _SYN, stream.id, 0))
        return stream

    async def accept(self) -> YamuxStream | None:
        """The next inbound stream, or None once the session has ended."""
        if self._closed and self._inbound.empty():
            return None
        return await self._inbound.get()

    async def ping(self) -> None:
        self._ping_id += 1
        waiter = asyncio.get_running_loop().create_future()
        self._pings[self._ping_id] = waiter
        self._send(_frame(_PING, _SYN, 0, self._ping_id))
        await self._drain()
        await waiter

    def close(self) -> None:
        if self._closed:
            return
        self._send(_frame(_GO_AWAY, 0, 0, 0))
        self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        for stream in list(self._streams.values()):
            stream._on_reset()
        self._streams.clear()
        for waiter in self._pings.values():
            if not waiter.done():
                waiter.set_exception(StreamReset("session closed"))
        self._inbound.put_nowait(None)
        self._channel.close()
        self.ended.set()

    async def run(self) -> None:
        """Read frames until the channel ends or the peer breaks the protocol."""
        buffer = bytearray()
        try:
            while True:
                chunk = await self._channel.read()
                if not chunk:
                    return
                buffer += chunk
                while len(buffer) >= _HEADER.size:
                    version, kind, flags, stream_id, length = _HEADER.unpack_from(buffer)
                    if version != 0 or kind > _GO_AWAY:
                        raise YamuxError("unknown yamux version or frame type")
                    size = _HEADER.size + (length if kind == _DATA else 0)
                    if len(buffer) < size:
                        break
                    data = bytes(buffer[_HEADER.size : size])
                    del buffer[:size]
                    if self._frame(kind, flags, stream_id, length, data):
                        return
        except YamuxError:
            self._send(_frame(_GO_AWAY, 0, 0, _GO_AWAY_PROTOCOL_ERROR))
            raise
        finally:
            self._shutdown()

    def _frame(self, kind: int, flags: int, stream_id: int, length: int, data: bytes) -> bool:
        """Apply one frame; True when the peer went away."""
        if kind == _PING:
            if flags & _SYN:
                self._send(_frame(_PING, _ACK, 0, length))
            elif flags & _ACK and (waiter := self._pings.pop(length, None)) is not None:
                waiter.set_result(None)
            return False
        if kind == _GO_AWAY:
            return True
        if stream_id == 0:
            raise YamuxError("stream frame on the session ID")
        stream = self._streams.get(stream_id)
        if flags & _SYN:
            if stream is not None or stream_id % 2 == self._next_id % 2:
                raise YamuxError("SYN for a stream ID that is in use or not the peer's")
            stream = YamuxStream(self, stream_id)
            if self._inbound.qsize() >= self._backlog:
                self._send(_frame(_WINDOW, _RST, stream_id, 0))
                return False
            self._streams[stream_id] = stream
            self._send(_frame(_WINDOW, _ACK, stream_id, 0))
            self._inbound.put_nowait(stream)
        if stream is None:
            return False  # a frame for a stream already forgotten (reset or closed)
        if kind == _DATA:
            stream._on_data(data)
        elif length:
            stream._on_window(length)
        if flags & _RST:
            stream._on_reset()
            self._forget(stream)
        elif flags & _FIN:
            stream._on_fin()
            self._maybe_forget(stream)
        return False
