"""The conventions every `gapline` subcommand follows, in one place.

One flag vocabulary (``--homeserver URL``, ``--user MXID``, ``--store``, the
secret flags, ``-v/--verbose`` and ``--log-level``), secrets from a file, the
environment or a prompt (never only the command line), help pages that end with
examples, and expected failures as one line on stderr with a documented exit
status (`Exit`). It knows nothing of the programs: history, journal and relay
each import it, never each other.
"""

from gapline.clikit._exits import CommandError, Exit
from gapline.clikit._flags import (
    LOG_LEVELS,
    add_log_flags,
    add_login_flags,
    add_user_flag,
    existing_store,
    log_level,
    store_directory,
)
from gapline.clikit._help import CommandParser, HelpFormatter, examples, subcommand
from gapline.clikit._secrets import (
    PASSPHRASE,
    PASSWORD,
    SecretSpec,
    add_recovery_flags,
    add_secret_flags,
    prompt_secret,
    recovery_key,
    resolve_secret,
    terminal_available,
)
from gapline.clikit._values import (
    bounded_int,
    dsn,
    event_id,
    homeserver_url,
    is_postgres,
    positive_float,
    positive_int,
    room_id,
    shown,
    user_id,
)

__all__ = [
    "LOG_LEVELS",
    "PASSPHRASE",
    "PASSWORD",
    "CommandError",
    "CommandParser",
    "Exit",
    "HelpFormatter",
    "SecretSpec",
    "add_log_flags",
    "add_login_flags",
    "add_recovery_flags",
    "add_secret_flags",
    "add_user_flag",
    "bounded_int",
    "dsn",
    "event_id",
    "examples",
    "existing_store",
    "homeserver_url",
    "is_postgres",
    "log_level",
    "positive_float",
    "positive_int",
    "prompt_secret",
    "recovery_key",
    "resolve_secret",
    "room_id",
    "shown",
    "store_directory",
    "subcommand",
    "terminal_available",
    "user_id",
]
