"""Markdown a person typed, as the HTML ``formatted_body`` of a Matrix message.

The body keeps the markdown source as typed (what plain-text clients show);
:func:`formatted_body` gives the HTML for ``format: org.matrix.custom.html``
only when the markdown changes something, so ``hello`` stays a plain message
and ``**hello**`` carries ``<strong>hello</strong>``.

The HTML stays inside the tags the Matrix specification suggests clients
permit: raw HTML in the source is escaped as text (never passed through),
links keep only the schemes markdown-it allows (no ``javascript:``), and an
image becomes a link to it (a Matrix ``<img>`` must point at ``mxc://``
content, which a typed URL is not); a link's title is dropped (not an attribute
Matrix permits). Line breaks stay line breaks (``breaks``),
as chat users expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["HTML_FORMAT", "formatted_body"]

HTML_FORMAT = "org.matrix.custom.html"


def _image_as_link(renderer: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = "".join(t.content for t in token.children or ()) or src
    return f'<a href="{_escape(src)}">{_escape(alt)}</a>'


def _link_open(renderer: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    tokens[idx].attrs.pop("title", None)  # a Matrix link carries href (name, target) only
    return renderer.renderToken(tokens, idx, options, env)


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True})
    md.enable(["strikethrough", "table"])
    md.add_render_rule("image", _image_as_link)
    md.add_render_rule("link_open", _link_open)
    return md


_MD = _parser()


def _escape(text: str) -> str:
    """HTML-escape as markdown-it escapes text (``& < > "``)."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def _plain_html(text: str) -> str:
    """What markdown makes of text with no markup: escaped, lines joined by ``<br />``."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return "<br />\n".join(_escape(line) for line in lines)


def formatted_body(text: str) -> str | None:
    """The HTML of markdown ``text``, or ``None`` when it has no markup (send it plain)."""
    html = _MD.render(text).strip()
    inner = html
    if inner.startswith("<p>") and inner.endswith("</p>") and inner.count("<p>") == 1:
        inner = inner[3:-4]
    if inner == _plain_html(text):
        return None
    return html
