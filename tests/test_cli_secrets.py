"""Secrets come from a file, the environment or a prompt on the terminal; the command
line is accepted with a warning. The prompt is a real terminal's (a pseudo-terminal
the command owns): typing answers it, Ctrl-C or Ctrl-D at it is one line and 130."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gapline.clikit import (
    PASSPHRASE,
    PASSWORD,
    CommandError,
    CommandParser,
    Exit,
    _secrets,
    add_secret_flags,
    resolve_secret,
)
from tests.terminal import TerminalChild

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, a refusal at once


def parse(*argv: str) -> argparse.Namespace:
    parser = CommandParser(prog="gapline test")
    add_secret_flags(parser, PASSWORD)
    add_secret_flags(parser, PASSPHRASE)
    parser.set_defaults(prog=parser.prog)
    return parser.parse_args(argv)


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As in a service or CI: no controlling terminal to open."""
    monkeypatch.setattr(_secrets, "_TTY", str(tmp_path / "no-tty"))


@pytest.fixture(autouse=True)
def no_secrets_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GAPLINE_PASSWORD", raising=False)
    monkeypatch.delenv("GAPLINE_PASSPHRASE", raising=False)


def test_the_file_gives_its_first_line(tmp_path: Path, no_terminal: None) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\nignored\n")
    assert resolve_secret(parse("--password-file", str(secret)), PASSWORD, prompt="") == "s3cret"


def test_the_file_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_terminal: None
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file")
    monkeypatch.setenv("GAPLINE_PASSWORD", "from-env")
    assert resolve_secret(parse("--password-file", str(secret)), PASSWORD, prompt="") == "from-file"
    assert resolve_secret(parse(), PASSWORD, prompt="") == "from-env"


def test_the_command_line_is_accepted_with_a_warning(
    capsys: pytest.CaptureFixture[str], no_terminal: None
) -> None:
    assert resolve_secret(parse("--passphrase", "pp"), PASSPHRASE, prompt="") == "pp"
    err = capsys.readouterr().err
    assert err.startswith("gapline test: warning: --passphrase on the command line")
    assert "other local users" in err and "--passphrase-file" in err
    warnings: list[str] = []
    assert resolve_secret(parse("--password", "pw"), PASSWORD, prompt="", warn=warnings.append)
    assert len(warnings) == 1 and "$GAPLINE_PASSWORD" in warnings[0]


def test_a_file_and_the_flag_together_are_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        parse("--password-file", str(tmp_path / "pw"), "--password", "pw")
    assert done.value.code == Exit.USAGE


@pytest.mark.parametrize("content", [None, "", "\nsecond line"])
def test_a_missing_or_empty_file_is_a_usage_error(
    tmp_path: Path, content: str | None, no_terminal: None
) -> None:
    secret = tmp_path / "pw"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(CommandError) as failed:
        resolve_secret(parse("--password-file", str(secret)), PASSWORD, prompt="")
    assert failed.value.status is Exit.USAGE
    assert str(secret) in failed.value.message


def test_without_any_source_and_no_terminal(no_terminal: None) -> None:
    with pytest.raises(CommandError) as failed:
        resolve_secret(parse(), PASSWORD, prompt="password: ")
    assert failed.value.status is Exit.NO_TERMINAL
    assert "--password-file" in failed.value.message and "$GAPLINE_PASSWORD" in failed.value.message
    assert resolve_secret(parse(), PASSPHRASE, prompt="", required=False) is None


def test_the_bridge_never_reads_a_secret_from_stdin(tmp_path: Path) -> None:
    """No terminal (a new session): the protocol's stdin is not asked for the password."""
    done = subprocess.run(
        [sys.executable, "-m", "gapline.cli", "bridge", "--homeserver", UNREACHABLE,
         "--user", "@a:example.org", "--store", str(tmp_path / "store")],
        input='"Shutdown"\n', capture_output=True, text=True, timeout=60,
        start_new_session=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == Exit.NO_TERMINAL
    assert done.stderr.strip().splitlines() == [
        "gapline bridge: no password: give --password-file FILE or set $GAPLINE_PASSWORD "
        "(there is no terminal to ask on)"
    ]


def tui_on_a_terminal(tmp_path: Path) -> TerminalChild:
    return TerminalChild(
        [sys.executable, "-m", "gapline.cli", "tui", "--homeserver", UNREACHABLE,
         "--user", "@alice:example.org", "--store", str(tmp_path / "store")],
        env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip


def test_the_prompts_read_the_terminal(tmp_path: Path) -> None:
    child = tui_on_a_terminal(tmp_path)
    try:
        child.wait_for("password for @alice:example.org: ")
        child.type(b"typed password\r")
        child.wait_for("passphrase of the store in")
        child.type(b"typed passphrase\r")
        code = child.wait()
    finally:
        child.close()
    text = child.text()
    assert "typed" not in text  # no echo
    # Both answers were taken: the next step, the login, is what failed.
    assert code == Exit.FAILED
    assert f"gapline tui: cannot reach the homeserver at {UNREACHABLE}" in text
    assert "Traceback" not in text


@pytest.mark.parametrize(("key", "says"), [(b"\x03", "interrupted"), (b"\x04", "end of input")])
def test_ctrl_c_or_ctrl_d_at_the_prompt_is_one_line_and_130(
    tmp_path: Path, key: bytes, says: str
) -> None:
    child = tui_on_a_terminal(tmp_path)
    try:
        child.wait_for("password for @alice:example.org: ")
        child.type(key)
        code = child.wait()
    finally:
        child.close()
    assert code == Exit.INTERRUPTED
    lines = [line for line in child.text().splitlines() if line.strip()]
    assert lines[-1].startswith("gapline tui: ") and says in lines[-1], lines
    assert "Traceback" not in child.text()
