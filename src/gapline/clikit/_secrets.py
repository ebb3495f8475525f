"""Secrets (a password, a store passphrase) from a file, the environment or a prompt.

The order is the same for every command and every secret: ``--NAME-file FILE``
(its first line), ``--NAME VALUE`` (accepted, with a warning: any local user can
read a process's arguments, e.g. with ``ps``), ``$GAPLINE_NAME``, then a prompt
on the controlling terminal. Never stdin: the bridge speaks its protocol there,
and a piped stdin is not a person.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gapline.clikit._exits import CommandError, Exit

__all__ = [
    "PASSPHRASE",
    "PASSWORD",
    "SecretSpec",
    "add_recovery_flags",
    "add_secret_flags",
    "prompt_secret",
    "recovery_key",
    "resolve_secret",
    "terminal_available",
]

_TTY = "/dev/tty"


@dataclass(frozen=True, slots=True)
class SecretSpec:
    """One kind of secret: its flag name, its environment variable, what it is."""

    name: str
    env: str
    what: str
    metavar: str

    @property
    def file_dest(self) -> str:
        return f"{self.name}_file"


PASSWORD = SecretSpec("password", "GAPLINE_PASSWORD", "the account's password", "PASSWORD")
PASSPHRASE = SecretSpec(
    "passphrase", "GAPLINE_PASSPHRASE", "the store's at-rest passphrase", "PASSPHRASE"
)

# Only its file flag: `recovery_key` reads it (no value flag, no environment variable).
RECOVERY_KEY = SecretSpec("recovery-key", "", "the recovery key", "KEY")


def add_secret_flags(parser: argparse.ArgumentParser, spec: SecretSpec) -> None:
    """``--NAME-file FILE`` and ``--NAME VALUE``; at most one of them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        f"--{spec.name}-file",
        dest=spec.file_dest,
        type=Path,
        metavar="FILE",
        help=f"read {spec.what} from the first line of FILE (or set ${spec.env}; "
        "neither given: ask on the terminal)",
    )
    group.add_argument(
        f"--{spec.name}",
        dest=spec.name,
        metavar=spec.metavar,
        help=f"{spec.what} itself; other local users can read it in the process list, "
        f"prefer --{spec.name}-file or ${spec.env}",
    )


def resolve_secret(
    args: argparse.Namespace,
    spec: SecretSpec,
    *,
    prompt: str,
    required: bool = True,
    warn: Callable[[str], None] | None = None,
) -> str | None:
    """The secret from the first source that has it (see the module docstring).

    With ``required=False`` a missing secret (no flag, no variable, no terminal) is
    None; otherwise it is a `CommandError` with status `Exit.NO_TERMINAL`. ``warn``
    says that a secret came from the command line (default: a line on stderr; a
    command whose stderr is JSON logs passes its logger).
    """
    path: Path | None = getattr(args, spec.file_dest, None)
    if path is not None:
        return _first_line(path, spec)
    value: str | None = getattr(args, spec.name, None)
    if value is not None:
        message = (
            f"--{spec.name} on the command line can be read by other local users; "
            f"use --{spec.name}-file FILE or ${spec.env}"
        )
        if warn is None:
            print(f"{getattr(args, 'prog', 'gapline')}: warning: {message}", file=sys.stderr)
        else:
            warn(message)
        return value
    from_env = os.environ.get(spec.env)
    if from_env is not None:
        return from_env
    answer = prompt_secret(prompt)
    if answer is None and required:
        raise CommandError(
            f"no {spec.name}: give --{spec.name}-file FILE or set ${spec.env} "
            "(there is no terminal to ask on)",
            Exit.NO_TERMINAL,
        )
    return answer


def _first_line(path: Path, spec: SecretSpec) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CommandError(
            f"cannot read --{spec.name}-file {path}: {exc.strerror or exc}", Exit.USAGE
        ) from None
    except UnicodeDecodeError:
        raise CommandError(f"--{spec.name}-file {path} is not UTF-8 text", Exit.USAGE) from None
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise CommandError(f"--{spec.name}-file {path} is empty", Exit.USAGE)
    return lines[0]


def add_recovery_flags(parser: argparse.ArgumentParser, *, prompt: bool = False) -> None:
    """``--recovery-key-file FILE`` (and, where a person is at a terminal, ``--recover``:
    ask for the key). Never a flag with the key itself: it opens every encrypted
    message the account ever backed up."""
    group = parser.add_mutually_exclusive_group() if prompt else parser
    group.add_argument(
        "--recovery-key-file",
        type=Path,
        metavar="FILE",
        help="restore this account's message keys from its server-side key backup, "
        "opened with the recovery key on the first line of FILE (as `gapline keys "
        "setup-recovery` printed it)",
    )
    if prompt:
        group.add_argument(
            "--recover",
            action="store_true",
            help="like --recovery-key-file, asking for the recovery key on the terminal",
        )


def recovery_key(args: argparse.Namespace) -> str | None:
    """The recovery key the flags of `add_recovery_flags` ask for, or None (not asked)."""
    path: Path | None = getattr(args, "recovery_key_file", None)
    if path is not None:
        return _first_line(path, RECOVERY_KEY)
    if not getattr(args, "recover", False):
        return None
    answer = prompt_secret("recovery key: ")
    if answer is None:
        raise CommandError(
            "--recover needs a terminal to ask on; give --recovery-key-file FILE",
            Exit.NO_TERMINAL,
        )
    return answer


def terminal_available() -> bool:
    """Whether this process has a controlling terminal to ask a person on."""
    try:
        fd = os.open(_TTY, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def prompt_secret(prompt: str) -> str | None:
    """Ask on the terminal without echo; None when there is no terminal.

    Ctrl-C or end of input at the prompt is a `CommandError` (`Exit.INTERRUPTED`).
    """
    if not terminal_available():
        return None
    try:
        return getpass.getpass(prompt)
    except KeyboardInterrupt:
        _end_prompt_line()
        raise CommandError("interrupted at the prompt", Exit.INTERRUPTED) from None
    except EOFError:
        _end_prompt_line()
        raise CommandError("no answer at the prompt (end of input)", Exit.INTERRUPTED) from None


def _end_prompt_line() -> None:
    # getpass leaves the cursor after the prompt; the error line starts on a line of its own.
    with contextlib.suppress(OSError), open(_TTY, "w") as tty:
        tty.write("\n")
