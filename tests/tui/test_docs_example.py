"""The runnable example of docs/tui.md runs as is."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "tui.md"


def test_the_documented_tui_example_runs() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Try it without a homeserver (runs as is)", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    lines: list[str] = []  # the app captures stdout while it runs: collect print's lines
    namespace = {"__name__": "docs_example", "print": lambda *a: lines.append(" ".join(a))}
    exec(compile(block.group(1), str(DOC), "exec"), namespace)
    assert lines[-2].endswith("Bob: lunch at noon? [👍 1]")
    assert lines[-1].endswith("Bob: noon works [↳ Bob: lunch at noon?]")
