"""What a row says: pure functions from timeline items (and fill progress) to text.

Kept apart from the widgets so the headless demo prints the same words the
TUI shows, and so the wording is tested without a terminal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
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
    ReplyStatus,
    SendStateKind,
    TimelineItem,
)
from gapline.tui._encryption import utd_words

__all__ = [
    "SENDER_COLOURS",
    "FillProgress",
    "event_body",
    "event_time",
    "gap_label",
    "item_line",
    "queue_label",
    "reactions_line",
    "recent_label",
    "reply_line",
    "send_line",
    "sender_colour",
    "sender_label",
    "thread_line",
    "typing_label",
]

SENDER_COLOURS = (
    "#2e86de",
    "#c0392b",
    "#16a085",
    "#8e44ad",
    "#d35400",
    "#27ae60",
    "#b7950b",
    "#c2185b",
)
"""Sender colours: mid tones that read on dark and on light backgrounds alike."""


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


def sender_label(sender: str, name: str | None = None) -> str:
    """The sender's display name when the room gave one, else ``@alice:example.org``
    reads as ``alice``; anything else as itself."""
    if name:
        return name
    if sender.startswith("@") and ":" in sender:
        return sender[1 : sender.index(":")]
    return sender


def sender_colour(sender: str) -> str:
    """A colour per user that stays the same across rows, rooms and runs."""
    digest = hashlib.sha256(sender.encode()).digest()
    return SENDER_COLOURS[digest[0] % len(SENDER_COLOURS)]


def reply_line(item: EventItem) -> str | None:
    """What a reply quotes, in one line (``None`` for a row that is no reply)."""
    quote = item.in_reply_to
    if quote is None:
        return None
    match quote.status:
        case ReplyStatus.Pending:
            return "↳ in reply to a message not loaded yet"
        case ReplyStatus.Unavailable:
            return "↳ in reply to a message that is not available"
    who = sender_label(quote.sender or "", quote.sender_name)
    if quote.redacted:
        return f"↳ {who}: message deleted"
    return f"↳ {who}: {quote.body}" if quote.body else f"↳ {who}"


def reactions_line(item: EventItem, me: str | None = None) -> str | None:
    """Reaction chips (``👍 2  ❤️ 1``); one this account sent is bracketed."""
    if not item.reactions:
        return None
    chips = []
    for reaction in item.reactions:
        chip = f"{reaction.key} {len(reaction.senders)}"
        chips.append(f"[{chip}]" if me is not None and me in reaction.senders else chip)
    return "  ".join(chips)


def thread_line(item: EventItem) -> str | None:
    """A thread root's summary (``None`` for a row that roots no thread)."""
    summary = item.thread_summary
    if summary is None:
        return None
    replies = "1 reply" if summary.count == 1 else f"{summary.count} replies"
    text = f"🧵 {replies}"
    latest = summary.latest
    if latest is not None:
        who = sender_label(latest.sender, latest.sender_name)
        said = "message deleted" if latest.redacted else (latest.body or "…")
        text += f" · {who}: {said}"
    if summary.participated:
        text += " · you took part"
    return text + " · t to open"


def send_line(item: EventItem) -> str | None:
    """Where a message of this account that the server has not ordered yet stands
    (``None`` for an event the server has)."""
    state = item.send_state
    if state is None:
        return None
    if state.kind is SendStateKind.Failed:
        return f"✗ not sent: {state.message} · R to retry · d to discard"
    return "… sending"


def queue_label(pending: int, failed: int) -> str | None:
    """The status line's words for the send queue (``None`` when it is empty)."""
    parts = []
    if pending:
        parts.append(f"{_plural(pending, 'message')} queued")
    if failed:
        parts.append(f"{failed} not sent")
    return " · ".join(parts) or None


def typing_label(users: Sequence[str], names: dict[str, str | None] | None = None) -> str:
    """Who is typing, in words (empty when nobody is)."""
    names = names or {}
    who = [sender_label(u, names.get(u)) for u in users]
    if not who:
        return ""
    if len(who) == 1:
        return f"{who[0]} is typing…"
    if len(who) <= 3:
        return f"{', '.join(who[:-1])} and {who[-1]} are typing…"
    return f"{len(who)} people are typing…"


def event_time(item: EventItem, tz: tzinfo | None = None) -> str:
    return datetime.fromtimestamp(item.origin_server_ts / 1000, tz).strftime("%H:%M")


def event_body(item: EventItem) -> tuple[str, bool]:
    """The body text and whether it is a placeholder (shown dimmed): deleted messages,
    events without a text, and state events (whose body says what changed)."""
    if item.redacted:
        return "message deleted", True
    if item.decryption is not None:
        return utd_words(item.decryption), True
    if item.body is None:
        return _describe_type(item.event_type), True
    if item.event_type not in ("m.room.message", "m.sticker"):
        return item.body, True
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
            who = sender_label(item.sender, item.sender_name)
            line = f"{event_time(item, tz)} {who}: {body}{edited}"
            extras = [
                x
                for x in (
                    reply_line(item),
                    reactions_line(item),
                    thread_line(item),
                    send_line(item),
                )
                if x
            ]
            return " ".join([line, *(f"[{x}]" for x in extras)])
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
