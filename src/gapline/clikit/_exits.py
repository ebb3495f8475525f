"""Exit statuses and the one exception a subcommand raises for an expected failure.

Every `gapline` subcommand ends with one of these statuses. An expected
failure (a bad flag value, a store that cannot be used, a refused login, no
terminal to ask on) is a `CommandError`: `gapline.cli.main` prints its message
as one line on stderr, prefixed with the command's name, and exits with its
status. A traceback means a bug.
"""

from __future__ import annotations

import enum

__all__ = ["CommandError", "Exit"]


class Exit(enum.IntEnum):
    """The exit statuses of every `gapline` command (the README's table lists them)."""

    OK = 0
    # The work failed: the homeserver or database refused or could not be reached,
    # a login was refused, a passphrase does not open the store.
    FAILED = 1
    # A flag is missing or its value is invalid (argparse's own status).
    USAGE = 2
    # `journal read --strict`: a message's visible revision was redacted and only the
    # homeserver could repair it.
    STALE = 3
    # The store cannot be used: it does not exist for a command that only reads, or it is
    # not a directory / not a database of the right kind, or the permissions forbid it.
    STORE = 4
    # The command needs a terminal (the TUI, or a prompt for a secret no flag, file or
    # environment variable gave) and there is none.
    NO_TERMINAL = 5
    # Ctrl-C (or end of input) at a prompt, or before the program was up.
    INTERRUPTED = 130


class CommandError(Exception):
    """An expected failure: one line on stderr and `status`; never a traceback."""

    def __init__(self, message: str, status: Exit = Exit.FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
