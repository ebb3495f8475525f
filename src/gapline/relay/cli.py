"""`gapline relay serve`: run a Meshline relay process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gapline.relay._config import DEFAULT_NETWORK_CONTEXT

__all__ = ["configure", "run"]

_LOG_FIELDS = ("method", "url", "relay_id", "records", "visibility", "sends", "channel", "dsn")


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
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError("expected a positive whole number")
    return int(value)


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
        type=float,
        default=500.0,
        metavar="PER_SECOND",
        help="per-session request rate (token bucket refill); excess gets rate_limited + Retry-After",
    )
    serve.add_argument(
        "--burst", type=_positive, default=1000, help="per-session token bucket size"
    )
    serve.add_argument(
        "--ws-queue",
        type=_positive,
        default=256,
        help="outbound messages queued per WebSocket before its reader is paused",
    )
    serve.add_argument(
        "--cleanup-interval",
        type=float,
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
        type=float,
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

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger("gapline")
    root.handlers[:] = [handler]
    root.setLevel(args.log_level.upper())
    root.propagate = False
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
