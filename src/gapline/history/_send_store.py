"""The send queue's table (``history_send``): what was queued, in order, until the room has it.

A queued message is one row, written before any request is made. Its
transaction id is fixed there, so every attempt (after a timeout, after a
crash) is the same request to the homeserver, which answers a repeat with the
first event id and writes nothing. The row goes through three states:

- ``pending``: not acknowledged yet; the worker sends it;
- ``sent``: the server answered with its event id; the row waits for the sync
  that brings the event (and keeps showing the local echo until then);
- ``failed``: the server refused it for good; the row keeps the text and why.

The row is deleted in the same transaction that retains the server's event
(:meth:`SendTable.settle`, called from the sync commit), so a crash at any
point leaves either the row or the event, never neither and never both shown.
Rows that cannot be opened (tampered, truncated) are skipped and reported, the
rest are sent.

Everything here is a plain function of a transaction, like the rest of the cache.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgspec

from gapline.history._updates import EchoSettled
from gapline.matrix import ClientEvent
from gapline.storage import CipherError, Tx

if TYPE_CHECKING:
    from gapline.history._cache_store import CacheStore

__all__ = ["CorruptSend", "QueuedSend", "SendRow", "SendTable"]

log = logging.getLogger("gapline.history")


class SendRow(enum.Enum):
    """The stored state of a queued message (see the module docstring)."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class _Payload(msgspec.Struct, frozen=True, kw_only=True):
    room_id: str
    event_type: str
    content: dict[str, Any]
    created_ts: int
    thread_root: str | None = None
    redacts: str | None = None


@dataclass(frozen=True, slots=True)
class QueuedSend:
    """One queued message as the queue holds it."""

    seq: int
    txn_id: str
    room_id: str
    event_type: str
    content: dict[str, Any]
    created_ts: int
    state: SendRow
    thread_root: str | None = None
    event_id: str | None = None
    failure: str | None = None
    redacts: str | None = None
    """For a redaction (``event_type`` ``m.room.redaction``): the event it deletes."""

    @property
    def body(self) -> str | None:
        body = self.content.get("body")
        return body if isinstance(body, str) else None

    @property
    def is_message(self) -> bool:
        """A new message (a row of its timeline), not a reaction, edit or redaction."""
        relates = self.content.get("m.relates_to")
        replaces = isinstance(relates, dict) and relates.get("rel_type") == "m.replace"
        return self.event_type == "m.room.message" and not replaces


@dataclass(frozen=True, slots=True)
class CorruptSend:
    """A queue row that could not be opened: skipped, reported, kept for inspection."""

    seq: int
    txn_id: str
    reason: str


_COLUMNS = "seq, txn_id, state, event_id, failure, value"


