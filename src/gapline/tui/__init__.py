"""gapline.tui: the terminal client (`gapline tui`) and the demo (`gapline demo`).

The app (:class:`GaplineApp`) talks to the history engine only through
``gapline.history``'s public API: it is handed a ``connect`` that opens an
engine publishing into the app's sink. See docs/tui.md.
"""

from gapline.tui._app import Connect, EngineHandle, GaplineApp
from gapline.tui._text import FillProgress, gap_label, item_line, recent_label
from gapline.tui._timeline import TimelineView

__all__ = [
    "Connect",
    "EngineHandle",
    "FillProgress",
    "GaplineApp",
    "TimelineView",
    "gap_label",
    "item_line",
    "recent_label",
]
