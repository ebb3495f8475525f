"""`gapline tui`: log in, open the encrypted store, run the terminal client.

    gapline tui --homeserver URL --user MXID [--store DIR] [--room ROOM_ID]
                [--password-file FILE | --password PASSWORD]
                [--passphrase-file FILE | --passphrase PASSPHRASE] [--device-id ID]
                [--recovery-key-file FILE | --recover]

This module and ``demo`` are the command glue: they alone import
``gapline.matrix`` (to log in and to build the client the engine syncs with).
The app itself sees only ``gapline.history``'s public names.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import AsyncGenerator, Coroutine, Mapping
from pathlib import Path
from typing import Any

from gapline.clikit import (
    PASSPHRASE,
    PASSWORD,
    CommandError,
    Exit,
    add_login_flags,
    add_recovery_flags,
    examples,
    recovery_key,
    resolve_secret,
    room_id,
    store_directory,
)
from gapline.history import Engine, EngineConfig, EventSink
from gapline.history.cli import (
    add_engine_tuning,
    add_store_flags,
    check_store,
    engine_config,
    login_failure,
    recover,
    remember_device,
    stored_device,
)
from gapline.history.rooms import RoomDirectory
from gapline.matrix import MatrixClient, MatrixError, MatrixUnavailable, Session, SyncResponse
from gapline.tui._app import Connect, EngineHandle, GaplineApp
from gapline.tui._config import ConfigError, TuiConfig, load_config
from gapline.tui._connection import Reachability

__all__ = ["DESCRIPTION", "EXAMPLES", "configure", "engine_connect", "run"]

log = logging.getLogger("gapline.tui")

DESCRIPTION = """\
Read Matrix rooms in the terminal, every gap in a room's history shown where it is.

Asks for the password and the store's passphrase unless a file or the environment
gives them, logs in reusing the device the store remembers, checks the passphrase,
then opens the screen: f fills the selected gap, q quits."""

EXAMPLES = examples(
    "gapline tui --homeserver https://matrix.example.org --user @me:example.org",
    (
        "gapline tui --homeserver https://matrix.example.org --user @me:example.org",
        "--password-file password.txt --room '!abc:example.org'",
    ),
)
# The room list's first look at the account: names and unread counts, no timeline.
ROOM_LIST_FILTER: Mapping[str, Any] = {
    "room": {
        "timeline": {"limit": 0},
        "state": {"types": ["m.room.name", "m.room.canonical_alias"]},
        "ephemeral": {"types": []},
    },
    "presence": {"types": []},
    "account_data": {"types": []},
}


class _ObservedClient(MatrixClient):
    """A MatrixClient whose every sync answer also reaches the room directory.

    The engine owns the sync loop; the room list rides along on its answers
    instead of polling the server a second time.
    """

    def __init__(
        self,
        *args: Any,
        directory: RoomDirectory,
        reachability: Reachability | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._directory = directory
        self._reachability = reachability

    async def sync(self, **kwargs: Any) -> SyncResponse:
        try:
            response = await super().sync(**kwargs)
        except MatrixUnavailable as exc:
            # The engine retries; the status line says why nothing arrives meanwhile.
            if self._reachability is not None:
                self._reachability.unreachable(str(exc))
            raise
        if self._reachability is not None:
            self._reachability.answered()
        self._directory.observe(response)
        return response


def engine_connect(
    homeserver: str,
    session: Session,
    store: Path,
    *,
    passphrase: str,
    config: EngineConfig,
    directory: RoomDirectory,
    reachability: Reachability | None = None,
    kdf_cost: Any = None,
    sync: bool = True,
    **client_kwargs: Any,
) -> Connect:
    """The app's ``connect``: a client for ``session`` and the engine over ``store``.

    ``client_kwargs`` go to the ``MatrixClient`` (``trust_env=False`` for a
    loopback server, a ``transport`` in tests).
    """

    @contextlib.asynccontextmanager
    async def connect(sink: EventSink) -> AsyncGenerator[EngineHandle]:
        async with _ObservedClient(
            homeserver,
            session=session,
            directory=directory,
            reachability=reachability,
            **client_kwargs,
        ) as client:
            try:
                await client.sync(timeout_ms=0, filter=ROOM_LIST_FILTER)
            except MatrixError as exc:  # the room list waits for the engine's sync then
                log.warning("room list: %s", exc)
            async with Engine.open(
                store,
                client,
                passphrase=passphrase,
                sink=sink,
                config=config,
                kdf_cost=kdf_cost,
                sync=sync,
                e2ee=True,
            ) as engine:
                yield engine

    return connect


def configure(parser: argparse.ArgumentParser) -> None:
    add_login_flags(parser)
    for action in parser._actions:  # the config file may name the homeserver instead
        if action.dest == "homeserver":
            action.required = False
            action.help = f"{action.help} (default: homeserver in the config file)"
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=(
            "the TUI's config file (keys, colours, homeserver; default "
            "$XDG_CONFIG_HOME/gapline/tui.toml, i.e. ~/.config/gapline/tui.toml)"
        ),
    )
    add_store_flags(
        parser, default="$XDG_DATA_HOME/gapline/<user>, i.e. ~/.local/share/gapline/<user>"
    )
    parser.add_argument("--room", type=room_id, metavar="ROOM_ID", help="open this room first")
    add_recovery_flags(parser, prompt=True)
    add_engine_tuning(parser)


def _default_store(user: str) -> Path:
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "gapline" / user.lstrip("@").replace(":", "_")


def tui_config(args: argparse.Namespace) -> TuiConfig:
    """The config file, checked, and ``--homeserver`` defaulted from it (one line if bad)."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
    if args.homeserver is None:
        if config.homeserver is None:
            raise CommandError(
                f'--homeserver is needed (or homeserver = "https://..." in {config.path})',
                Exit.USAGE,
            )
        args.homeserver = config.homeserver
    return config


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    tui = tui_config(args)
    store = store_directory(args.store or _default_store(args.user))
    config = engine_config(args)
    password = resolve_secret(args, PASSWORD, prompt=f"password for {args.user}: ")
    passphrase = resolve_secret(args, PASSPHRASE, prompt=f"passphrase of the store in {store}: ")
    assert password is not None and passphrase is not None
    key = recovery_key(args)
    return _main(args, store, config, password, passphrase, key, tui)


