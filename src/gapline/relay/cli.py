"""`gapline relay serve`: run a Meshline relay process.

    gapline relay serve --listen HOST:PORT --store DSN --retention SECONDS
                        [--network-context CONTEXT] [--relay-key FILE] ...

``--db`` is the same flag as ``--store`` (the name the relay had first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from gapline.clikit import (
    CommandError,
    Exit,
    add_log_flags,
    dsn,
    examples,
    log_level,
    positive_float,
    positive_int,
    subcommand,
)
from gapline.relay._config import DEFAULT_NETWORK_CONTEXT, RelayConfig

__all__ = ["EXAMPLES", "configure", "run"]


SERVE_EXAMPLES = examples(
    "gapline relay serve --listen 127.0.0.1:8787 --store relay.db --retention 604800",
    (
        "gapline relay serve --listen 0.0.0.0:8443 --store postgresql://relay@db/relay",
        "--retention 604800 --public-url https://relay.example/meshline/v1",
        "--tls-cert cert.pem --tls-key key.pem",
    ),
)
ENTRY_EXAMPLES = examples(
    (
        "gapline relay registry-entry --relay-key b.key --url https://relay-b.example/meshline/v1",
        "--network-context neo:860833102:0x...",
    ),
)
EXAMPLES = SERVE_EXAMPLES + "\n" + ENTRY_EXAMPLES

_LOG_FIELDS = (
    "method",
    "url",
    "relay_id",
    "records",
    "visibility",
    "sends",
    "channel",
    "dsn",
    "remote",
    "transport",
    "error_id",
    "reason",
    "timeout",
    "max_connections",
)

# The abuse limits: (flag, RelayConfig field, type, metavar, help). Each is a flag of
# `relay serve` and a field of RelayConfig, whose default it shows (docs/relay.md).
_LIMITS: tuple[tuple[str, str, Callable[[str], Any], str, str], ...] = (
    ("--account-rate", "account_rate_per_second", positive_float, "PER_SECOND",
     "request rate per account, over all its verified sessions"),
    ("--account-burst", "account_burst", positive_int, "N", "per-account bucket size"),
    ("--unauthenticated-rate", "unauthenticated_rate_per_second", positive_float,
     "PER_SECOND",
     "request rate of all calls without a verified session together, every address"),
    ("--unauthenticated-burst", "unauthenticated_burst", positive_int, "N",
     "bucket size shared by all calls without a verified session"),
    ("--challenges-per-address", "challenges_per_address", positive_int, "N",
     "outstanding auth.challenge nonces one address may hold"),
    ("--challenges-per-account", "challenges_per_account", positive_int, "N",
     "outstanding auth.challenge nonces one account may hold"),
    ("--max-connections", "max_connections", positive_int, "N",
     "open connections in total (HTTP and WebSocket); more are refused with 503"),
    ("--max-connections-per-address", "max_connections_per_address", positive_int, "N",
     "open connections per client address (IPv6: per /64); more are refused with 429"),
    ("--header-timeout", "header_timeout", positive_float, "SECONDS",
     "time to send a whole request head, from connecting or from the first byte of the "
     "next request on a kept-alive connection"),
    ("--body-timeout", "body_timeout", positive_float, "SECONDS",
     "time to send a whole request body"),
    ("--idle-timeout", "idle_timeout", positive_float, "SECONDS",
     "how long a kept-alive HTTP connection may wait for its next request"),
    ("--handshake-timeout", "handshake_timeout", positive_float, "SECONDS",
     "time for the TLS handshake, and for writing the WebSocket upgrade"),
    ("--ws-auth-timeout", "ws_auth_timeout", positive_float, "SECONDS",
     "a WebSocket without an authenticated session for this long is closed (1008)"),
    ("--ws-heartbeat", "ws_heartbeat", positive_float, "SECONDS",
     "WebSocket ping interval; a connection whose pong is missing is closed"),
)  # fmt: skip


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any known extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _LOG_FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError("expected HOST:PORT, e.g. 127.0.0.1:8787")
    return host.strip("[]"), int(port)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="relay_command", metavar="SUBCOMMAND", required=True)
    serve = subcommand(
        sub,
        "serve",
        help="serve the Meshline base-module methods over HTTP(S) and WebSocket JSON-RPC",
        description=(
            "Serve a Meshline Protocol 1.0 relay that keeps per-account message timelines.\n\n"
            "HTTP methods live under --base-path (method dots become slashes); the WebSocket\n"
            "JSON-RPC endpoint is the base path itself; /metrics (Prometheus) and /health sit\n"
            "at the root. Runs standalone: no on-chain registry and no relay DHT; the relay is\n"
            "the home relay of every account that publishes its device state to it.\n"
            "It prints one JSON line on stdout once it listens and stops gracefully on\n"
            "SIGTERM or Ctrl-C (exit status 0)."
        ),
        examples=SERVE_EXAMPLES,
    )
    serve.add_argument(
        "--listen",
        type=_listen,
        default="127.0.0.1:8787",
        metavar="HOST:PORT",
        help="address to bind (plain HTTP is meant for loopback; use --tls-cert elsewhere)",
    )
    serve.add_argument(
        "--store",
        "--db",
        dest="store",
        required=True,
        type=dsn,
        metavar="DSN",
        help="the relay's database, created if missing: a SQLite file path, or a "
        "postgresql:// URL so several relay processes share timelines",
    )
    serve.add_argument(
        "--retention",
        type=positive_int,
        required=True,
        metavar="SECONDS",
        help="message_retention: how long each accepted record is kept (fixed per record at acceptance)",
    )
    _identity_flags(serve)
    serve.add_argument(
        "--public-url",
        metavar="URL",
        help="HTTPS base URL clients use (origin of sessions and auth signatures); "
        "default http(s)://HOST:PORT + base path. Give every process behind one address the same value",
    )
    serve.add_argument(
        "--base-path",
        default="/meshline/v1",
        metavar="PATH",
        help="URL path of the methods and the WebSocket endpoint",
    )
    serve.add_argument(
        "--name", default="gapline relay", metavar="NAME", help="relay name in relay.info"
    )
    serve.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS/WSS with this PEM certificate chain",
    )
    serve.add_argument("--tls-key", type=Path, metavar="FILE", help="PEM private key of --tls-cert")
    serve.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=1024 * 1024,
        metavar="N",
        help="largest HTTP body or WebSocket text frame (larger frames close 1009)",
    )
    serve.add_argument(
        "--rate",
        type=positive_float,
        default=500.0,
        metavar="PER_SECOND",
        help="request rate per verified session, and per address for calls without one "
        "(token bucket refill); excess gets rate_limited + Retry-After",
    )
    serve.add_argument(
        "--burst",
        type=positive_int,
        default=1000,
        metavar="N",
        help="per-session and per-address bucket size",
    )
    defaults = {f.name: f.default for f in dataclasses.fields(RelayConfig)}
    for flag, field, kind, metavar, text in _LIMITS:
        serve.add_argument(flag, type=kind, default=defaults[field], metavar=metavar, help=text)
    serve.add_argument(
        "--ws-queue",
        type=positive_int,
        default=256,
        metavar="N",
        help="outbound messages queued per WebSocket before its reader is paused",
    )
    serve.add_argument(
        "--cleanup-interval",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how often the retention cleanup job runs",
    )
    serve.add_argument(
        "--clock-skew",
        type=positive_int,
        default=300,
        metavar="SECONDS",
        help="tolerated client clock difference (auth timestamp, envelope created_at)",
    )
    serve.add_argument(
        "--delivery-age-limit",
        type=positive_int,
        default=7 * 86400,
        metavar="SECONDS",
        help="oldest envelope created_at accepted by message.send",
    )
    serve.add_argument(
        "--page-limit",
        type=positive_int,
        default=200,
        metavar="N",
        help="largest message.timeline.sync page",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="how long shutdown waits for in-flight requests",
    )
    serve.add_argument(
        "--p2p-listen",
        type=_listen,
        metavar="HOST:PORT",
        help="serve the libp2p TCP listener other relays reach (relay RPC); needs "
        "--registry-file; the descriptor lists it only while it is bound",
    )
    serve.add_argument(
        "--p2p-announce",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="the libp2p address the descriptor advertises instead of the bound one, "
        "/ip4|ip6|dns/HOST/tcp/PORT[/p2p/PEER_ID] (repeatable); needed when --p2p-listen "
        "binds 0.0.0.0 or ::",
    )
    serve.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="a relay to dial at start, /ip4/HOST/tcp/PORT/p2p/PEER_ID (repeatable)",
    )
    serve.add_argument(
        "--registry-file",
        type=Path,
        metavar="FILE",
        help="JSON file of signed registry records: which relays are active (docs/relay.md)",
    )
    add_log_flags(serve)
    _configure_entry(sub)


def _identity_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say which relay and network: the same in every relay subcommand."""
    parser.add_argument(
        "--network-context",
        default=DEFAULT_NETWORK_CONTEXT,
        metavar="CONTEXT",
        help="trusted network context neo:<magic>:0x<registry> (never sent on the wire); "
        "the default is the local-development value, shared by every local client",
    )
    parser.add_argument(
        "--relay-key",
        type=Path,
        metavar="FILE",
        help="the relay's P-256 private key (32 raw bytes or base64url); relay serve without "
        "it generates one into the database on first start",
    )


