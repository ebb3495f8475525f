"""The runnable example of docs/meshline.md runs as is."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "meshline.md"


def test_the_documented_example_runs() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Example (runs as is)", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    code = block.group(1)
    assert "accept_route_publication" in code and "authorize_delivery" in code
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
