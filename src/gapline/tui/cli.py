"""`gapline tui`: log in, open the encrypted store, run the terminal client.

    gapline tui [--user MXID] [--homeserver URL] [--store DIR] [--room ROOM_ID]
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
import functools
import logging
import os
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from gapline.clikit import (
    PASSPHRASE,
    CommandError,
    Exit,
    add_login_flags,
    add_recovery_flags,
    examples,
    recovery_key,
    resolve_secret,
    room_id,
)
from gapline.history import Engine, EngineConfig, EventSink
from gapline.history.cli import add_engine_tuning, add_store_flags, engine_config, recover
from gapline.history.cli_session import Target, keep_resumed, on_store, sign_in, target
from gapline.history.rooms import RoomDirectory
from gapline.matrix import (
    MatrixClient,
    MatrixError,
    MatrixUnavailable,
    Session,
    SyncResponse,
    UnknownToken,
)
from gapline.tui._app import Connect, EngineHandle, GaplineApp
from gapline.tui._config import ConfigError, TuiConfig, load_config
from gapline.tui._connection import Reachability

__all__ = ["DESCRIPTION", "EXAMPLES", "configure", "engine_connect", "run"]

log = logging.getLogger("gapline.tui")

DESCRIPTION = """\
Read Matrix rooms in the terminal, every gap in a room's history shown where it is.

Asks for the store's passphrase unless a file or the environment gives it, resumes the
session `gapline login` kept in the store (or asks for the password and logs in, reusing
the device the store remembers), then opens the screen: f fills the selected gap, ? lists
every key, q quits. Keys, colours and a default homeserver come from
$XDG_CONFIG_HOME/gapline/tui.toml."""

EXAMPLES = examples(
    "gapline tui --user @me:example.org",
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
    instead of polling the server a second time. A sync the homeserver refuses
    for the token goes to :attr:`token_refused` first: after a soft logout it
    returns once the same device is logged in again, and the sync is retried, so
    the engine's loop never sees the expiry.
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
        self.token_refused: Callable[[UnknownToken], Awaitable[None]] | None = None

    async def sync(self, **kwargs: Any) -> SyncResponse:
        while True:
            try:
                response = await super().sync(**kwargs)
            except MatrixUnavailable as exc:
                # The engine retries; the status line says why nothing arrives meanwhile.
                if self._reachability is not None:
                    self._reachability.unreachable(str(exc))
                raise
            except UnknownToken as exc:
                if self.token_refused is None:
                    raise
                await self.token_refused(exc)  # raises when the session cannot resume
                continue
            if self._reachability is not None:
                self._reachability.answered()
            self._directory.observe(response)
            return response


async def _resume(
    client: MatrixClient,
    engine: Engine,
    reachability: Reachability,
    login_hint: str,
    refused: UnknownToken,
) -> None:
    """Resume a softly logged-out session with its password, or end it (raising ``refused``).

    Only the same device may resume: a new one would not hold this store's keys, so a
    revoked session, a declined prompt or a server that hands out another device all end
    the session, and the status line says how to log in again.
    """
    user, device = client.user_id, client.device_id
    if not refused.soft_logout or user is None or device is None:
        reachability.ended(f"the homeserver ended this session; log in again with {login_hint}")
        raise refused
    problem: str | None = None
    while True:
        password = await reachability.ask_password(user, device, problem)
        if password is None:
            reachability.ended(f"the session expired; log in again with {login_hint}")
            raise refused
        try:
            session = await client.login(user, password, device_id=device)
        except MatrixUnavailable as exc:
            problem = f"cannot reach the homeserver: {exc}"
            continue
        except MatrixError as exc:
            problem = f"the homeserver refused the login: {exc}"
            continue
        if session.device_id != device:
            reachability.ended(
                f"the homeserver gave a new device ({session.device_id}) instead of {device}; "
                f"log in again with {login_hint}"
            )
            raise refused
        await keep_resumed(engine, session)
        log.info("the session of %s resumed on device %s", user, device)
        return


def engine_connect(
    homeserver: str,
    session: Session,
    store: Path,
    *,
    passphrase: str,
    config: EngineConfig,
    directory: RoomDirectory,
    reachability: Reachability | None = None,
    login_hint: str = "`gapline login`",
    kdf_cost: Any = None,
    sync: bool = True,
    **client_kwargs: Any,
) -> Connect:
    """The app's ``connect``: a client for ``session`` and the engine over ``store``.

    With ``reachability``, an expired session asks the app for its password and resumes
    (``login_hint`` is the command the status line names when it cannot).
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
                if reachability is not None:
                    client.token_refused = functools.partial(
                        _resume, client, engine, reachability, login_hint
                    )
                yield engine

    return connect


def configure(parser: argparse.ArgumentParser) -> None:
    add_login_flags(parser, stored=True)
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=(
            "the TUI's config file: keys, colours, and the homeserver used when "
            "--homeserver is not given (default $XDG_CONFIG_HOME/gapline/tui.toml, "
            "i.e. ~/.config/gapline/tui.toml)"
        ),
    )
    add_store_flags(parser, default="$XDG_DATA_HOME/gapline, i.e. ~/.local/share/gapline")
    parser.add_argument("--room", type=room_id, metavar="ROOM_ID", help="open this room first")
    add_recovery_flags(parser, prompt=True)
    add_engine_tuning(parser)


def _default_store() -> Path:
    # Each account's directory in it is the one this default named before accounts.
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "gapline"


def tui_config(args: argparse.Namespace) -> TuiConfig:
    """The config file, checked, and ``--homeserver`` defaulted from it (one line if bad)."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
    if args.homeserver is None:  # else the one the account logged in to, if any
        args.homeserver = config.homeserver
    return config


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    tui = tui_config(args)
    args.store = args.store or _default_store()
    chosen = target(args, hint=f' (or homeserver = "https://..." in {tui.path})')
    config = engine_config(args)
    store = chosen.account.directory
    passphrase = resolve_secret(args, PASSPHRASE, prompt=f"passphrase of the store in {store}: ")
    assert passphrase is not None
    key = recovery_key(args)
    return _main(args, chosen, config, passphrase, key, tui)


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
    chosen: Target,
    config: EngineConfig,
    passphrase: str,
    key: str | None = None,
    tui: TuiConfig | None = None,
) -> int:
    store = chosen.account.directory
    # The store first (a wrong passphrase fails here, offline), then the session.
    async with MatrixClient(chosen.homeserver) as client:
        session = await on_store(
            store,
            passphrase,
            lambda cache: sign_in(
                client, cache, chosen, device_id=args.device_id, name="gapline tui"
            ),
        )
    _needs_a_terminal()
    if key is not None:
        await _recover(chosen.homeserver, session, store, passphrase, key)
    directory = RoomDirectory()
    reachability = Reachability()
    app = GaplineApp(
        engine_connect(
            chosen.homeserver,
            session,
            store,
            passphrase=passphrase,
            config=config,
            directory=directory,
            reachability=reachability,
            login_hint=f"`gapline login --store {chosen.store} --user {chosen.account.user_id}`",
        ),
        rooms=directory,
        room_id=args.room,
        page_budget=config.page_budget,
        config=tui,
        reachability=reachability,
    )
    result = await app.run_async()
    return int(result or app.return_code or 0)