def _needs_a_terminal() -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CommandError(
            "the terminal client needs a terminal on stdin and stdout "
            "(for scripts: gapline bridge speaks the same engine as JSON lines)",
            Exit.NO_TERMINAL,
        )


async def _recover(
    homeserver: str, session: Session, store: Path, passphrase: str, key: str
) -> None:
    """Restore the account's keys into the store before the screen opens (a wrong key is
    one line, nothing changed)."""
    async with (
        MatrixClient(homeserver, session=session) as client,
        Engine.open(store, client, passphrase=passphrase, sync=False, e2ee=True) as engine,
    ):
        await recover(engine, key)


async def _main(
    args: argparse.Namespace,
    store: Path,
    config: EngineConfig,
    password: str,
    passphrase: str,
    key: str | None = None,
    tui: TuiConfig | None = None,
) -> int:
    async with MatrixClient(args.homeserver) as client:
        try:
            session = await client.login(
                args.user,
                password,
                device_id=args.device_id or stored_device(store, args.user),
                initial_device_display_name="gapline tui",
            )
        except MatrixError as exc:
            raise login_failure(args.homeserver, args.user, exc) from None
    remember_device(store, args.user, session)
    # Check the passphrase before the screen switches (a wrong one fails here, offline).
    await check_store(store, passphrase)
    _needs_a_terminal()
    if key is not None:
        await _recover(args.homeserver, session, store, passphrase, key)
    directory = RoomDirectory()
    reachability = Reachability()
    app = GaplineApp(
        engine_connect(
            args.homeserver,
            session,
            store,
            passphrase=passphrase,
            config=config,
            directory=directory,
            reachability=reachability,
        ),
        rooms=directory,
        room_id=args.room,
        page_budget=config.page_budget,
        config=tui,
        reachability=reachability,
    )
    result = await app.run_async()
    return int(result or app.return_code or 0)
