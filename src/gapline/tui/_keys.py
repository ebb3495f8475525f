"""The app's key bindings: one table, so the footer, the help and the tests agree."""

from __future__ import annotations

from textual.binding import Binding, BindingType

__all__ = ["BINDINGS"]

BINDINGS: list[BindingType] = [
    Binding("f", "fill", "Fill gap"),
    Binding("c", "cancel", "Cancel"),
    Binding("r", "retry", "Retry recent"),
    Binding("b,pageup", "scroll_back", "Back"),
    Binding("tab", "focus_next", "Switch pane"),
    Binding("i", "compose", "Write", show=False),
    Binding("a", "reply", "Reply", show=False),
    Binding("e", "edit", "Edit", show=False),
    Binding("d", "delete", "Delete", show=False),
    Binding("R", "retry_send", "Retry send", show=False),
    Binding("plus", "react", "React", show=False),
    Binding("t", "thread", "Thread", show=False),
    Binding("m", "members", "Members", show=False),
    Binding("v", "devices", "Devices", show=False),
    Binding("x", "mark_read", "Mark read", show=False),
    Binding("l", "live", "Live end", show=False),
    Binding("q", "quit", "Quit"),
]
