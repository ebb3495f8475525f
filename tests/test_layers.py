"""Layer rules that import-linter cannot express.

import-linter (run by `make test`) holds the package-level contracts in
pyproject.toml. This test adds the httpx-style rule that a package's underscored
modules are private: only the package that owns them imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gapline"


def _imports(path: Path, importer: str) -> list[str]:
    """Every module name ``path`` imports, relative imports resolved against ``importer``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = importer.rpartition(".")[0]  # importer ends in its module (or `__init__`)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def _absolute(module: str | None, level: int, package: str) -> str:
    """``from ..x import y`` inside ``package`` -> the absolute name of ``..x``."""
    if level == 0:
        return module or ""
    parts = package.split(".")
    anchor = parts[: len(parts) - (level - 1)]
    return ".".join([*anchor, module] if module else anchor)


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
        for name in _imports(path, importer):
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
    # A relative import is resolved before the rule looks at it.
    assert _absolute("_wire", 2, "gapline.journal.sub") == "gapline.journal._wire"
    assert _absolute(None, 1, "gapline.history") == "gapline.history"
