"""The app's key bindings: one table, so the footer, the help panel and the config agree.

Every binding has an id (its action's name); the config file's ``[keys]``
table rebinds by id, and Textual's keymap applies it. The footer shows them
in this order, the ones a newcomer needs first, so a narrow terminal still
shows help, compose and quit.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType

__all__ = ["BINDINGS", "DEFAULT_KEYS", "HELP_ONLY", "KEY_IDS", "KEY_TABLE", "KeyHelp", "help_rows"]


def _key(keys: str, action: str, description: str, *, show: bool = True) -> Binding:
    name = action.split("(", 1)[0]
    return Binding(keys, action, description, show=show, id=name)


KEY_TABLE: tuple[Binding, ...] = (
    _key("question_mark", "help", "Help"),
    _key("i", "compose", "Write"),
    _key("q", "quit", "Quit"),
    _key("ctrl+n,alt+down", "next_room", "Next room"),
    _key("ctrl+p,alt+up", "previous_room", "Prev room"),
    _key("f", "fill", "Fill gap"),
    _key("slash,ctrl+f", "search", "Search"),
    _key("n", "search_next", "Next match", show=False),
    _key("N", "search_previous", "Prev match", show=False),
    _key("y", "copy", "Copy"),
    _key("o", "open_link", "Open link"),
    _key("a", "reply", "Reply"),
    _key("e", "edit", "Edit"),
    _key("d", "delete", "Delete"),
    _key("plus", "react", "React"),
    _key("t", "thread", "Thread"),
    _key("R", "retry_send", "Retry send"),
    _key("c", "cancel", "Cancel"),
    _key("r", "retry", "Retry recent"),
    _key("b,pageup", "scroll_back", "Back"),
    _key("l", "live", "Live end"),
    _key("x", "mark_read", "Mark read"),
    _key("m", "members", "Members"),
    _key("v", "devices", "Devices"),
    _key("V", "verify", "Verify a device"),
    _key("tab", "focus_next", "Switch pane"),
)
"""The app's bindings, each with its id."""

BINDINGS: list[BindingType] = list(KEY_TABLE)

DEFAULT_KEYS: dict[str, str] = {b.id: b.key for b in KEY_TABLE if b.id is not None}
"""Binding id -> its keys when the config file does not rebind it."""

KEY_IDS: frozenset[str] = frozenset(DEFAULT_KEYS)
"""The ids the config file's ``[keys]`` table may rebind."""


@dataclass(frozen=True, slots=True)
class KeyHelp:
    """One line of the help panel: the keys (as typed), what they do."""

    keys: str
    description: str


HELP_ONLY: tuple[KeyHelp, ...] = (
    KeyHelp("up/k down/j", "select the previous / next row"),
    KeyHelp("home end", "select the oldest / newest row"),
    KeyHelp("enter", "in the room list: open the room (an invite: accept it)"),
    KeyHelp("esc", "close a panel, leave a reply or edit, leave the compose box or a thread"),
)
"""Keys that are not app bindings (the timeline's own, the compose box's, Esc)."""


def _shown(keys: str) -> str:
    names = {"question_mark": "?", "slash": "/", "plus": "+", "pageup": "pgup"}
    return " ".join(names.get(k.strip(), k.strip()) for k in keys.split(","))


def help_rows(keymap: dict[str, str]) -> tuple[KeyHelp, ...]:
    """Every binding as the help panel lists it, with the keys ``keymap`` rebinds."""
    rows = [KeyHelp(_shown(keymap.get(b.id or "", b.key)), b.description) for b in KEY_TABLE]
    return (*rows, *HELP_ONLY)
