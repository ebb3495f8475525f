"""What a row says: pure functions from timeline items (and fill progress) to text.

Kept apart from the widgets so the headless demo prints the same words the
TUI shows, and so the wording is tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, tzinfo

from gapline.history import (
    EventItem,
    GapLifecycle,
    HistoryGapItem,
    HistoryRepairReport,
    ReadMarkerItem,
    RecentHistoryKind,
    RecentHistoryState,
    RepairPhase,
    RepairStop,
    TimelineItem,
)

__all__ = [
    "FillProgress",
    "event_body",
    "event_time",
    "gap_label",
    "item_line",
    "recent_label",
    "sender_label",
]


@dataclass(frozen=True, slots=True)
class FillProgress:
    """A running fill as the TUI sees it: pages and events landed so far."""

    pages: int = 0
    events: int = 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def gap_label(
    gap: HistoryGapItem,
    *,
    progress: FillProgress | None = None,
    report: HistoryRepairReport | None = None,
) -> str:
    """The words of a gap row (without the rule drawn around them).

    ``progress`` is set while a fill of this gap runs; ``report`` is the last
    settled report of this gap, which says *why* a paused gap paused (the
    row's lifecycle alone does not).
    """
    if progress is not None:
        return (
            f"filling… {_plural(progress.pages, 'page')}, {_plural(progress.events, 'event')}"
            " · c to cancel"
        )
    match gap.lifecycle:
        case GapLifecycle.Idle:
            return "gap in history · f to fill"
        case GapLifecycle.Unavailable:
            return "start of accessible history"
        case GapLifecycle.Failed:
            return f"failed: {gap.failure} · f to retry"
        case GapLifecycle.Paused:
            stop = report.stop if report is not None and report.gap_id == gap.id else None
            match stop:
                case RepairStop.Budget:
                    assert report is not None
                    return (
                        f"paused: page budget reached ({_plural(report.pages, 'page')})"
                        " · f to continue"
                    )
                case RepairStop.CursorStalled:
                    return "paused: server repeated its cursor · f to retry"
                case RepairStop.Cancelled:
                    return "paused: cancelled · f to continue"
                case RepairStop.HistoryUnavailable:
                    return "paused: history unavailable · f to retry"
                case _:
                    return "paused · f to continue"
    return "gap in history"


def sender_label(sender: str) -> str:
    """``@alice:example.org`` reads as ``alice``; anything else as itself."""
    if sender.startswith("@") and ":" in sender:
        return sender[1 : sender.index(":")]
    return sender


def event_time(item: EventItem, tz: tzinfo | None = None) -> str:
    return datetime.fromtimestamp(item.origin_server_ts / 1000, tz).strftime("%H:%M")


def event_body(item: EventItem) -> tuple[str, bool]:
    """The body text and whether it is a placeholder (shown dimmed)."""
    if item.redacted:
        return "message deleted", True
    if item.body is None:
        return _describe_type(item.event_type), True
    return item.body, False


def _describe_type(event_type: str) -> str:
    return {
        "m.room.member": "membership changed",
        "m.room.name": "room renamed",
        "m.room.topic": "topic changed",
        "m.room.create": "room created",
        "m.room.encrypted": "encrypted message",
    }.get(event_type, event_type)


def item_line(
    item: TimelineItem,
    *,
    tz: tzinfo | None = None,
    progress: FillProgress | None = None,
    report: HistoryRepairReport | None = None,
) -> str:
    """One plain-text line for an item (the headless demo's timeline dump)."""
    match item:
        case EventItem():
            body, _ = event_body(item)
            edited = " (edited)" if item.edited and not item.redacted else ""
            return f"{event_time(item, tz)} {sender_label(item.sender)}: {body}{edited}"
        case HistoryGapItem():
            return f"── {gap_label(item, progress=progress, report=report)} ──"
        case ReadMarkerItem():
            return "── read up to here ──"
    return repr(item)


def recent_label(state: RecentHistoryState, *, report: HistoryRepairReport | None = None) -> str:
    """The status line's words for a room's recent-history state."""
    match state.kind:
        case RecentHistoryKind.Loading:
            text = "recent: loading…"
        case RecentHistoryKind.Loaded:
            text = "recent: loaded"
        case RecentHistoryKind.Cancelled:
            text = "recent: cancelled · r to retry"
        case RecentHistoryKind.Failed:
            text = f"recent: failed: {state.message} · r to retry"
        case _:
            text = "opening…"
    if report is not None and report.phase is not RepairPhase.Bridging:
        text += " · last fill: " + _report_words(report)
    return text


def _report_words(report: HistoryRepairReport) -> str:
    counts = f"{_plural(report.pages, 'page')}, {_plural(report.events, 'event')}"
    if report.phase is RepairPhase.Ready:
        return f"filled, verified ({counts})"
    if report.failure is not None:
        return f"failed after {counts}"
    if report.stop is RepairStop.HistoryUnavailable:
        return f"reached the start of accessible history ({counts})"
    stop = report.stop.value if report.stop is not None else "paused"
    return f"paused: {stop} ({counts})"
