"""A message's HTML ``formatted_body`` as terminal text, safely.

Whatever a sender put in the HTML stays text on the screen: the tags this
renderer knows become styles (bold, italic, underline, strike, code, links),
blocks (paragraphs, headings, lists, block quotes, preformatted code, tables)
become lines, a rich reply's quoted fallback (``<mx-reply>``) is dropped (the
row shows the quote itself), ``<script>``/``<style>`` lose their content, and
every other tag is dropped with its text kept. Nothing reaches the terminal
as a control sequence: C0/C1 control characters (an ``ESC`` typed or written
as ``&#27;``) and the bidirectional overrides that reorder what is shown are
replaced by a visible ``\N{REPLACEMENT CHARACTER}``; colours and attributes are the
renderer's own, never the sender's. A link's address is shown beside its text
when the two differ, so a link cannot pretend to go somewhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

from rich.style import Style
from rich.text import Text

from gapline.history import EventItem

__all__ = ["CODE_STYLE", "body_text", "clean", "html_text"]

CODE_STYLE = "bold"
QUOTE_BAR = "▌ "
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SPACES = re.compile(r"[ \t\n\r\f]+")
_STYLES = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "s": "strike",
    "del": "strike",
    "strike": "strike",
    "code": CODE_STYLE,
    "summary": "bold",
    "th": "bold",
    "h1": "bold underline",
    "h2": "bold",
    "h3": "bold",
    "h4": "bold",
    "h5": "bold",
    "h6": "bold",
}
_BLOCKS = {
    "p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "pre", "blockquote",
    "table", "tr", "hr", "details", "summary", "caption",
}  # fmt: skip
_DROPPED = {"mx-reply", "script", "style", "head", "title", "template"}
_VOID = {"br", "hr", "img", "input", "meta", "link", "wbr", "area", "source"}
_SAFE_SCHEMES = ("https://", "http://", "mailto:", "matrix:")


def clean(text: str) -> str:
    """``text`` with nothing a terminal would act on: control characters (but newline and
    tab) and bidirectional overrides become U+FFFD, a tab four spaces."""
    return _CONTROLS.sub("\N{REPLACEMENT CHARACTER}", text).replace("\t", "    ")


@dataclass
class _List:
    ordered: bool
    next: int = 1


class _Renderer(HTMLParser):
    """Turns parser callbacks into styled lines; ``out`` is the result."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out = Text()
        self.styles: list[tuple[str, str]] = []
        self.lists: list[_List] = []
        self.quotes = 0
        self.pre = 0
        self.dropping: list[str] = []
        self.links: list[str | None] = []
        self.link_text: list[str] = []
        self.cells = 0
        self.at_line_start = True
        self.pending_space = False

    # -- output -------------------------------------------------------------------------

    def _style(self) -> Style:
        style = Style()
        for _, part in self.styles:
            style += Style.parse(part)
        return style

    def _prefix(self) -> str:
        indent = "  " * max(0, len(self.lists) - 1)
        return QUOTE_BAR * self.quotes + indent

    def _emit(self, text: str, style: Style | str | None = None) -> None:
        if not text:
            return
        if self.at_line_start:
            self.out.append(self._prefix(), style="dim")
            self.at_line_start = False
        elif self.pending_space:
            self.out.append(" ")
        self.pending_space = False
        self.out.append(text, style=self._style() if style is None else style)
        if self.link_text:
            self.link_text[-1] += text

    def _newline(self) -> None:
        """End the line (once: blocks never stack empty lines)."""
        if len(self.out) and not self.at_line_start:
            self.out.append("\n")
        self.at_line_start, self.pending_space = True, False

    # -- parser callbacks ---------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.dropping:
            if tag not in _VOID:
                self.dropping.append(tag)
            return
        if tag in _DROPPED:
            self.dropping.append(tag)
            return
        values = {k: v or "" for k, v in attrs}
        if tag in _BLOCKS:
            self._newline()
        match tag:
            case "br":
                self.at_line_start = False  # a <br> on an empty line still breaks it
                self._newline()
            case "hr":
                self._emit("─" * 20, "dim")
                self._newline()
            case "img":
                alt = clean(values.get("alt") or values.get("title") or "")
                self._emit(f"[image: {alt}]" if alt else "[image]", "dim")
            case "ul" | "ol":
                start = values.get("start", "1")
                self.lists.append(_List(tag == "ol", int(start) if start.isdigit() else 1))
            case "li":
                current = self.lists[-1] if self.lists else _List(False)
                bullet = f"{current.next}. " if current.ordered else "• "
                current.next += 1
                self._emit(bullet, "dim")
                self.pending_space = False
            case "blockquote":
                self.quotes += 1
            case "pre":
                self.pre += 1
            case "a":
                href = clean(values.get("href", "").strip())
                self.links.append(href if href.lower().startswith(_SAFE_SCHEMES) else None)
                self.link_text.append("")
                self.styles.append((tag, "underline"))
            case "td" | "th":
                if self.cells:
                    self._emit(" │ ", "dim")
                    self.pending_space = False
                self.cells += 1
            case "tr":
                self.cells = 0
        if tag in _STYLES:
            self.styles.append((tag, _STYLES[tag]))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if self.dropping:
            if tag in self.dropping:
                while self.dropping and self.dropping.pop() != tag:
                    pass
            return
        if tag in _STYLES or tag == "a":
            for i in range(len(self.styles) - 1, -1, -1):
                if self.styles[i][0] == tag:
                    del self.styles[i]
                    break
        match tag:
            case "a" if self.links:
                href, text = self.links.pop(), self.link_text.pop()
                if href and text.strip() != href and text.strip() != href.removeprefix("mailto:"):
                    self._emit(f" <{href}>", "dim")
            case "ul" | "ol" if self.lists:
                self.lists.pop()
            case "blockquote" if self.quotes:
                self._newline()
                self.quotes -= 1
            case "pre" if self.pre:
                self.pre -= 1
        if tag in _BLOCKS:
            self._newline()

    def handle_data(self, data: str) -> None:
        if self.dropping:
            return
        data = clean(data)
        if self.pre:
            lines = data.split("\n")
            for i, line in enumerate(lines):
                if i:
                    self.at_line_start = False
                    self._newline()
                self._emit(line)
            return
        if not data:
            return
        lead, trail = data[0].isspace(), data[-1].isspace()
        words = _SPACES.sub(" ", data).strip()
        if lead and not self.at_line_start:
            self.pending_space = True
        if words:
            self._emit(words)
            self.pending_space = trail


def html_text(html: str) -> Text:
    """The terminal text of a Matrix HTML body (see the module's docstring)."""
    renderer = _Renderer()
    renderer.feed(html)
    renderer.close()
    renderer.out.rstrip()
    return renderer.out


def body_text(item: EventItem, sender: str) -> Text:
    """A message row's body: its HTML rendered when it has some, else its plain body,
    both cleaned; an emote reads ``* sender does``, a notice is dimmed."""
    html = item.formatted_body
    text = html_text(html) if html is not None else Text(clean(item.body or ""))
    if not text.plain.strip() and item.body:
        text = Text(clean(item.body))  # HTML that shows nothing: the plain body says it
    if item.msgtype == "m.emote":
        text = Text.assemble(("* ", "italic"), (clean(sender), "italic"), " ", text)
    elif item.msgtype == "m.notice":
        text = Text.assemble(("notice: ", "dim italic"), text)
        text.stylize("dim")
    return text
