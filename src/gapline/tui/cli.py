"""`gapline tui`: log in, open the encrypted store, run the terminal client.

    gapline tui --homeserver URL --user MXID [--store DIR] [--password-file F]

This module and ``demo`` are the command glue: they alone import
``gapline.matrix`` (to log in and to build the client the engine syncs with).
The app itself sees only ``gapline.history``'s public names.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import os
import sys
from collections.abc import AsyncGenerator, Coroutine, Mapping
from pathlib import Path
from typing import Any

from gapline.history import Engine, EngineConfig, EventSink
from gapline.history.rooms import RoomDirectory
from gapline.matrix import MatrixClient, MatrixError, Session, SyncResponse
from gapline.tui._app import Connect, EngineHandle, GaplineApp

__all__ = ["configure", "engine_connect", "run"]

log = logging.getLogger("gapline.tui")

DEVICE_FILE = "device.json"  # the same file `gapline bridge` keeps: one device per store
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

    def __init__(self, *args: Any, directory: RoomDirectory, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._directory = directory

    async def sync(self, **kwargs: Any) -> SyncResponse:
        response = await super().sync(**kwargs)
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
            homeserver, session=session, directory=directory, **client_kwargs
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
            ) as engine:
                yield engine

    return connect


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--homeserver", required=True, metavar="URL", help="homeserver base URL")
    parser.add_argument("--user", required=True, metavar="MXID", help="user to log in as")
    parser.add_argument(
        "--store",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory of the encrypted cache (default: ~/.local/share/gapline/<user>)",
    )
    parser.add_argument(
        "--password-file", type=Path, metavar="F", help="read the password from F, not a prompt"
    )
    parser.add_argument("--room", metavar="ROOM_ID", help="open this room first")
    tuning = parser.add_argument_group("engine tuning", "defaults are the seed's numbers")
    defaults = EngineConfig()
    for name in ("page_size", "page_budget", "recent_pages"):
        tuning.add_argument(
            "--" + name.replace("_", "-"), type=int, default=getattr(defaults, name), metavar="N"
        )


def _default_store(user: str) -> Path:
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "gapline" / user.lstrip("@").replace(":", "_")


def stored_device(store: Path, user: str) -> str | None:
    """The device this store logged in with before (for the same user), if any."""
    try:
        data = json.loads((store / DEVICE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data.get("user") == user:
        device = data.get("device_id")
        return device if isinstance(device, str) else None
    return None


def remember_device(store: Path, user: str, session: Session) -> None:
    # Identifiers only: the access token never touches the disk.
    path = store / DEVICE_FILE
    tmp = path.with_suffix(".tmp")
    data = {"user": user, "user_id": session.user_id, "device_id": session.device_id}
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int | Coroutine[None, None, int]:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    store: Path = args.store or _default_store(args.user)
    try:
        store.mkdir(parents=True, exist_ok=True)
        config = EngineConfig(
            page_size=args.page_size, page_budget=args.page_budget, recent_pages=args.recent_pages
        )
    except (OSError, ValueError) as exc:
        print(f"gapline tui: {exc}", file=sys.stderr)
        return 2
    if args.password_file is not None:
        try:
            password = args.password_file.read_text().rstrip("\n")
        except OSError as exc:
            print(f"gapline tui: cannot read the password file: {exc}", file=sys.stderr)
            return 2
    else:
        password = getpass.getpass(f"password for {args.user}: ")
    passphrase = os.environ.get("GAPLINE_PASSPHRASE")
    if passphrase is None:
        passphrase = getpass.getpass(f"passphrase of the store in {store}: ")
    return _main(args, store, config, password, passphrase)


async def _main(
    args: argparse.Namespace, store: Path, config: EngineConfig, password: str, passphrase: str
) -> int:
    async with MatrixClient(args.homeserver) as client:
        try:
            session = await client.login(
                args.user,
                password,
                device_id=stored_device(store, args.user),
                initial_device_display_name="gapline tui",
            )
        except MatrixError as exc:
            print(f"gapline tui: login as {args.user} failed: {exc}", file=sys.stderr)
            return 1
    remember_device(store, args.user, session)
    # Check the passphrase before the screen switches (a wrong one fails here, offline).
    try:
        async with Engine.open(store, None, passphrase=passphrase, sync=False):
            pass
    except Exception as exc:  # noqa: BLE001 - WrongPassphrase / StorageError, one line
        print(f"gapline tui: cannot open the store in {store}: {exc}", file=sys.stderr)
        return 1
    directory = RoomDirectory()
    app = GaplineApp(
        engine_connect(
            args.homeserver,
            session,
            store,
            passphrase=passphrase,
            config=config,
            directory=directory,
        ),
        rooms=directory,
        room_id=args.room,
        page_budget=config.page_budget,
    )
    result = await app.run_async()
    return int(result or 0)
