"""What leaves the app from a row: its text copied, a link in it opened.

Copying goes through the terminal (OSC 52, Textual's ``copy_to_clipboard``),
so it works over ssh too. A link opens with :mod:`webbrowser` in a thread
worker: a browser that takes its time never stalls the screen.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gapline.history import EventItem

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["RowLinks", "links_in"]

_URL = re.compile(r"""https?://[^\s<>"'`]+""")
_TRAILING = ".,;:!?)]}"


def links_in(text: str) -> list[str]:
    """The http(s) links in ``text``, in order, without trailing punctuation."""
    found = []
    for match in _URL.finditer(text):
        url = match.group(0)
        while url and url[-1] in _TRAILING and not (url[-1] == ")" and "(" in url):
            url = url[:-1]
        found.append(url)
    return found


class RowLinks:
    """Copy and open-link of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    def action_copy(self: GaplineApp) -> None:
        """Copy the selected message's text to the clipboard."""
        item = self.timeline.selected
        if not isinstance(item, EventItem) or not item.body or item.redacted:
            self.notice("select a message with text to copy")
            return
        self.copy_to_clipboard(item.body)
        lines = item.body.count("\n") + 1
        self.notice(
            f"copied {len(item.body)} characters" + (f", {lines} lines" if lines > 1 else "")
        )

    def action_open_link(self: GaplineApp) -> None:
        """Open the first link of the selected message in the browser."""
        item = self.timeline.selected
        links = links_in(item.body or "") if isinstance(item, EventItem) else []
        if not links:
            self.notice("no link in the selected message")
            return
        url = links[0]
        more = f" (the first of {len(links)})" if len(links) > 1 else ""
        self.notice(f"opening {url}{more}")
        self.run_worker(lambda: self._open_in_browser(url), thread=True, group="links")

    def _open_in_browser(self: GaplineApp, url: str) -> None:
        try:
            opened = self.url_opener(url)
        except Exception as exc:  # noqa: BLE001 - a notice: the browser is not ours
            self.call_from_thread(self.notice, f"could not open {url}: {exc}", severity="error")
            return
        if not opened:
            self.call_from_thread(self.notice, f"no browser could open {url}", severity="warning")
