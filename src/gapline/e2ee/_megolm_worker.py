"""The Megolm decrypt calls of a large heal, in a process of their own (its child side).

Run by path (``python -I .../_megolm_worker.py``), not as ``-m gapline.e2ee...``: it
imports vodozemac and msgspec only, so it is ready in the time those two take to
import and not the whole package's. It reads frames from stdin and answers each on
stdout; a frame is a 4-byte big-endian length and a msgpack body.

It is given the inbound sessions it needs (pickled under a key made for this worker,
sent in the same pipe) and, per job, a chunk's ciphertexts, and returns for each the
vodozemac result only (the message index and the plaintext, or the error's text).
Every rule about what a result means (the first known index, the replay index, the
claimed sender, the plaintext's checks, trust) stays with the parent's
`InboundGroupSessions`, which applies them exactly as to its own calls. Nothing is
written anywhere: the key material lives in this process's memory and the pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import struct
import sys
from typing import BinaryIO

import msgspec
import vodozemac

FRAME_LEN = struct.Struct(">I")
PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged process


class RawDecryption(msgspec.Struct, array_like=True, frozen=True):
    """One ciphertext's vodozemac result: ``index`` -1 when it did not decode (``error``
    says why); otherwise its message index and the plaintext, or the decryption error."""

    index: int
    plaintext: bytes | None = None
    error: str | None = None


class Job(msgspec.Struct, array_like=True, frozen=True):
    """Sessions to add (slot, pickle) under ``key``, then the items to decrypt: (the
    session's slot, the ciphertext), or None for an event the worker is not asked about.
    ``forget``: drop every session held first (a heal ended; its keys go with it)."""

    key: bytes | None
    sessions: list[tuple[int, str]]
    items: list[tuple[int, str] | None]
    forget: bool = False


HELLO = b"ready"

_encode = msgspec.msgpack.Encoder().encode
_decode_job = msgspec.msgpack.Decoder(Job).decode


def decrypt_one(session: vodozemac.InboundGroupSession, ciphertext: str) -> RawDecryption:
    """The vodozemac calls of one event, as the in-process path makes them."""
    try:
        message = vodozemac.MegolmMessage.from_base64(ciphertext)
    except (vodozemac.DecodeException, ValueError) as exc:
        return RawDecryption(-1, None, str(exc))
    index = message.message_index()
    try:
        return RawDecryption(index, session.decrypt(message).plaintext)
    except vodozemac.MegolmDecryptionException as exc:
        return RawDecryption(index, None, str(exc))


def write_frame(out: BinaryIO, body: bytes) -> None:
    out.write(FRAME_LEN.pack(len(body)))
    out.write(body)
    out.flush()


def read_frame(inp: BinaryIO) -> bytes | None:
    head = inp.read(FRAME_LEN.size)
    if len(head) < FRAME_LEN.size:
        return None  # the parent closed the pipe: the work is over
    (size,) = FRAME_LEN.unpack(head)
    body = inp.read(size)
    if len(body) < size:
        return None
    return body


def widen(*streams: BinaryIO) -> None:
    """Pipes that hold a whole chunk's frame (Linux; elsewhere they stay as they are).

    With the default 64 KiB a chunk's ciphertexts (about 170 KB) and plaintexts cross in
    several writes, and the parent makes the ones after the first while its writer
    thread runs the last chunk's write in Python: each ``os.write`` or ``read`` there
    gives up the GIL and waits up to the switch interval to get it back (about 2 ms a
    call, measured). A frame that fits crosses in one call."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setter is None:
        return
    for stream in streams:
        # Not a pipe, or a lower system limit: a tuning only (frames take more calls).
        with contextlib.suppress(OSError):
            fcntl.fcntl(stream.fileno(), setter, PIPE_BYTES)


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    sessions: dict[int, vodozemac.InboundGroupSession] = {}
    key = b""
    widen(inp, out)
    write_frame(out, HELLO)
    while (frame := read_frame(inp)) is not None:
        job = _decode_job(frame)
        if job.forget:
            sessions.clear()
        if job.key is not None:
            key = job.key
        for slot, pickle in job.sessions:
            sessions[slot] = vodozemac.InboundGroupSession.from_pickle(pickle, key)
        results: list[RawDecryption | None] = []
        for item in job.items:
            if item is None:
                results.append(None)
            else:
                results.append(decrypt_one(sessions[item[0]], item[1]))
        write_frame(out, _encode(results))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