def _configure_entry(sub: Any) -> None:
    entry = subcommand(
        sub,
        "registry-entry",
        help="print this relay's signed registry record (for --registry-file) and Peer ID",
        description=(
            "Print one JSON line: the registry record of the relay whose key is --relay-key,\n"
            "signed by that key, and the libp2p Peer ID its listener will present. Collect\n"
            'the records of every relay of a network into {"entries": [...]}, the file\n'
            "each relay reads with --registry-file."
        ),
        examples=ENTRY_EXAMPLES,
    )
    _identity_flags(entry)
    entry.add_argument(
        "--url", required=True, metavar="URL", help="the relay's HTTPS base URL (its descriptor)"
    )
    entry.add_argument(
        "--status", default="active", metavar="STATUS", help="active, or anything else to retire it"
    )


def _registry_entry(args: argparse.Namespace) -> int:
    from gapline.meshline import AccountKey, MeshlineError, NetworkContext, b58encode, b64u_decode
    from gapline.relay._p2p._identity import PeerIdentity
    from gapline.relay._p2p._peers import sign_registry_entry

    if args.relay_key is None:
        raise CommandError("--relay-key is required: the record is signed with it", Exit.USAGE)
    if not args.relay_key.is_file():
        raise CommandError(f"--relay-key {args.relay_key}: no such file", Exit.USAGE)
    try:
        context = NetworkContext(args.network_context)
        data = args.relay_key.read_bytes()
        secret = data if len(data) == 32 else b64u_decode(data.decode().strip(), length=32)
        key = AccountKey.from_private_bytes(secret)
    except (MeshlineError, ValueError) as exc:
        raise CommandError(f"--relay-key / --network-context: {exc}", Exit.USAGE) from None
    entry = sign_registry_entry(key, args.url, context, status=args.status)
    peer = b58encode(PeerIdentity.from_relay_key(key).peer_id)
    print(json.dumps({"entry": entry, "peer_id": peer}))
    return 0


