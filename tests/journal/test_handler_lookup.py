"""`--handler module:function` is found from the current directory, as a script's own
directory is for ``python script.py``, without ``PYTHONPATH``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LOOKUP = (
    "import sys; from gapline.journal import resolve_handler; "
    "handler = resolve_handler(sys.argv[1]); print(handler.__module__, handler.__name__); "
    "import json; print(json.__file__)"
)


def run(cwd: Path, name: str) -> subprocess.CompletedProcess[str]:
    # -I: neither the current directory nor PYTHONPATH is on the path, as for the
    # `gapline` console script.
    return subprocess.run(
        [sys.executable, "-I", "-c", LOOKUP, name],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_module_in_the_current_directory_is_found(tmp_path: Path) -> None:
    (tmp_path / "myhandlers.py").write_text(
        "async def summarise(conversation, message):\n    yield\n"
    )
    done = run(tmp_path, "myhandlers:summarise")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "myhandlers summarise"


def test_a_file_in_the_current_directory_never_shadows_an_installed_module(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('the wrong json')\n")
    (tmp_path / "myhandlers.py").write_text("def summarise(conversation, message): ...\n")
    done = run(tmp_path, "myhandlers:summarise")
    assert done.returncode == 0, done.stderr
    assert not done.stdout.splitlines()[1].startswith(str(tmp_path))


def test_a_module_nowhere_is_a_handler_error(tmp_path: Path) -> None:
    done = run(tmp_path, "nowhere:summarise")
    assert (
        done.returncode == 1
        and "HandlerError: cannot import handler module 'nowhere'" in done.stderr
    )
