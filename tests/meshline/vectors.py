"""Loading the published Meshline vectors.

``data/`` holds byte-exact copies of the test vectors the Meshline protocol publishes
(``v1/test-vectors`` of the protocol repository, at the commit manifest.json names);
``load`` checks each against manifest.json's SHA-256 so a copy can never drift silently.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

VECTOR_DIR = Path(__file__).resolve().parent / "data"


@cache
def load(name: str) -> Any:
    """A vector file, after checking its SHA-256 against manifest.json."""
    raw = (VECTOR_DIR / name).read_bytes()
    manifest = json.loads((VECTOR_DIR / "manifest.json").read_text())
    assert hashlib.sha256(raw).hexdigest() == manifest["files"][name], (
        f"{name} differs from manifest"
    )
    return json.loads(raw)


def pointer(doc: Any, ref: str) -> Any:
    """Resolve a same-file JSON Pointer (RFC 6901)."""
    node = doc
    for part in ref.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node
