"""What the cache holds about one event from the events that relate to it.

An :class:`Aggregate` is kept per event id of a room (durable, sealed, in
``history_aggregate``), whether the event itself is retained or not yet: a
relation that arrives before its target (a fill or a back-pagination brings
events in any order) is held here and takes effect when the target arrives.
It holds:

- ``redacted_by``: a redaction of this event (a *tombstone*: the event, when
  it arrives, is stored without its content);
- ``edits``: ``m.replace`` candidates, held per sender until the target is
  known, then only its own sender's (:func:`with_edit`); at most
  :data:`EDITS_PER_SENDER` each, the oldest dropped first (``unknown_before``
  then says older revisions may exist that are not held);
- ``annotations``: reactions, one per (key, sender, event);
- ``thread``: the replies counted, the newest one, who took part, and the
  server's bundled figures when the root came with them.

Everything here is pure: functions take an aggregate and return a new one.
The choice of the visible revision (the newest valid one by
``(origin_server_ts, event_id)``, the rule the journal uses too) is
:func:`visible_revision`.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "EDITS_PER_SENDER",
    "EMPTY",
    "MAX_PARTICIPANTS",
    "Aggregate",
    "Annotation",
    "Revision",
    "ThreadReply",
    "ThreadState",
    "Visible",
    "decode_aggregate",
    "encode_aggregate",
    "only_sender",
    "visible_revision",
    "with_annotation",
    "with_edit",
    "with_latest_reply",
    "with_thread_bundle",
    "with_thread_reply",
    "without_relation",
]

EDITS_PER_SENDER = 20
MAX_PARTICIPANTS = 64


class Revision(msgspec.Struct, frozen=True, array_like=True):
    """An edit of the event: who sent it, when, and the content it puts in place."""

    event_id: str
    sender: str
    ts: int
    event_type: str
    content: dict[str, Any]

    @property
    def order(self) -> tuple[int, str]:
        return (self.ts, self.event_id)


class Annotation(msgspec.Struct, frozen=True, array_like=True):
    key: str
    sender: str
    event_id: str
    ts: int


class ThreadReply(msgspec.Struct, frozen=True, array_like=True):
    """The newest reply of a thread as its summary needs it (first line only)."""

    event_id: str
    sender: str
    ts: int
    sender_name: str | None = None
    body: str | None = None
    redacted: bool = False

    @property
    def order(self) -> tuple[int, str]:
        return (self.ts, self.event_id)


class ThreadState(msgspec.Struct, frozen=True, array_like=True):
    count: int = 0
    latest: ThreadReply | None = None
    participants: tuple[str, ...] = ()
    bundled_count: int = 0
    bundled_participated: bool = False


class Aggregate(msgspec.Struct, frozen=True, array_like=True):
    """``edits`` are in ``Revision.order``, ``annotations`` in ``(ts, event_id)``: only the
    functions here build them, and they keep it so (a newer one is appended unsorted)."""

    redacted_by: str | None = None
    edits: tuple[Revision, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    thread: ThreadState | None = None
    unknown_before: tuple[int, str] | None = None
    redacted_edits: tuple[tuple[int, str], ...] = ()


EMPTY = Aggregate()
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Aggregate).decode


def encode_aggregate(aggregate: Aggregate) -> bytes:
    return _encode(aggregate)


def decode_aggregate(data: bytes) -> Aggregate:
    return _decode(data)


# -- edits --------------------------------------------------------------------------------


def with_edit(
    aggregate: Aggregate, revision: Revision, original_sender: str | None, *, from_bundle: bool
) -> Aggregate:
    """Hold ``revision`` as a candidate replacement.

    With the original known (``original_sender``), an edit by anyone else is
    dropped; without it, edits are held per sender until the original shows
    who may edit it. A revision from a server's bundled aggregation says the
    server holds it as the newest: revisions older than it may exist that the
    cache does not hold (``unknown_before``).
    """
    if original_sender is not None and revision.sender != original_sender:
        return aggregate
    held = aggregate.edits
    order = revision.order
    if order in aggregate.redacted_edits:
        return aggregate
    unknown = aggregate.unknown_before
    if not held:
        edits = [revision]  # most targets: their first edit (one sender, nothing to drop)
    elif any(r.event_id == revision.event_id for r in held):
        return aggregate
    elif held[-1].order < order:
        edits = [*held, revision]  # newer than all held (the usual order): no sort
    else:
        edits = sorted((*held, revision), key=lambda r: r.order)
    if len(edits) > EDITS_PER_SENDER:
        mine = [r for r in edits if r.sender == revision.sender]
        if len(mine) > EDITS_PER_SENDER:
            dropped = mine[0]
            edits.remove(dropped)
            unknown = max(unknown or dropped.order, dropped.order)
    if from_bundle:
        unknown = max(unknown or revision.order, revision.order)
    return msgspec.structs.replace(aggregate, edits=tuple(edits), unknown_before=unknown)


def only_sender(aggregate: Aggregate, sender: str) -> Aggregate:
    """The original arrived: edits by anyone but its sender are dropped for good."""
    kept = tuple(r for r in aggregate.edits if r.sender == sender)
    if len(kept) == len(aggregate.edits):
        return aggregate
    return msgspec.structs.replace(aggregate, edits=kept)


class Visible(msgspec.Struct, frozen=True):
    """Which content a row shows: ``revision`` (``None``: the original's), and whether
    the revision that was shown got redacted with nothing held to fall back to."""

    revision: Revision | None
    lost: bool = False


_ORIGINAL = Visible(None)


def visible_revision(aggregate: Aggregate, original_sender: str, original_type: str) -> Visible:
    """The newest valid replacement by ``(origin_server_ts, event_id)``, or the original.

    Valid: sent by the original's sender, of the original's type. When the
    newest revision was redacted and older ones may exist that the cache does
    not hold (``unknown_before``), nothing is invented: the row shows as
    edited and redacted (``lost``).
    """
    if not aggregate.edits and not aggregate.redacted_edits:
        return _ORIGINAL  # most aggregates: reactions, a thread
    # ``edits`` are in order: the newest valid one is the last.
    best = next(
        (
            r
            for r in reversed(aggregate.edits)
            if r.sender == original_sender and r.event_type == original_type
        ),
        None,
    )
    newest_redacted = max(aggregate.redacted_edits) if aggregate.redacted_edits else None
    if newest_redacted is not None and (best is None or best.order < newest_redacted):
        unknown = aggregate.unknown_before
        if unknown is not None and (best is None or best.order < unknown):
            return Visible(None, lost=True)
    return Visible(best)


# -- reactions ----------------------------------------------------------------------------


def with_annotation(aggregate: Aggregate, annotation: Annotation) -> Aggregate:
    held = aggregate.annotations
    if not held:
        return msgspec.structs.replace(aggregate, annotations=(annotation,))
    if any(a.event_id == annotation.event_id for a in held):
        return aggregate
    last = held[-1]
    if (last.ts, last.event_id) < (annotation.ts, annotation.event_id):
        return msgspec.structs.replace(aggregate, annotations=(*held, annotation))
    ordered = sorted((*held, annotation), key=lambda a: (a.ts, a.event_id))
    return msgspec.structs.replace(aggregate, annotations=tuple(ordered))


# -- threads ------------------------------------------------------------------------------


def with_thread_reply(aggregate: Aggregate, reply: ThreadReply) -> Aggregate:
    """Count a thread reply seen for the first time (the caller dedups by event id)."""
    thread = aggregate.thread or ThreadState()
    latest = thread.latest
    if latest is None or reply.order > latest.order:
        latest = reply
    participants = thread.participants
    if reply.sender not in participants and len(participants) < MAX_PARTICIPANTS:
        participants = (*participants, reply.sender)
    return msgspec.structs.replace(
        aggregate,
        thread=msgspec.structs.replace(
            thread, count=thread.count + 1, latest=latest, participants=participants
        ),
    )


def with_thread_bundle(
    aggregate: Aggregate, count: int, latest: ThreadReply | None, participated: bool
) -> Aggregate:
    """The server's bundled summary of the thread (when the root arrived with one): its
    count is a floor, its newest reply is kept if newer than the cache's."""
    thread = aggregate.thread or ThreadState()
    newest = thread.latest
    if latest is not None and (newest is None or latest.order > newest.order):
        newest = latest
    return msgspec.structs.replace(
        aggregate,
        thread=msgspec.structs.replace(
            thread,
            bundled_count=max(thread.bundled_count, count),
            bundled_participated=thread.bundled_participated or participated,
            latest=newest,
        ),
    )


def with_latest_reply(aggregate: Aggregate, reply: ThreadReply) -> Aggregate:
    """The thread's newest reply changed (edited, redacted): show it as it is now."""
    thread = aggregate.thread
    if thread is None or thread.latest is None or thread.latest.event_id != reply.event_id:
        return aggregate
    return msgspec.structs.replace(aggregate, thread=msgspec.structs.replace(thread, latest=reply))


# -- redactions ---------------------------------------------------------------------------


def without_relation(aggregate: Aggregate, event_id: str) -> Aggregate:
    """A relation event (edit, reaction) of this target was redacted: it no longer counts.

    A redacted edit is remembered by its order, so that the same revision
    coming back (from a server's bundle, say) is not held again, and so that
    :func:`visible_revision` knows the shown revision went away.
    """
    edits = tuple(r for r in aggregate.edits if r.event_id != event_id)
    redacted = aggregate.redacted_edits
    for r in aggregate.edits:
        if r.event_id == event_id:
            redacted = (*redacted, r.order)
    annotations = tuple(a for a in aggregate.annotations if a.event_id != event_id)
    if edits == aggregate.edits and annotations == aggregate.annotations:
        return aggregate
    return msgspec.structs.replace(
        aggregate, edits=edits, annotations=annotations, redacted_edits=redacted
    )
