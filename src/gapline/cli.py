"""The `gapline` command.

Each subcommand lives in the package it drives and is imported only when it is
run, so `gapline relay serve` never imports Textual and `gapline bot` never
imports the relay. A command module provides ``configure(parser)`` and
``run(args) -> int`` (or an ``async def run``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import sys
from collections.abc import Sequence

# name -> (module, one-line summary). The summaries live here so `gapline --help`
# needs no import of any command module.
COMMANDS: dict[str, tuple[str, str]] = {
    "bridge": (
        "gapline.history.cli",
        "speak the history wire protocol as JSON lines on stdin/stdout",
    ),
    "tui": ("gapline.tui.cli", "read Matrix rooms in the terminal, gaps shown inline"),
    "demo": ("gapline.tui.demo", "throwaway homeserver, a room with a gap, and the TUI to fill it"),
    "bot": ("gapline.journal.cli_bot", "run a Matrix bot on the event journal"),
    "journal": ("gapline.journal.cli_journal", "inspect an event journal"),
    "relay": ("gapline.relay.cli", "run a Meshline relay"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gapline",
        description="Message history that never pretends to be complete.",
        epilog="Run `gapline COMMAND --help` for the flags of each command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if not args_in or args_in[0] not in COMMANDS:
        parser = _top_parser()
        if not args_in or args_in[0] in ("-h", "--help"):
            parser.print_help()
            return 0 if args_in else 2
        parser.error(f"unknown command {args_in[0]!r}")
    name, rest = args_in[0], args_in[1:]
    module_name, summary = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(
            f"gapline {name}: this command needs an optional part that is not installed "
            f"({exc.name}); install gapline with the matching extra, e.g. `pip install gapline[all]`",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(prog=f"gapline {name}", description=summary)
    module.configure(parser)
    args = parser.parse_args(rest)
    result = module.run(args)
    if inspect.iscoroutine(result):
        try:
            result = asyncio.run(result)
        except KeyboardInterrupt:
            return 130
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
