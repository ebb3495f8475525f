"""`gapline relay serve`: run a Meshline relay process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gapline.relay._config import DEFAULT_NETWORK_CONTEXT

__all__ = ["configure", "run"]

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


def _positive(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or len(value) > 15 or int(value) <= 0:
        raise argparse.ArgumentTypeError("expected a positive whole number")
    return int(value)


def _positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (0 < number < 10**9):
        raise argparse.ArgumentTypeError("expected a positive number")
    return number


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="relay_command", metavar="SUBCOMMAND", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve the Meshline base-module methods over HTTP(S) and WebSocket JSON-RPC",
        description=(
            "Serve a Meshline Protocol 1.0 relay that keeps per-account message timelines. "
            "HTTP methods live under --base-path (method dots become slashes); the WebSocket "
            "JSON-RPC endpoint is the base path itself; /metrics (Prometheus) and /health sit "
            "at the root. Runs standalone: no on-chain registry and no relay DHT; the relay is "
            "the home relay of every account that publishes its device state to it."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 8787),
        metavar="HOST:PORT",
        help="address to bind (plain HTTP is meant for loopback; use --tls-cert elsewhere)",
    )
    serve.add_argument(
        "--db",
        required=True,
        metavar="DSN",
        help="SQLite file path, or a postgresql:// URL so several relay processes share timelines",
    )
    serve.add_argument(
        "--retention",
        type=_positive,
        required=True,
        metavar="SECONDS",
        help="message_retention: how long each accepted record is kept (fixed per record at acceptance)",
    )
    serve.add_argument(
        "--network-context",
        default=DEFAULT_NETWORK_CONTEXT,
        metavar="CONTEXT",
        help="trusted network context neo:<magic>:0x<registry> (never sent on the wire); "
        "the default is the local-development value, shared by every local client",
    )
    serve.add_argument(
        "--relay-key",
        type=Path,
        metavar="FILE",
        help="the relay's P-256 private key (32 raw bytes or base64url); default: generated "
        "into the database on first start",
    )
    serve.add_argument(
        "--public-url",
        metavar="URL",
        help="HTTPS base URL clients use (origin of sessions and auth signatures); "
        "default http(s)://HOST:PORT + base path. Give every process behind one address the same value",
    )
    serve.add_argument(
        "--base-path",
        default="/meshline/v1",
        help="URL path of the methods and the WebSocket endpoint",
    )
    serve.add_argument("--name", default="gapline relay", help="relay name in relay.info")
    serve.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="serve HTTPS/WSS with this certificate chain"
    )
    serve.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    serve.add_argument(
        "--max-request-bytes",
        type=_positive,
        default=1024 * 1024,
        help="largest HTTP body or WebSocket text frame (larger frames close 1009)",
    )
    serve.add_argument(
        "--rate",
        type=_positive_number,
        default=500.0,
        metavar="PER_SECOND",
        help="request rate per verified session, and per address for calls without one "
        "(token bucket refill); excess gets rate_limited + Retry-After",
    )
    serve.add_argument(
        "--burst", type=_positive, default=1000, help="per-session and per-address bucket size"
    )
    serve.add_argument(
        "--account-rate",
        type=_positive_number,
        default=1000.0,
        metavar="PER_SECOND",
        help="request rate per account, over all its verified sessions",
    )
    serve.add_argument(
        "--account-burst", type=_positive, default=2000, help="per-account bucket size"
    )
    serve.add_argument(
        "--unauthenticated-rate",
        type=_positive_number,
        default=1000.0,
        metavar="PER_SECOND",
        help="request rate of all calls without a verified session together, every address",
    )
    serve.add_argument(
        "--unauthenticated-burst",
        type=_positive,
        default=2000,
        help="bucket size shared by all calls without a verified session",
    )
    serve.add_argument(
        "--challenges-per-address",
        type=_positive,
        default=256,
        help="outstanding auth.challenge nonces one address may hold",
    )
    serve.add_argument(
        "--challenges-per-account",
        type=_positive,
        default=32,
        help="outstanding auth.challenge nonces one account may hold",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive,
        default=4096,
        help="open connections in total (HTTP and WebSocket); more are refused with 503",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=_positive,
        default=256,
        help="open connections per client address (IPv6: per /64); more are refused with 429",
    )
    serve.add_argument(
        "--header-timeout",
        type=_positive_number,
        default=10.0,
        metavar="SECONDS",
        help="time to send a whole request head, from connecting or from the first byte of "
        "the next request on a kept-alive connection",
    )
    serve.add_argument(
        "--body-timeout",
        type=_positive_number,
        default=30.0,
        metavar="SECONDS",
        help="time to send a whole request body",
    )
    serve.add_argument(
        "--idle-timeout",
        type=_positive_number,
        default=60.0,
        metavar="SECONDS",
        help="how long a kept-alive HTTP connection may wait for its next request",
    )
    serve.add_argument(
        "--handshake-timeout",
        type=_positive_number,
        default=10.0,
        metavar="SECONDS",
        help="time for the TLS handshake, and for writing the WebSocket upgrade",
    )
    serve.add_argument(
        "--ws-auth-timeout",
        type=_positive_number,
        default=30.0,
        metavar="SECONDS",
        help="a WebSocket without an authenticated session for this long is closed (1008)",
    )
    serve.add_argument(
        "--ws-heartbeat",
        type=_positive_number,
        default=30.0,
        metavar="SECONDS",
        help="WebSocket ping interval; a connection whose pong is missing is closed",
    )
    serve.add_argument(
        "--ws-queue",
        type=_positive,
        default=256,
        help="outbound messages queued per WebSocket before its reader is paused",
    )
    serve.add_argument(
        "--cleanup-interval",
        type=_positive_number,
        default=30.0,
        metavar="SECONDS",
        help="how often the retention cleanup job runs",
    )
    serve.add_argument(
        "--clock-skew",
        type=_positive,
        default=300,
        metavar="SECONDS",
        help="tolerated client clock difference (auth timestamp, envelope created_at)",
    )
    serve.add_argument(
        "--delivery-age-limit",
        type=_positive,
        default=7 * 86400,
        metavar="SECONDS",
        help="oldest envelope created_at accepted by message.send",
    )
    serve.add_argument(
        "--page-limit", type=_positive, default=200, help="largest message.timeline.sync page"
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=_positive_number,
        default=10.0,
        metavar="SECONDS",
        help="how long shutdown waits for in-flight requests",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="threshold of the JSON log lines written to stderr",
    )


async def run(args: argparse.Namespace) -> int:
    from gapline.meshline import MeshlineError, NetworkContext
    from gapline.relay._config import RelayConfig
    from gapline.relay._server import RelayServer
    from gapline.storage import StorageError

    # Every logger, aiohttp's and asyncio's included, writes JSON lines: a library's
    # record must not fall through to Python's plain-text last-resort handler.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(args.log_level.upper())
    log = logging.getLogger("gapline.relay")

    try:
        context = NetworkContext(args.network_context)
    except MeshlineError as exc:
        print(f"gapline relay serve: --network-context: {exc.message}", file=sys.stderr)
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("gapline relay serve: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    host, port = args.listen
    config = RelayConfig(
        dsn=args.db,
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
        account_rate_per_second=args.account_rate,
        account_burst=args.account_burst,
        unauthenticated_rate_per_second=args.unauthenticated_rate,
        unauthenticated_burst=args.unauthenticated_burst,
        challenges_per_address=args.challenges_per_address,
        challenges_per_account=args.challenges_per_account,
        max_connections=args.max_connections,
        max_connections_per_address=args.max_connections_per_address,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        handshake_timeout=args.handshake_timeout,
        ws_auth_timeout=args.ws_auth_timeout,
        ws_heartbeat=args.ws_heartbeat,
        ws_queue=args.ws_queue,
        cleanup_interval=args.cleanup_interval,
        clock_skew=args.clock_skew,
        delivery_age_limit=args.delivery_age_limit,
        page_limit=args.page_limit,
        shutdown_timeout=args.shutdown_timeout,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with RelayServer.start(config) as server:
            # One line on stdout that scripts (and tests) can wait for.
            print(json.dumps({"listening": server.describe()}), flush=True)
            await stop.wait()
            log.info("shutting down")
    except (StorageError, OSError) as exc:
        print(f"gapline relay serve: {exc}", file=sys.stderr)
        return 1
    return 0
