"""The `gapline` command.

Each subcommand lives in the package it drives and is imported only when it is
run, so `gapline relay serve` never imports Textual and `gapline bot` never
imports the relay. A command module provides ``configure(parser)``, ``run(args)
-> int`` (or an ``async def run``) and ``EXAMPLES``, the epilog of its help.

An expected failure is a `gapline.clikit.CommandError`: one line on stderr,
``gapline COMMAND: message``, and its exit status (`gapline.clikit.Exit`). Ctrl-C
before a command handles it itself is one line and status 130.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Coroutine, Sequence
from types import ModuleType
from typing import Any

from gapline.clikit import CommandError, CommandParser, Exit, HelpFormatter, examples

# name -> (module, one-line summary). The summaries live here so `gapline --help`
# needs no import of any command module.
COMMANDS: dict[str, tuple[str, str]] = {
    "login": (
        "gapline.history.cli_session",
        "log in with a password; keep the session sealed in the store",
    ),
    "logout": ("gapline.history.cli_logout", "log an account out and delete its device"),
    "bridge": (
        "gapline.history.cli",
        "speak the history wire protocol as JSON lines on stdin/stdout",
    ),
    "keys": (
        "gapline.history.cli_keys",
        "set up key backup and recovery; export and import message keys",
    ),
    "tui": ("gapline.tui.cli", "read Matrix rooms in the terminal, gaps shown inline"),
    "demo": ("gapline.tui.demo", "throwaway homeserver, a room with a gap, and the TUI to fill it"),
    "bot": ("gapline.journal.cli_bot", "run a Matrix bot on the event journal"),
    "journal": ("gapline.journal.cli_journal", "inspect an event journal"),
    "relay": ("gapline.relay.cli", "run a Meshline relay"),
}

EXAMPLES = examples(
    "gapline demo --headless",
    "gapline relay serve --listen 127.0.0.1:8787 --store relay.db --retention 604800",
)


def version() -> str:
    try:
        return importlib.metadata.version("gapline")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        from gapline import __version__

        return __version__


def top_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="gapline",
        description="Message history that never pretends to be complete.\n\n"
        "Run `gapline COMMAND --help` for the flags of each command.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"gapline {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if not args_in or args_in[0] not in COMMANDS:
        parser = top_parser()
        if not args_in:
            parser.print_help()
            return Exit.USAGE
        if args_in[0].startswith("-"):
            parser.parse_args(args_in[:1])  # -h, -V: prints and exits 0; else a usage error
            parser.print_help()
            return Exit.OK
        parser.error(f"unknown command {args_in[0]!r}")
    name, rest = args_in[0], args_in[1:]
    try:
        parser, module = command_parser(name)
    except ModuleNotFoundError as exc:
        print(
            f"gapline {name}: this command needs an optional part that is not installed "
            f"({exc.name}); install gapline with the matching extra, e.g. `pip install gapline[all]`",
            file=sys.stderr,
        )
        return Exit.USAGE
    args = parser.parse_args(rest)
    return run_command(module.run, args)


def command_parser(name: str) -> tuple[argparse.ArgumentParser, ModuleType]:
    """The parser of ``gapline NAME`` and the module that runs it (imported now)."""
    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = CommandParser(
        prog=f"gapline {name}",
        description=getattr(module, "DESCRIPTION", summary),
        epilog=getattr(module, "EXAMPLES", None),
        formatter_class=HelpFormatter,
    )
    parser.set_defaults(prog=parser.prog)
    module.configure(parser)
    return parser, module


def run_command(
    run: Callable[[argparse.Namespace], int | Coroutine[Any, Any, int]], args: argparse.Namespace
) -> int:
    """Run a command's ``run`` (and its coroutine) and turn expected failures into a line
    on stderr and an exit status."""
    prog = getattr(args, "prog", "gapline")
    try:
        result = run(args)
        status = asyncio.run(result) if isinstance(result, Coroutine) else result
    except (CommandError, BaseExceptionGroup) as exc:
        failure = _command_error(exc)
        if failure is None:
            raise
        print(f"{prog}: {failure.message}", file=sys.stderr)
        return int(failure.status)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    return int(status or 0)


def _command_error(exc: BaseException) -> CommandError | None:
    """The `CommandError` to report: ``exc`` itself, or the first of an exception group
    (a task group wraps what its body raised) that holds nothing else."""
    if isinstance(exc, CommandError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        rest = exc.split(CommandError)[1]
        if rest is None:
            return _command_error(exc.exceptions[0])
    return None


if __name__ == "__main__":
    raise SystemExit(main())
