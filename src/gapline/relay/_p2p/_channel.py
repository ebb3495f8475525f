"""Byte plumbing under yamux: negotiation lines on raw TCP, then the Noise-encrypted channel.

``Buffered`` turns "read some bytes" into "read a line / exactly n bytes" and keeps what
it read past that, so an optimistic dialer's first frame is not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable, Collection

from gapline.relay._p2p._multistream import HEADER, NA, MultistreamError, encode_line, read_line
from gapline.relay._p2p._noise import MAX_NOISE_MESSAGE, CipherState, NoiseError

__all__ = [
    "Buffered",
    "NoiseChannel",
    "TcpChannel",
    "negotiate_dialer",
    "negotiate_listener",
    "proposal",
]

_LEN = struct.Struct(">H")
_MAX_PLAINTEXT = MAX_NOISE_MESSAGE - 16


class Buffered:
    def __init__(self, read: Callable[[], Awaitable[bytes]]) -> None:
        self._read = read
        self.buffer = bytearray()

    async def fill(self) -> bool:
        chunk = await self._read()
        if not chunk:
            return False
        self.buffer += chunk
        return True

    async def line(self) -> str:
        while (got := read_line(bytes(self.buffer[:1100]))) is None:
            if not await self.fill():
                raise MultistreamError("channel ended during negotiation")
        text, used = got
        del self.buffer[:used]
        return text

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not await self.fill():
                raise NoiseError("channel ended mid-message")
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    def take(self) -> bytes:
        out = bytes(self.buffer)
        self.buffer.clear()
        return out


def proposal(protocol: str) -> bytes:
    """The dialer's header and proposal, sent at once (its first frame may follow)."""
    return encode_line(HEADER) + encode_line(protocol)


async def negotiate_dialer(
    write: Callable[[bytes], None] | None, incoming: Buffered, protocol: str
) -> None:
    """Propose ``protocol`` (unless ``write`` is None: already sent) and check the answer."""
    if write is not None:
        write(proposal(protocol))
    if await incoming.line() != HEADER:
        raise MultistreamError("peer does not speak multistream-select 1.0")
    answer = await incoming.line()
    if answer != protocol:
        raise MultistreamError(f"peer refused {protocol} ({answer})")


async def negotiate_listener(
    write: Callable[[bytes], None], incoming: Buffered, supported: Collection[str]
) -> str:
    """Agree on one of ``supported``; ``na`` to anything else, up to a few proposals."""
    if await incoming.line() != HEADER:
        raise MultistreamError("peer does not speak multistream-select 1.0")
    write(encode_line(HEADER))
    for _ in range(4):
        proposal = await incoming.line()
        if proposal in supported:
            write(encode_line(proposal))
            return proposal
        write(encode_line(NA))
    raise MultistreamError("no protocol agreed")


class TcpChannel:
    """Raw TCP: the first negotiation and the Noise handshake messages run here."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self) -> bytes:
        return await self.reader.read(65536)

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


class NoiseChannel:
    """The secure channel: 2-byte length, then ChaChaPoly ciphertext, per message.

    Writes are coalesced: the frames written during one turn of the event loop go out
    as one Noise message (or a few, when over the message size) in one transport write,
    flushed at the next turn, by ``drain`` once a message's worth is waiting, or at
    ``close``. Encrypting happens only in the flush, in write order, so the nonce order
    is the byte order without a lock.
    """

    def __init__(self, tcp: TcpChannel, incoming: Buffered, send: CipherState, recv: CipherState):
        self._tcp, self._in, self._send, self._recv = tcp, incoming, send, recv
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._scheduled = False
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        self._pending_size += len(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        if self._tcp.writer.is_closing():
            return  # the reader sees the end and shuts the session down
        if len(data) <= _MAX_PLAINTEXT:
            piece = self._send.encrypt(b"", data)
            self._tcp.write(_LEN.pack(len(piece)) + piece)
            return
        view, out = memoryview(data), []
        while view:
            piece = self._send.encrypt(b"", view[:_MAX_PLAINTEXT])
            out.append(_LEN.pack(len(piece)))
            out.append(piece)
            view = view[_MAX_PLAINTEXT:]
        self._tcp.write(b"".join(out))

    async def drain(self) -> None:
        if self._pending_size >= _MAX_PLAINTEXT:
            self._flush()  # a full message waits: out now, and let the transport push back
        # A broken connection shows up at the reader, which shuts the session down.
        with contextlib.suppress(ConnectionError):
            await self._tcp.drain()

    async def read(self) -> bytes:
        if not self._in.buffer and not await self._in.fill():
            return b""
        (length,) = _LEN.unpack(await self._in.exactly(2))
        return self._recv.decrypt(b"", await self._in.exactly(length))

    def close(self) -> None:
        self._flush()
        self._tcp.close()
