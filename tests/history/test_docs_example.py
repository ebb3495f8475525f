"""The runnable example of docs/history.md (the timeline additions) runs as is."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "history.md"


def test_the_documented_timeline_example_runs(capsys) -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Example (runs as is)", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    exec(compile(block.group(1), str(DOC), "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    assert '"edited":true' in out
    assert "['lunch at one?', \"I'll book\"]" in out
