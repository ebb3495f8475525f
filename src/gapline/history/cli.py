"""`gapline bridge`: the history engine's wire protocol as JSON lines on stdin/stdout.

    gapline bridge --store DIR [--user MXID] [--homeserver URL]
                   [--password-file FILE | --password PASSWORD]
                   [--passphrase-file FILE | --passphrase PASSPHRASE] [--device-id ID]
                   [--recovery-key-file FILE]

Opens the account's encrypted store in DIR (a wrong passphrase fails here, before any
network request), resumes the session `gapline login` sealed there or logs in with the
password (reusing the device stored in DIR, so the server sees one device across
restarts), starts the sync loop, and serves requests until end of input or
``"Shutdown"``. With ``--recovery-key-file`` it first restores the account's keys from
its server-side backup (a wrong key fails before the sync starts, nothing changed).
stdout carries protocol lines only; logs go to stderr. See docs/history.md.

This module also holds what `gapline tui` shares with the bridge: the engine
tuning flags and the store flags.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path

from gapline.clikit import (
    PASSPHRASE,
    CommandError,
    Exit,
    add_log_flags,
    add_login_flags,
    add_recovery_flags,
    add_secret_flags,
    examples,
    log_level,
    recovery_key,
)
from gapline.e2ee import E2eeError, RecoveryKeyInvalid, SecretStorageError, WrongRecoveryKey
from gapline.history._bridge import Bridge, LineWriter, stream_lines
from gapline.history._engine import Engine
from gapline.history._mirror import Mirror
from gapline.history._publish import Publisher
from gapline.history._types import EngineConfig
from gapline.history.cli_session import (
    Target,
    add_device_flag,
    sign_in,
    store_passphrase,
    target,
)
from gapline.matrix import MatrixClient, MatrixError
from gapline.storage import StorageError, WrongPassphrase

__all__ = [
    "DESCRIPTION",
    "EXAMPLES",
    "add_engine_tuning",
    "add_store_flags",
    "configure",
    "engine_config",
    "recover",
    "run",
]

log = logging.getLogger("gapline.history.bridge")

DESCRIPTION = """\
Speak the history engine's wire protocol as JSON lines on stdin/stdout.

Opens the account's encrypted store in --store DIR first (a wrong passphrase fails before
any network request), resumes the session `gapline login` kept there (or logs in with the
password, reusing the device the store remembers), starts the sync loop
and answers one JSON request per line until end of input or "Shutdown". stdout carries
protocol lines only; logs go to stderr. --recovery-key-file restores the account's
message keys from its key backup first (a new device reads the history the account could
read before)."""

EXAMPLES = examples(
    "gapline bridge --store ~/gapline --user @me:example.org --passphrase-file passphrase.txt",
    (
        "printf '%s\\n' '\"DumpState\"' '\"Shutdown\"' | GAPLINE_PASSWORD=pw GAPLINE_PASSPHRASE=pp",
        "gapline bridge --homeserver http://127.0.0.1:8008 --user @me:localhost --store bridge-store",
    ),
)

_TUNING = (
    ("page_size", "events per /messages page"),
    ("page_budget", "pages one FillGap walks"),
    ("recent_pages", "pages the recent load on open walks"),
    ("initial_history_limit", "events paginated when a first recent load fails"),
)


def add_engine_tuning(parser: argparse.ArgumentParser) -> None:
    """The engine's tuning flags (bridge and tui): small values make gaps easy to demo."""
    tuning = parser.add_argument_group(
        "engine tuning", "small values make gaps cheap to demo and test"
    )
    defaults = EngineConfig()
    for name, help_text in _TUNING:
        tuning.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=getattr(defaults, name),
            metavar="N",
            help=help_text,
        )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    try:
        return EngineConfig(**{name: getattr(args, name) for name, _ in _TUNING})
    except ValueError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None


def add_store_flags(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    """``--store DIR``, its passphrase's sources and ``--device-id`` (bridge and tui).

    ``default`` describes the directory used without ``--store``; None makes it required.
    """
    parser.add_argument(
        "--store",
        required=default is None,
        default=None,
        metavar="DIR",
        type=Path,
        help="directory of the accounts' encrypted stores, created if missing: one "
        "subdirectory per account, with its messages, keys and sealed session"
        + (f" (default: {default})" if default else ""),
    )
    add_secret_flags(parser, PASSPHRASE)
    add_device_flag(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    add_login_flags(parser, stored=True)
    add_store_flags(parser)
    add_recovery_flags(parser)
    add_engine_tuning(parser)
    add_log_flags(parser)


async def recover(engine: Engine, key: str) -> None:
    """Recover the account's keys with the recovery key into the engine's store (the key
    backup's keys are then fetched as rooms show them); a wrong or mistyped key, or a
    damaged secret storage, is one line (status 1) and nothing is changed."""
    try:
        await engine.recover_keys(key)
    except WrongRecoveryKey:
        raise CommandError(
            "wrong recovery key: it does not open the account's secret storage"
        ) from None
    except RecoveryKeyInvalid as exc:
        raise CommandError(f"not a recovery key: {exc}") from None
    except SecretStorageError as exc:
        raise CommandError(f"cannot recover: {exc}") from None
    except (E2eeError, MatrixError) as exc:
        raise CommandError(f"recovery failed: {exc}") from None
    log.info("recovery done: keys are restored from the key backup as rooms show them")


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    """Check the flags, the store directory and the secrets, then hand back the serving
    coroutine."""
    logging.basicConfig(
        stream=sys.stderr,
        level=log_level(args),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    chosen = target(args)
    config = engine_config(args)
    passphrase = store_passphrase(args, chosen.account.directory)
    key = recovery_key(args)
    return _serve(args, config, chosen, passphrase, key)


async def _serve(
    args: argparse.Namespace,
    config: EngineConfig,
    chosen: Target,
    passphrase: str,
    key: str | None = None,
) -> int:
    store = chosen.account.directory
    writer = LineWriter(sys.stdout.buffer)
    mirror = Mirror()
    publisher = Publisher([mirror, writer])
    opened = False
    failure: CommandError | None = None
    async with MatrixClient(chosen.homeserver) as client:
        try:
            # The store first: a wrong passphrase is a clear error before any
            # network request. The sync loop starts only once the client is logged in.
            async with Engine.open(
                store,
                client,
                config=config,
                passphrase=passphrase,
                sink=publisher,
                sync=False,
                e2ee=True,
            ) as engine:
                opened = True
                # Failures are raised after the engine closed (its task group would
                # wrap them in an exception group).
                try:
                    session = await sign_in(
                        client,
                        engine.store,
                        chosen,
                        device_id=args.device_id,
                        name="gapline bridge",
                    )
                    if key is not None:
                        await recover(engine, key)
                except CommandError as exc:
                    failure = exc
                else:
                    log.info("logged in as %s (device %s)", session.user_id, session.device_id)
                    engine.start_sync()
                    return await Bridge(engine, writer, mirror).run(stream_lines(sys.stdin.buffer))
        except WrongPassphrase:
            raise CommandError(f"wrong passphrase for the store in {store}") from None
        except StorageError as exc:
            if not opened:
                raise CommandError(f"cannot open the store in {store}: {exc}", Exit.STORE) from None
            raise CommandError(f"the store in {store} failed: {exc}") from None
        except BrokenPipeError:
            log.info("stdout closed; stopping")
            return Exit.OK
    assert failure is not None
    raise failure
