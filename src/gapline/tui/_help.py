"""The help panel (``?``): every key the app has, as the config file bound them.

A modal screen over the app; Esc (or ``?``, or ``q``) closes it, like every panel.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gapline.tui._keys import KeyHelp

__all__ = ["HelpScreen", "help_table"]


def help_table(rows: Sequence[KeyHelp]) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for row in rows:
        table.add_row(row.keys, row.description)
    return table


class HelpScreen(ModalScreen[None]):
    """Every binding, one a line; any of Esc, ``?`` or ``q`` closes it."""

    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close help"),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen #help-box {
        width: 76; max-width: 100%; height: 90%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; }
    """

    def __init__(self, rows: Sequence[KeyHelp]) -> None:
        super().__init__()
        self.rows = tuple(rows)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static("keys · ↑↓ scroll · esc closes", id="help-title")
            yield Static(help_table(self.rows), id="help-keys")

    def action_close(self) -> None:
        self.dismiss(None)
