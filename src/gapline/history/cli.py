"""`gapline bridge`: the history engine's wire protocol as JSON lines on stdin/stdout.

    gapline bridge --homeserver URL --user MXID --password PW --store DIR
                   [--passphrase P] [--device-id ID]

Opens the engine's encrypted store in DIR (a wrong passphrase fails here,
before any network request), logs in (reusing the device stored in DIR, so
the server sees one device across restarts), starts the sync loop, and serves requests until end of input or ``"Shutdown"``. stdout carries
protocol lines only; logs go to stderr. See docs/history.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path

from gapline.history._bridge import Bridge, LineWriter, stream_lines
from gapline.history._engine import Engine
from gapline.history._mirror import Mirror
from gapline.history._publish import Publisher
from gapline.history._types import EngineConfig
from gapline.matrix import MatrixClient, MatrixError
from gapline.storage import StorageError, WrongPassphrase

__all__ = ["configure", "run"]

log = logging.getLogger("gapline.history.bridge")

DEVICE_FILE = "device.json"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--homeserver", required=True, metavar="URL", help="homeserver base URL")
    parser.add_argument("--user", required=True, metavar="MXID", help="user to log in as")
    parser.add_argument("--password", required=True, metavar="PW", help="the user's password")
    parser.add_argument(
        "--store", required=True, metavar="DIR", type=Path, help="directory of the durable cache"
    )
    parser.add_argument(
        "--passphrase",
        metavar="P",
        default=None,
        help="passphrase of the store's at-rest encryption (default: $GAPLINE_PASSPHRASE)",
    )
    parser.add_argument(
        "--device-id",
        metavar="ID",
        default=None,
        help="device to log in as (default: the stored one)",
    )
    tuning = parser.add_argument_group(
        "engine tuning", "defaults are the seed's numbers; smaller values make gaps easy to demo"
    )
    defaults = EngineConfig()
    for name, help_text in (
        ("page_size", "events per /messages page"),
        ("page_budget", "pages one FillGap walks"),
        ("recent_pages", "pages the recent load on open walks"),
        ("initial_history_limit", "events paginated when a first recent load fails"),
    ):
        tuning.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=getattr(defaults, name),
            metavar="N",
            help=f"{help_text} (default {getattr(defaults, name)})",
        )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr")


def _stored_device(store: Path, user: str) -> str | None:
    """The device ID this store logged in with before, if it was for the same user."""
    try:
        data = json.loads((store / DEVICE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", store / DEVICE_FILE, exc)
        return None
    if (
        isinstance(data, dict)
        and data.get("user") == user
        and isinstance(data.get("device_id"), str)
    ):
        return data["device_id"]
    return None


def _remember_device(store: Path, user: str, user_id: str, device_id: str) -> None:
    # Only identifiers, never the access token: the bridge logs in with the
    # password every start, so no credential sits in the store directory.
    path = store / DEVICE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"user": user, "user_id": user_id, "device_id": device_id}) + "\n")
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int | Coroutine[None, None, int]:
    """Check the flags and the store directory, then hand back the serving coroutine."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store: Path = args.store
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gapline bridge: cannot use store directory {store}: {exc}", file=sys.stderr)
        return 2
    try:
        config = EngineConfig(
            page_size=args.page_size,
            page_budget=args.page_budget,
            recent_pages=args.recent_pages,
            initial_history_limit=args.initial_history_limit,
        )
    except ValueError as exc:
        print(f"gapline bridge: {exc}", file=sys.stderr)
        return 2
    device_id = args.device_id or _stored_device(store, args.user)
    passphrase = args.passphrase or os.environ.get("GAPLINE_PASSPHRASE")
    if not passphrase:
        log.warning(
            "no --passphrase and no $GAPLINE_PASSPHRASE: the store's key is wrapped "
            "with an empty passphrase"
        )
    return _serve(args, config, store, device_id, passphrase)


async def _serve(
    args: argparse.Namespace,
    config: EngineConfig,
    store: Path,
    device_id: str | None,
    passphrase: str | None,
) -> int:
    writer = LineWriter(sys.stdout.buffer)
    mirror = Mirror()
    publisher = Publisher([mirror, writer])
    async with MatrixClient(args.homeserver) as client:
        try:
            # The store first: a wrong passphrase is a clear error before any
            # network request. The sync loop starts only once the client is logged in.
            async with Engine.open(
                store,
                client,
                config=config,
                passphrase=passphrase or "",
                sink=publisher,
                sync=False,
            ) as engine:
                try:
                    session = await client.login(
                        args.user,
                        args.password,
                        device_id=device_id,
                        initial_device_display_name="gapline bridge",
                    )
                except MatrixError as exc:
                    print(f"gapline bridge: login as {args.user} failed: {exc}", file=sys.stderr)
                    return 1
                await asyncio.to_thread(
                    _remember_device, store, args.user, session.user_id, session.device_id
                )
                log.info("logged in as %s (device %s)", session.user_id, session.device_id)
                engine.start_sync()
                return await Bridge(engine, writer, mirror).run(stream_lines(sys.stdin.buffer))
        except WrongPassphrase:
            print(f"gapline bridge: wrong passphrase for the store in {store}", file=sys.stderr)
            return 1
        except StorageError as exc:
            print(f"gapline bridge: cannot open the store in {store}: {exc}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            log.info("stdout closed; stopping")
            return 0
