"""The recovery key's flags: ``--recovery-key-file`` (its first line) everywhere, and on the
tui ``--recover``, which asks on the terminal (and needs one)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from gapline.clikit import CommandError, CommandParser, Exit, _secrets, add_recovery_flags
from gapline.clikit import recovery_key as given_key
from tests.terminal import TerminalChild

UNREACHABLE = "http://127.0.0.1:9"


def parse(*argv: str, prompt: bool = True) -> argparse.Namespace:
    parser = CommandParser(prog="gapline test")
    add_recovery_flags(parser, prompt=prompt)
    return parser.parse_args(argv)


def test_the_file_gives_its_first_line_and_no_flag_asks_nothing(tmp_path: Path) -> None:
    path = tmp_path / "key.txt"
    path.write_text("EsTc LW2K PGiF wKEA\nsecond line\n")
    assert given_key(parse("--recovery-key-file", str(path))) == "EsTc LW2K PGiF wKEA"
    assert given_key(parse()) is None


@pytest.mark.parametrize("content", [None, ""])
def test_a_missing_or_empty_file_is_a_usage_error(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "key.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CommandError) as failed:
        given_key(parse("--recovery-key-file", str(path)))
    assert failed.value.status == Exit.USAGE and "--recovery-key-file" in failed.value.message


def test_recover_without_a_terminal_says_to_use_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_secrets, "_TTY", str(tmp_path / "no-tty"))
    with pytest.raises(CommandError) as failed:
        given_key(parse("--recover"))
    assert failed.value.status == Exit.NO_TERMINAL
    assert "--recovery-key-file" in failed.value.message


def test_the_file_and_the_prompt_together_are_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--recover", "--recovery-key-file", str(tmp_path / "k"))
    assert exited.value.code == Exit.USAGE


def test_the_tui_asks_for_the_recovery_key_on_the_terminal(tmp_path: Path) -> None:
    child = TerminalChild(
        [sys.executable, "-m", "gapline.cli", "tui", "--homeserver", UNREACHABLE,
         "--user", "@alice:example.org", "--store", str(tmp_path / "store"), "--recover"],
        env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip
    try:
        child.wait_for("password for @alice:example.org: ")
        child.type(b"typed password\r")
        child.wait_for("passphrase of the store in")
        child.type(b"typed passphrase\r")
        child.wait_for("recovery key: ")
        child.type(b"typed key\r")
        code = child.wait()
    finally:
        child.close()
    text = child.text()
    assert "typed" not in text  # no echo
    assert code == Exit.FAILED  # every answer taken: the login is what failed
    assert f"cannot reach the homeserver at {UNREACHABLE}" in text
