"""How every `gapline` help page looks: descriptions as written, useful defaults, examples last."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from gapline.clikit._exits import Exit

__all__ = ["CommandParser", "HelpFormatter", "examples", "subcommand"]


class CommandParser(argparse.ArgumentParser):
    """A usage error is one line, ``prog: error: message (see `prog --help`)``, and status 2:
    the usage block argparse would print first repeats what ``--help`` says."""

    def error(self, message: str) -> NoReturn:
        self.exit(Exit.USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and the examples' line breaks, and appends a flag's
    default only when there is one to show: never "(default: None)", never for a
    required flag, a switch, or a help text that already says its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or action.required
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or "(default" in text
        ):
            return text
        return text + " (default: %(default)s)"


def examples(*commands: str | tuple[str, ...]) -> str:
    """An epilog of one or two command lines, the last thing ``--help`` prints; a tuple is
    one command written over several lines (each continued with a backslash)."""
    lines = (c if isinstance(c, str) else " \\\n      ".join(c) for c in commands)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def subcommand(
    sub: Any, name: str, *, help: str, examples: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subparser (``relay serve``, ``journal read``) with the shared look and its own name
    for error lines."""
    parser = sub.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=examples,
        formatter_class=HelpFormatter,
    )
    parser.set_defaults(prog=parser.prog)
    return parser
