"""The compose box: a text area that grows with its text, where Enter sends.

Enter posts :class:`ComposeBox.Submitted` with the text (the box keeps it: the
app clears it once the text was taken, so a refused command can be fixed);
Shift+Enter, Ctrl+J and Alt+Enter start a new line (terminals that cannot
tell Shift+Enter from Enter send Ctrl+J for it, or take Alt+Enter). The box
is one line high when empty and grows to :data:`MAX_LINES` before it scrolls.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

__all__ = ["MAX_LINES", "NEWLINE_KEYS", "ComposeBox"]

MAX_LINES = 6
NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j", "alt+enter", "ctrl+enter"})


class ComposeBox(TextArea):
    """A multi-line compose box (see the module's docstring)."""

    DEFAULT_CSS = f"""
    ComposeBox {{
        height: auto; min-height: 1; max-height: {MAX_LINES};
        border: none; padding: 0 1; background: $surface;
    }}
    ComposeBox:focus {{ border: none; background: $boost; }}
    """

    @dataclass
    class Submitted(Message):
        """Enter was pressed: ``text`` is what the box holds."""

        box: ComposeBox
        text: str

        @property
        def control(self) -> ComposeBox:
            return self.box

    def __init__(self, *, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(
            "",
            id=id,
            soft_wrap=True,
            tab_behavior="focus",
            compact=True,
            highlight_cursor_line=False,
            placeholder=placeholder,
        )

    @property
    def value(self) -> str:
        """The text (as an ``Input`` calls it)."""
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        await super()._on_key(event)
