"""The `gapline` command's conventions, checked on every subcommand's parser.

One vocabulary (a flag means the same everywhere), one README table that lists
every flag with the commands that take it, help pages that end with examples
and show no meaningless defaults, ``--version``, and usage errors as one line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gapline.cli import COMMANDS, command_parser, main, top_parser
from gapline.clikit import Exit

README = Path(__file__).resolve().parent.parent / "README.md"


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser a user meets: each command, and each of its subcommands."""
    for name in COMMANDS:
        parser, _ = command_parser(name)
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield f"{name} {sub_name}", sub


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            yield action


def runnable(name: str, parser: argparse.ArgumentParser) -> bool:
    """A parser that runs something (not one that only picks a subcommand)."""
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def test_version_and_short_version(capsys: pytest.CaptureFixture[str]) -> None:
    expected = f"gapline {importlib.metadata.version('gapline')}"
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as done:
            main([flag])
        assert done.value.code == 0
        assert capsys.readouterr().out.strip() == expected


def test_the_console_script_prints_the_version() -> None:
    script = Path(sys.executable).parent / "gapline"
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("gapline ")


@pytest.mark.parametrize("name", ["gapline", *COMMANDS, "journal read", "relay serve"])
def test_every_help_page_ends_with_examples_and_shows_no_meaningless_default(name: str) -> None:
    text = top_parser().format_help() if name == "gapline" else dict(parsers())[name].format_help()
    assert "(default: None)" not in text
    assert "('" not in text, "a default shown as a Python tuple"
    _, sep, tail = text.rpartition("\nexamples:\n")
    assert sep, f"`{name} --help` has no examples"
    commands = [line.strip() for line in re.sub(r" \\\n +", " ", tail).splitlines()]
    assert 1 <= len(commands) <= 2
    for command in commands:
        words = command.split()
        while "=" in words[0]:  # VAR=value before the command
            words.pop(0)
        if words[0] == "printf":  # a pipe into the command
            words = command.split("| ", 1)[1].split()
            while "=" in words[0]:
                words.pop(0)
        assert words[0] == "gapline", command


def test_required_flags_and_switches_show_no_default() -> None:
    for name, parser in parsers():
        text = " ".join(parser.format_help().split())
        for action in options(parser):
            if action.required or isinstance(action, argparse._StoreTrueAction):
                assert f"{action.option_strings[-1]}" in text
                help_text = " ".join((action.help or "").split())
                assert f"{help_text} (default:" not in text, (name, action.option_strings)


# Flags whose help says what this command does with the value (the value itself, its
# metavar and its check are the same everywhere); --store names "where this command keeps
# its state", a directory for some commands and a database for the others.
WORDED_PER_COMMAND = {"--store", "--room"}


def test_a_flag_means_the_same_in_every_command() -> None:
    seen: dict[str, tuple[str, tuple[object, ...]]] = {}
    for name, parser in parsers():
        for action in options(parser):
            for flag in action.option_strings:
                if flag == "--store":
                    assert action.metavar in ("DIR", "DSN"), (name, flag)
                    continue
                key: tuple[object, ...] = (action.dest, action.metavar, action.type)
                if flag not in WORDED_PER_COMMAND:
                    key += (action.help, action.default, action.choices)
                if flag in seen:
                    first, other = seen[flag]
                    assert other == key, f"{flag} differs between {first} and {name}"
                else:
                    seen[flag] = (name, key)


def readme_flag_rows() -> dict[str, set[str]]:
    """The README's flags table: each flag (and variable) -> the commands it names."""
    text = README.read_text()
    table = text.split("### Flags", 1)[1].split("\n### ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        takers = {c.strip().strip("`") for c in cells[2].split(",")}
        for flag in re.findall(r"`(-[-\w]+|\$\w+)", cells[0]):
            rows.setdefault(flag, set()).update(takers)
    return rows


def test_the_readme_table_lists_every_flag_with_the_commands_that_take_it() -> None:
    rows = readme_flag_rows()
    taken: dict[str, set[str]] = {}
    for name, parser in parsers():
        if not runnable(name, parser):
            continue
        for action in options(parser):
            for flag in action.option_strings:
                taken.setdefault(flag, set()).add(name)
    taken["-V"] = taken["--version"] = {"gapline"}
    for flag, commands in taken.items():
        assert flag in rows, f"{flag} is missing from the README's flags table"
        assert rows[flag] == commands, (
            f"{flag}: the table says {rows[flag]}, the parsers {commands}"
        )
    flags_in_table = {f for f in rows if f.startswith("-")} - {"-h", "--help"}
    assert flags_in_table <= set(taken), f"stale rows: {flags_in_table - set(taken)}"
    assert rows["$GAPLINE_PASSWORD"] == taken["--password-file"]
    assert rows["$GAPLINE_PASSPHRASE"] == taken["--passphrase-file"]


def test_the_readme_lists_every_exit_status() -> None:
    table = README.read_text().split("### Exit statuses", 1)[1]
    statuses = set(re.findall(r"^\| (\d+) \|", table, flags=re.M))
    assert statuses == {str(int(status)) for status in Exit}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bogus"], "unknown command 'bogus'"),
        (["-x"], "unrecognized arguments: -x"),
        (["journal", "read", "--store", "j.db", "--principal", "@b:x", "--room", "r"], "--room"),
        (["relay", "serve", "--store", "r.db"], "--retention"),
        (["bridge", "--homeserver", "localhost:8008", "--user", "@a:x", "--store", "s"], "http"),
    ],
)
def test_a_usage_error_is_one_line_and_status_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == Exit.USAGE
    assert len(err.splitlines()) == 1 and says in err and "--help" in err, err


def test_no_command_prints_the_help_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == Exit.USAGE
    assert "examples:" in capsys.readouterr().out