class SendTable:
    """The queue's reads and writes over one cache store."""

    def __init__(self, store: CacheStore) -> None:
        self._store = store
        self._encode = msgspec.json.Encoder().encode
        self._decode = msgspec.json.Decoder(_Payload).decode
        self.corrupt: dict[int, CorruptSend] = {}
        """Rows found unreadable so far (by seq), each reported once."""
        self._last_seq = 0
        self.settled = 0
        """Rows settled by syncs so far (a changed count means the queue's counts moved)."""

    # -- codec ---------------------------------------------------------------------------

    @staticmethod
    def _aad(txn_id: str, part: str) -> bytes:
        return b"history/send/" + txn_id.encode() + b"/" + part.encode()

    def _open(self, row: tuple[Any, ...]) -> QueuedSend | None:
        seq, txn_id, state, event_id, failure, value = row
        cipher = self._store.cipher
        try:
            payload = self._decode(cipher.decrypt(bytes(value), self._aad(txn_id, "value")))
            return QueuedSend(
                seq=seq,
                txn_id=txn_id,
                room_id=payload.room_id,
                event_type=payload.event_type,
                content=payload.content,
                created_ts=payload.created_ts,
                state=SendRow(state),
                thread_root=payload.thread_root,
                redacts=payload.redacts,
                event_id=None
                if event_id is None
                else cipher.decrypt(bytes(event_id), self._aad(txn_id, "event")).decode(),
                failure=None
                if failure is None
                else cipher.decrypt(bytes(failure), self._aad(txn_id, "failure")).decode(),
            )
        except (CipherError, msgspec.DecodeError, ValueError, UnicodeDecodeError) as exc:
            if seq not in self.corrupt:
                self.corrupt[seq] = CorruptSend(seq, txn_id, str(exc))
                log.error(
                    "send queue: row %d (transaction %s) cannot be read and is skipped: %s",
                    seq,
                    txn_id,
                    exc,
                )
            return None

    def _rows(self, tx: Tx, where: str, params: tuple[Any, ...] = ()) -> list[QueuedSend]:
        rows = tx.all(f"SELECT {_COLUMNS} FROM history_send {where} ORDER BY seq", params)
        return [q for q in map(self._open, rows) if q is not None]

    # -- writes ----------------------------------------------------------------------------

    def enqueue(
        self,
        tx: Tx,
        *,
        txn_id: str,
        room_id: str,
        event_type: str,
        content: dict[str, Any],
        created_ts: int,
        thread_root: str | None = None,
        redacts: str | None = None,
    ) -> QueuedSend:
        # Positions only grow while the process runs (the worker's cursor relies on
        # it), also after the table emptied; an empty table after a restart may start
        # again at 1, as nothing queued is left to come after.
        row = tx.one("SELECT COALESCE(MAX(seq), 0) FROM history_send")
        seq = max(int(row[0]) if row is not None else 0, self._last_seq) + 1
        self._last_seq = seq
        payload = _Payload(
            room_id=room_id,
            event_type=event_type,
            content=content,
            created_ts=created_ts,
            thread_root=thread_root,
            redacts=redacts,
        )
        sealed = self._store.cipher.encrypt(self._encode(payload), self._aad(txn_id, "value"))
        tx.execute(
            "INSERT INTO history_send (seq, txn_id, room, state, value) VALUES (?, ?, ?, ?, ?)",
            (seq, txn_id, self._store.room_key(room_id), SendRow.PENDING.value, sealed),
        )
        return QueuedSend(
            seq=seq,
            txn_id=txn_id,
            room_id=room_id,
            event_type=event_type,
            content=content,
            created_ts=created_ts,
            state=SendRow.PENDING,
            thread_root=thread_root,
            redacts=redacts,
        )

    def get(self, tx: Tx, txn_id: str) -> QueuedSend | None:
        row = tx.one(f"SELECT {_COLUMNS} FROM history_send WHERE txn_id = ?", (txn_id,))
        return None if row is None else self._open(row)

    def mark_sent(self, tx: Tx, txn_id: str, event_id: str) -> QueuedSend | None:
        """The server answered ``event_id``. ``None`` when the row is gone (the sync already
        brought the event); a row whose event the room already retains is settled here."""
        queued = self.get(tx, txn_id)
        if queued is None:
            return None
        room = self._store.find_room(tx, queued.room_id)
        event = self._store.event_key(event_id)
        if room is not None and tx.one(
            "SELECT 1 FROM history_event WHERE room = ? AND event = ?", (room.rid, event)
        ):
            # The sync brought the event first, without our transaction id to match it.
            tx.execute("DELETE FROM history_send WHERE txn_id = ?", (txn_id,))
            return None
        sealed = self._store.cipher.encrypt(event_id.encode(), self._aad(txn_id, "event"))
        tx.execute(
            "UPDATE history_send SET state = ?, event = ?, event_id = ? WHERE txn_id = ?",
            (SendRow.SENT.value, event, sealed, txn_id),
        )
        return replace(queued, state=SendRow.SENT, event_id=event_id)

    def mark_failed(self, tx: Tx, txn_id: str, why: str) -> QueuedSend | None:
        queued = self.get(tx, txn_id)
        if queued is None:
            return None
        sealed = self._store.cipher.encrypt(why.encode(), self._aad(txn_id, "failure"))
        tx.execute(
            "UPDATE history_send SET state = ?, failure = ? WHERE txn_id = ?",
            (SendRow.FAILED.value, sealed, txn_id),
        )
        return replace(queued, state=SendRow.FAILED, failure=why)

    def retry(self, tx: Tx, txn_id: str) -> QueuedSend | None:
        """A failed row goes back to pending (same transaction id); ``None``: not failed."""
        queued = self.get(tx, txn_id)
        if queued is None or queued.state is not SendRow.FAILED:
            return None
        tx.execute(
            "UPDATE history_send SET state = ?, failure = NULL WHERE txn_id = ?",
            (SendRow.PENDING.value, txn_id),
        )
        return replace(queued, state=SendRow.PENDING, failure=None)

    def cancel(self, tx: Tx, txn_id: str) -> QueuedSend | None:
        """Drop a pending or failed row; ``None`` when there is none to drop (a row the
        server acknowledged is in the room already and cannot be cancelled)."""
        queued = self.get(tx, txn_id)
        if queued is None or queued.state is SendRow.SENT:
            return None
        tx.execute("DELETE FROM history_send WHERE txn_id = ?", (txn_id,))
        return queued

    def drop_unreadable(self, tx: Tx, seq: int) -> bool:
        """Delete a row reported unreadable (an operator's decision, never automatic)."""
        self.corrupt.pop(seq, None)
        return tx.execute("DELETE FROM history_send WHERE seq = ?", (seq,)) > 0

    def settle(
        self, tx: Tx, room_id: str, events: Iterable[ClientEvent], *, limited: bool
    ) -> list[EchoSettled]:
        """A sync retained ``events`` in the room: delete the queue rows they answer (by
        our transaction id on the server's echo, or by the event id the server gave). A
        limited sync skipped events: rows the server acknowledged are in the room's gap
        and settle too (filling the gap shows them)."""
        rows = tx.all(
            f"SELECT {_COLUMNS}, event FROM history_send WHERE room = ? ORDER BY seq",
            (self._store.room_key(room_id),),
        )
        if not rows:
            return []
        events = list(events)
        by_txn = {e.transaction_id: e.event_id for e in events if e.transaction_id}
        hashes = set(self._store.event_keys([e.event_id for e in events]))
        out: list[EchoSettled] = []
        for row in rows:
            txn_id, state, event = row[1], row[2], row[6]
            event_id = by_txn.get(txn_id)
            hit = event_id is not None or (event is not None and bytes(event) in hashes)
            if not hit and not (limited and state == SendRow.SENT.value):
                continue
            tx.execute("DELETE FROM history_send WHERE txn_id = ?", (txn_id,))
            out.append(EchoSettled(txn_id, event_id))
        self.settled += len(out)
        return out

    # -- reads -----------------------------------------------------------------------------

    def next_pending(self, tx: Tx, after: int) -> tuple[QueuedSend | None, int]:
        """The first readable pending row after queue position ``after``, and the last
        position looked at (unreadable rows on the way are reported and stepped over)."""
        rows, last = self.pending_batch(tx, after, 1)
        return (rows[0], rows[0].seq) if rows else (None, last)

    def pending_batch(self, tx: Tx, after: int, limit: int) -> tuple[list[QueuedSend], int]:
        """Up to ``limit`` readable pending rows after queue position ``after``, in queue
        order, and the last position looked at (unreadable rows are reported and stepped
        over; none readable and a position moved means: look again from there)."""
        while True:
            rows = tx.all(
                f"SELECT {_COLUMNS} FROM history_send WHERE state = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                (SendRow.PENDING.value, after, max(limit, 32)),
            )
            if not rows:
                return [], after
            out: list[QueuedSend] = []
            for row in rows:
                queued = self._open(row)
                after = row[0]
                if queued is not None:
                    out.append(queued)
                    if len(out) == limit:
                        return out, after
            if out:
                return out, after

    def of_room(self, tx: Tx, room_id: str, thread_root: str | None = None) -> list[QueuedSend]:
        """The room's (or thread's) local echo rows, oldest first: its queued messages, and
        the reactions, edits and redactions the homeserver refused (the others are not
        rows until then)."""
        rows = self._rows(tx, "WHERE room = ?", (self._store.room_key(room_id),))
        return [
            q
            for q in rows
            if q.thread_root == thread_root and (q.is_message or q.state is SendRow.FAILED)
        ]

    def counts(self, tx: Tx) -> tuple[int, int]:
        """How many rows wait to be sent (pending or acknowledged, not yet synced) and how
        many failed."""
        failed = SendRow.FAILED.value
        row = tx.one(
            "SELECT COALESCE(SUM(CASE WHEN state = ? THEN 0 ELSE 1 END), 0),"
            " COALESCE(SUM(CASE WHEN state = ? THEN 1 ELSE 0 END), 0) FROM history_send",
            (failed, failed),
        )
        return (0, 0) if row is None else (int(row[0]), int(row[1]))
