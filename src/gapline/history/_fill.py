"""A backwards walk over ``/messages`` as a generator, after httpx's ``Auth.auth_flow``.

The flow holds the policy (page budget, repeated-cursor detection, how a walk
ends and what it counted) and does no I/O. It yields two kinds of effects:

- :class:`Fetch` carries a ``gapline.matrix`` request; send it the
  ``MessagesResponse``;
- :class:`Commit` carries the page to commit (events and the new cursor, in one
  transaction); send it the :class:`~gapline.history._walk_state.PageResult`.

A driver that cannot complete an effect throws :class:`WalkFailed` (the
server failed) or :class:`WalkCancelled` into the flow, which then returns
its outcome with what was committed so far. The engine drives one flow for a
recent load, a ``FillGap`` and a back-pagination; tests drive it with canned
pages.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass

from gapline.history._walk_state import PageResult
from gapline.matrix import ClientEvent, Direction, MessagesResponse, Request, api

__all__ = [
    "Commit",
    "Fetch",
    "WalkCancelled",
    "WalkEnd",
    "WalkFailed",
    "WalkFlow",
    "WalkOutcome",
    "backwards_walk",
]


@dataclass(frozen=True, slots=True)
class Fetch:
    request: Request


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit a page. ``last`` is set on the page that spends the budget, so the
    driver can settle the gap's lifecycle in the same transaction."""

    chunk: tuple[ClientEvent, ...]
    end: str | None
    last: bool = False
    prefetch: Request | None = None
    """The request the flow will make next unless this page ends the walk: a driver
    may send it while the page commits (the walk then costs about its fetches)."""


class WalkEnd(enum.Enum):
    Joined = "Joined"  # an event of a page was already retained: continuity proven
    Budget = "Budget"  # the page budget is spent
    CursorStalled = "CursorStalled"  # the server answered with a cursor it gave before
    StartReached = "StartReached"  # accessible history ended (no `end`, m.room.create)
    Failed = "Failed"  # the server (or the store) failed; `message` says how
    Cancelled = "Cancelled"


@dataclass(frozen=True, slots=True)
class WalkOutcome:
    end: WalkEnd
    pages: int
    events: int
    message: str | None = None


class WalkFailed(Exception):
    """Thrown into a flow when an effect failed; its text becomes the outcome's message."""


class WalkCancelled(Exception):
    """Thrown into a flow when its operation was cancelled."""


WalkFlow = Generator[Fetch | Commit, MessagesResponse | PageResult, WalkOutcome]


def backwards_walk(
    room_id: str,
    cursor: str | None,
    *,
    page_size: int,
    budget: int,
    thread_root: str | None = None,
) -> WalkFlow:
    """Walk back from ``cursor`` (``None``: the newest event) for up to ``budget`` pages.

    A room walks ``/messages``; a thread (``thread_root``) walks
    ``/relations/{root}/m.thread``, whose ``next_batch`` the driver hands back
    as the page's ``end``.
    """
    pages = events = 0
    seen: set[str] = set() if cursor is None else {cursor}

    def request(start: str | None) -> Request:
        if thread_root is not None:
            return api.relations(
                room_id,
                thread_root,
                rel_type="m.thread",
                dir=Direction.BACKWARD,
                from_=start,
                limit=page_size,
            )
        return api.messages(room_id, from_=start, dir=Direction.BACKWARD, limit=page_size)

    ahead: Request | None = None  # the request announced as the last Commit's prefetch
    try:
        while pages < budget:
            # The request announced as the last page's prefetch, built once: a driver
            # that sent it answers this Fetch with its response.
            page = yield Fetch(ahead if ahead is not None else request(cursor))
            assert isinstance(page, MessagesResponse)
            if page.end is not None and page.end in seen:
                return WalkOutcome(WalkEnd.CursorStalled, pages, events)
            last = pages + 1 == budget
            ahead = None if last or page.end is None else request(page.end)
            result = yield Commit(tuple(page.chunk), page.end, last=last, prefetch=ahead)
            assert isinstance(result, PageResult)
            pages += 1
            events += result.inserted
            if result.joined:
                return WalkOutcome(WalkEnd.Joined, pages, events)
            if result.start_reached:
                return WalkOutcome(WalkEnd.StartReached, pages, events)
            assert page.end is not None
            seen.add(page.end)
            cursor = page.end
        return WalkOutcome(WalkEnd.Budget, pages, events)
    except WalkFailed as exc:
        return WalkOutcome(WalkEnd.Failed, pages, events, str(exc) or type(exc).__name__)
    except WalkCancelled:
        return WalkOutcome(WalkEnd.Cancelled, pages, events)
