"""Layer rules that import-linter cannot express.

import-linter (run by `make test`) holds the package-level contracts of
DESIGN.md. This test adds the httpx-style rule that a package's underscored
modules are private: only the package that owns them imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gapline"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _owner(module: str) -> str | None:
    """The package owning a private module: gapline.history._wire -> gapline.history."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__") and i >= 2:
            return ".".join(parts[:i])
    return None


def test_no_package_reaches_into_another_packages_private_modules() -> None:
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        importer = ".".join(rel.parts)
        for name in _imports(path):
            if not name.startswith("gapline."):
                continue
            owner = _owner(name)
            if owner is not None and not (importer == owner or importer.startswith(owner + ".")):
                offences.append(f"{importer} imports {name}")
    assert offences == []


def test_the_rule_sees_an_offence() -> None:
    # Guards the test above against silently matching nothing.
    assert _owner("gapline.history._wire") == "gapline.history"
    assert _owner("gapline.history.Engine") is None
    assert _owner("gapline.storage._sqlite.SQLiteBackend") == "gapline.storage"
