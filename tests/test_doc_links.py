"""The documentation stands on its own.

Every relative link in README.md and docs/ names a file of the repository (and,
with a ``#fragment``, a heading of that file, slugged as GitHub renders it), and
no page points at material that lives outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_OUTSIDE = re.compile(r"DESIGN|seeds/|notes/|\.\./shared")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, with their 1-based numbers."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """Each relative link of ``text`` (the content of ``page``) that does not resolve."""
    broken = []
    for number, line in _prose_lines(text):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, fragment = target.partition("#")
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{where} (no such file in the repository)")
                continue
            if fragment and dest.suffix == ".md":
                dest_text = text if dest == page else dest.read_text(encoding="utf-8")
                if fragment not in anchors(dest_text):
                    broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        broken.extend(broken_links(page, page.read_text(encoding="utf-8")))
    assert broken == []


def test_no_page_names_material_outside_the_repository() -> None:
    offences = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if _OUTSIDE.search(line):
                offences.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offences == []


def test_the_checks_see_an_offence() -> None:
    # Guards the tests above against silently matching nothing.
    page = ROOT / "docs" / "benchmarks.md"
    text = (
        "# Title (`bench/x.py`)\n\n## Same\n\n## Same\n\n"
        "[ok](#title-benchxpy) [ok](#same-1) [ok](storage.md) [ok](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](#nowhere) [bad anchor](storage.md#nowhere)\n"
        "![image](../docs/img/none.svg) `[in code](missing.md)`\n"
        "```\n[in a fence](missing.md)\n```\n"
    )
    assert [entry.split(": ", 1)[1] for entry in broken_links(page, text)] == [
        "missing.md (no such file in the repository)",
        "#nowhere (no such heading)",
        "storage.md#nowhere (no such heading)",
        "../docs/img/none.svg (no such file in the repository)",
    ]
    assert slug("Event journal (`bench/journal.py`, anchor `bench/journal_anchor.py`)") == (
        "event-journal-benchjournalpy-anchor-benchjournal_anchorpy"
    )
    assert _OUTSIDE.search("Contract: seeds/segmented-history.md")
    assert _OUTSIDE.search("see ../shared/meshline")
