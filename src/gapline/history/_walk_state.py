"""What a backwards walk carries from one committed page to the next, and what a page did.

The walk (``_fill``, ``_drive``) holds a :class:`WalkState` between pages and
hands it to :meth:`~gapline.history._sections.Sections.walk_page` with the next
page; the page's :class:`PageResult` says what it proved, never what it guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from gapline.history._updates import GapRecord, Key

__all__ = ["PageResult", "WalkState"]


@dataclass(frozen=True, slots=True)
class WalkState:
    """Where a backwards walk stands between pages.

    ``anchor`` is the head of the section being extended (``None`` before a
    recent load met its first event); ``gap_id`` is the gap right below it.
    """

    anchor: Key | None = None
    gap_id: str | None = None
    gap: GapRecord | None = None  # as the previous page left it, valid while the store
    gap_writes: int = 0  # counts this many writes of the room's gaps (``gap_writes``)


@dataclass(frozen=True, slots=True)
class PageResult:
    """What one committed page did. Outcome flags, never guesses:

    - ``joined``: an event of the page was already retained below the walked
      gap (or the walk met retained history with nothing missing below it);
    - ``start_reached``: the server has nothing older (no ``end``, or the page
      held ``m.room.create``), so the gap is now ``Unavailable``.
    """

    state: WalkState
    inserted: int
    joined: bool
    start_reached: bool
    gap: GapRecord | None