def _field_of(flag: str) -> str:
    """The argparse attribute of ``flag``: ``--ws-auth-timeout`` -> ``ws_auth_timeout``."""
    return flag.removeprefix("--").replace("-", "_")


def run(args: argparse.Namespace) -> Coroutine[None, None, int] | int:
    if args.relay_command == "registry-entry":
        return _registry_entry(args)
    from gapline.meshline import MeshlineError, NetworkContext

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    # Every logger, aiohttp's and asyncio's included, writes JSON lines: a library's
    # record must not fall through to Python's plain-text last-resort handler.
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(log_level(args))

    try:
        context = NetworkContext(args.network_context)
    except MeshlineError as exc:
        raise CommandError(f"--network-context: {exc.message}", Exit.USAGE) from None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CommandError("--tls-cert and --tls-key go together", Exit.USAGE)
    for flag, path in (
        ("--relay-key", args.relay_key),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
        ("--registry-file", args.registry_file),
    ):
        if path is not None and not path.is_file():
            raise CommandError(f"{flag} {path}: no such file", Exit.USAGE)
    if args.p2p_listen is not None and args.registry_file is None:
        raise CommandError("--p2p-listen needs --registry-file", Exit.USAGE)
    if args.bootstrap and args.p2p_listen is None:
        raise CommandError("--bootstrap needs --p2p-listen", Exit.USAGE)
    for addr in args.bootstrap:
        if "/p2p/" not in addr:
            raise CommandError(f"--bootstrap {addr}: must end in /p2p/PEER_ID", Exit.USAGE)
    host, port = args.listen
    try:
        config = RelayConfig(
            dsn=args.store,
            retention=args.retention,
            host=host,
            port=port,
            network_context=context,
            relay_key_file=args.relay_key,
            public_url=args.public_url,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            name=args.name,
            base_path=args.base_path.rstrip("/") or "/meshline/v1",
            max_request_bytes=args.max_request_bytes,
            rate_per_second=args.rate,
            rate_burst=args.burst,
            ws_queue=args.ws_queue,
            cleanup_interval=args.cleanup_interval,
            clock_skew=args.clock_skew,
            delivery_age_limit=args.delivery_age_limit,
            page_limit=args.page_limit,
            shutdown_timeout=args.shutdown_timeout,
            p2p_listen=args.p2p_listen,
            p2p_announce=tuple(args.p2p_announce),
            bootstrap=tuple(args.bootstrap),
            registry_file=args.registry_file,
            **{field: getattr(args, _field_of(flag)) for flag, field, *_ in _LIMITS},
        )
    except ValueError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
    return _serve(config, args)


async def _serve(config: RelayConfig, args: argparse.Namespace) -> int:
    from gapline.meshline import MeshlineError
    from gapline.relay._server import RelayServer
    from gapline.storage import StorageError

    log = logging.getLogger("gapline.relay")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    started = False
    try:
        async with RelayServer.start(config) as server:
            started = True
            # One line on stdout that scripts (and tests) can wait for.
            print(json.dumps({"listening": server.describe()}), flush=True)
            await stop.wait()
            log.info("shutting down")
    except StorageError as exc:
        if not started:
            raise CommandError(f"cannot open --store {args.store}: {exc}", Exit.STORE) from None
        raise CommandError(f"the database failed: {exc}") from None
    except (MeshlineError, ValueError) as exc:
        if started or args.relay_key is None:
            raise
        raise CommandError(
            f"--relay-key {args.relay_key} is not a P-256 key (32 raw bytes or base64url "
            f"text): {exc}",
            Exit.USAGE,
        ) from None
    except OSError as exc:
        if started:
            raise CommandError(str(exc)) from None
        raise CommandError(f"cannot serve on {args.listen[0]}:{args.listen[1]}: {exc}") from None
    return 0
