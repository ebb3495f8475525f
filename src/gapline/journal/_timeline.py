"""Reading one room of a sync answer: timeline provenance, the completion of a limited
timeline, and the room-lifecycle plan for our own member events in the state block.

This is the sync client's part of ingress, the part the reference design leaves to its
Matrix library (nio): the library labels each timeline event with its provenance and,
when a timeline is ``limited``, pages the events the server left out back from
``prev_batch`` to the previous sync token before handing the timeline over, so every
event arrives with the label the sync answer implies. Ingress maps those labels
directly and infers nothing. The completion is how the sync answer is *read*, not a
repair of the projection: it runs once, bounded, at the moment the gap is reported,
and what it cannot fetch (its budget ran out, the homeserver failed) is written down as
a history recovery record (the room's conversations go cold, so the next read hydrates
them) rather than walked again. The projection's one repair stays the point refetch.

Provenance, from the sync answer alone:

- every timeline event of the first sync (no stored token) is ``HISTORY``;
- a timeline event of an incremental sync is ``LIVE``;
- the timeline of a ``limited`` incremental sync is ``RECOVERED``, and so are the events
  its completion paged back, admitted before it, oldest first.

The state block carries no provenance at all (nothing labels it), so our own member
events there get their own rule, :func:`room_member_sync_state_plan`: it may look at
``timeline.limited`` and the previous membership to choose between dispatching a
departure and recording a baseline, and never labels anything LIVE, RECOVERED or HISTORY.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gapline.journal._types import Provenance
from gapline.matrix import ClientEvent, Direction, JoinedRoom, MatrixError, MessagesResponse

__all__ = [
    "CompletedTimeline",
    "MemberStatePlan",
    "TimelineSource",
    "complete_timeline",
    "is_own_departure",
    "is_own_membership",
    "is_own_new_join",
    "prev_membership",
    "room_member_sync_state_plan",
    "timeline_provenance",
]

log = logging.getLogger("gapline.journal.ingress")


class TimelineSource(Protocol):
    async def messages(
        self,
        room_id: str,
        *,
        from_: str | None = None,
        to: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        limit: int | None = None,
        filter: str | Mapping[str, Any] | None = None,
    ) -> MessagesResponse: ...


def prev_membership(event: ClientEvent) -> str | None:
    """The membership before this member event, as the server says in ``unsigned``."""
    prev = event.unsigned.get("prev_content")
    value = prev.get("membership") if isinstance(prev, Mapping) else None
    return value if isinstance(value, str) else None


def is_own_membership(event: ClientEvent, principal_id: str) -> bool:
    return event.type == "m.room.member" and event.state_key == principal_id


def is_own_new_join(event: ClientEvent, principal_id: str) -> bool:
    """Our own join that starts a membership (not a profile change: join after join)."""
    return (
        is_own_membership(event, principal_id)
        and event.content.get("membership") == "join"
        and prev_membership(event) != "join"
    )


def is_own_departure(event: ClientEvent, principal_id: str) -> bool:
    """Our own leave or ban, except the rejection of an invite (never a member: nothing
    to fence)."""
    return (
        is_own_membership(event, principal_id)
        and event.content.get("membership") in ("leave", "ban")
        and prev_membership(event) != "invite"
    )


def timeline_provenance(*, initial: bool, limited: bool) -> Provenance:
    if initial:
        return Provenance.HISTORY
    return Provenance.RECOVERED if limited else Provenance.LIVE


@dataclass(frozen=True, slots=True)
class MemberStatePlan:
    """What our own member events in one joined room's state block ask of ingress.

    ``dispatch``: departures the timeline never showed (the server left them in the
    gap), each to be fenced once as a reported departure before the timeline is
    admitted. ``record``: a membership that started inside the gap, the room's new
    baseline: the gap is still completed (what came after the join was said to us, and
    a departure before it must still be fenced), and whatever the completion finds from
    before the join is context, never a turn, as for our join inside a timeline.
    """

    dispatch: tuple[ClientEvent, ...] = ()
    record: tuple[ClientEvent, ...] = ()


def room_member_sync_state_plan(
    room: JoinedRoom, *, principal_id: str, initial: bool
) -> MemberStatePlan:
    """Dispatch or baseline record for our member events in ``room.state`` (contract 11).

    It consults only ``room.timeline.limited`` and each event's previous membership:

    - a first sync, or a timeline that is not limited: a baseline record (the state is
      where this journal starts, or a full-state answer restating it);
    - limited, our leave or ban (not the rejection of an invite): a departure inside the
      gap, dispatched;
    - limited, our join after anything but a join: a new membership inside the gap,
      recorded; a join after a join is a profile change and asks nothing.

    A kick and a rejoin both inside one gap leave only the join in the state block, and
    the previous membership of that join (an invite) cannot tell a rejoin from a first
    join: no departure is dispatched then. Guessing one would advance the epoch twice
    for a departure an earlier sync already reported.
    """
    own = [e for e in room.state.events if is_own_membership(e, principal_id)]
    if initial or not room.timeline.limited:
        return MemberStatePlan(record=tuple(own))
    dispatch: list[ClientEvent] = []
    record: list[ClientEvent] = []
    for event in own:
        if is_own_departure(event, principal_id):
            dispatch.append(event)
        elif is_own_new_join(event, principal_id):
            record.append(event)
    return MemberStatePlan(dispatch=tuple(dispatch), record=tuple(record))


@dataclass(frozen=True, slots=True)
class CompletedTimeline:
    """One room's timeline as ingress admits it: the recovered gap (oldest first), then
    the timeline, all with one provenance. ``complete`` is False when the server said
    events were left out and not all of them could be paged back."""

    gap: tuple[ClientEvent, ...]
    events: tuple[ClientEvent, ...]
    provenance: Provenance
    complete: bool = True


async def complete_timeline(
    source: TimelineSource,
    room_id: str,
    room: JoinedRoom,
    *,
    principal_id: str,
    since: str | None,
    page_size: int,
    max_pages: int,
) -> CompletedTimeline:
    """Label the room's timeline and, when it is limited, complete it back to ``since``.

    No completion when the timeline holds our join: the whole gap predates the
    membership. (When the state block says our membership began inside the gap, the gap
    holds the join: ingress admits what precedes it there as context.)
    """
    timeline = room.timeline
    provenance = timeline_provenance(initial=since is None, limited=timeline.limited)
    events = tuple(timeline.events)
    if (
        since is None
        or not timeline.limited
        or timeline.prev_batch is None
        or any(is_own_new_join(e, principal_id) for e in events)
    ):
        return CompletedTimeline((), events, provenance)
    gap, complete = await _page_back(
        source,
        room_id,
        timeline.prev_batch,
        since,
        page_size=page_size,
        max_pages=max_pages,
    )
    return CompletedTimeline(tuple(gap), events, provenance, complete)


async def _page_back(
    source: TimelineSource,
    room_id: str,
    prev_batch: str,
    since: str,
    *,
    page_size: int,
    max_pages: int,
) -> tuple[Sequence[ClientEvent], bool]:
    """The events a limited sync left out, oldest first, and whether that is all of them."""
    events: list[ClientEvent] = []
    from_ = prev_batch
    for _ in range(max_pages):
        try:
            page = await source.messages(
                room_id, from_=from_, to=since, dir=Direction.BACKWARD, limit=page_size
            )
        except MatrixError as exc:
            # The sync position must not wait on this room: what was not fetched is
            # recorded by the caller, and every other room goes on.
            log.warning("gap completion failed", extra={"room_id": room_id, "error": str(exc)})
            events.reverse()
            return events, False
        events.extend(page.chunk)
        if not page.end:  # an empty page with an end may be a span we cannot see: go on
            events.reverse()
            return events, True
        from_ = page.end
    log.warning("gap completion stopped at its page budget", extra={"room_id": room_id})
    events.reverse()
    return events, False
