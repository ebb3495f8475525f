"""The relay's configuration: what `gapline relay serve` flags set."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gapline.meshline import LOCAL_DEVELOPMENT_CONTEXT, MeshlineError, NetworkContext
from gapline.relay._p2p._multiaddr import TcpAddr

__all__ = ["DEFAULT_NETWORK_CONTEXT", "RelayConfig", "system_clock"]

# Every client of a local relay must use the same value; it is never sent on the wire.
DEFAULT_NETWORK_CONTEXT: str = LOCAL_DEVELOPMENT_CONTEXT


def system_clock() -> int:
    return int(time.time())


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """Everything a relay process needs. Times are seconds; sizes are bytes."""

    dsn: str
    retention: int
    host: str = "127.0.0.1"
    port: int = 8787
    network_context: NetworkContext = field(
        default_factory=lambda: NetworkContext(DEFAULT_NETWORK_CONTEXT)
    )
    relay_key_file: Path | None = None
    # The URL clients reach this relay at; sessions and auth signatures bind its origin.
    # Default: http://HOST:PORT (https when TLS is configured).
    public_url: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    name: str = "gapline relay"
    base_path: str = "/meshline/v1"
    # HTTP bodies and WebSocket text frames (the spec's WSS frame limit is 1 MiB).
    max_request_bytes: int = 1024 * 1024
    # Token buckets. A call with a session the relay has verified is charged to that
    # session and to its account; any other call (no token, an unknown or malformed
    # one) to its address (IPv6: its /64) and to one bucket shared by all of them.
    rate_per_second: float = 500.0  # per session, and per address
    rate_burst: int = 1000
    account_rate_per_second: float = 1000.0
    account_burst: int = 2000
    unauthenticated_rate_per_second: float = 1000.0
    unauthenticated_burst: int = 2000
    # Outstanding auth.challenge nonces (issued, neither used nor expired) per address
    # and per account; each one is a database row until it is used or expires.
    challenges_per_address: int = 256
    challenges_per_account: int = 32
    # Connections: caps, and how long each phase may take (seconds).
    max_connections: int = 4096
    max_connections_per_address: int = 256
    header_timeout: float = (
        10.0  # from connect (or the first byte of the next request) to a full head
    )
    body_timeout: float = 30.0  # to receive a whole request body
    idle_timeout: float = 60.0  # keep-alive connection with no request
    handshake_timeout: float = 10.0  # TLS handshake; WebSocket upgrade response
    ws_auth_timeout: float = 30.0  # a WebSocket without a bound session is closed (1008)
    ws_heartbeat: float = 30.0  # ping interval; no pong within half of it closes
    # Outbound messages queued per WebSocket connection before the reader is slowed down.
    ws_queue: int = 256
    # Requests handled concurrently per WebSocket connection.
    ws_inflight: int = 64
    cleanup_interval: float = 30.0
    clock_skew: int = 300
    delivery_age_limit: int = 7 * 86400
    challenge_ttl: int = 300
    session_ttl: int = 86400
    page_limit: int = 200
    descriptor_ttl: int = 86400
    shutdown_timeout: float = 10.0
    # Federation: the libp2p TCP listener (host, port), peers to dial at start, and the
    # file of signed registry records that says which relays are active.
    p2p_listen: tuple[str, int] | None = None
    # The libp2p addresses the descriptor advertises instead of the bound one (behind NAT,
    # a load balancer, or a listener on 0.0.0.0 / ::, which is no address to dial).
    p2p_announce: tuple[str, ...] = ()
    bootstrap: tuple[str, ...] = ()
    registry_file: Path | None = None
    # PUT_VALUE acknowledgements a route publication waits for (fewer when fewer peers).
    route_replicas: int = 1
    republish_interval: float = 3600.0
    peer_refresh_interval: float = 30.0
    clock: Callable[[], int] = system_clock

    def _check_p2p(self) -> None:
        if self.p2p_announce and self.p2p_listen is None:
            raise ValueError("--p2p-announce needs --p2p-listen")
        for text in self.p2p_announce:
            try:
                addr = TcpAddr.parse(text)
            except MeshlineError as exc:
                raise ValueError(f"--p2p-announce {text}: {exc.message}") from None
            if addr.host_kind in ("ip4", "ip6") and ipaddress.ip_address(addr.host).is_unspecified:
                raise ValueError(f"--p2p-announce {text}: an unspecified address is not dialable")
        if self.p2p_listen is not None and not self.p2p_announce:
            host = self.p2p_listen[0].strip("[]")
            if not host or _unspecified(host):
                raise ValueError(
                    f"--p2p-listen {host or '*'}: listening on every interface needs"
                    " --p2p-announce MULTIADDR (the address other relays dial)"
                )

    def __post_init__(self) -> None:
        self._check_p2p()
        if self.retention <= 0:
            raise ValueError("retention must be a positive number of seconds")
        if not self.base_path.startswith("/") or self.base_path.endswith("/"):
            raise ValueError("base path must start with / and not end with /")
        positive = {
            name: getattr(self, name)
            for name in (
                "rate_per_second",
                "rate_burst",
                "account_rate_per_second",
                "account_burst",
                "unauthenticated_rate_per_second",
                "unauthenticated_burst",
                "challenges_per_address",
                "challenges_per_account",
                "max_connections",
                "max_connections_per_address",
                "header_timeout",
                "body_timeout",
                "idle_timeout",
                "handshake_timeout",
                "ws_auth_timeout",
                "ws_heartbeat",
            )
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be positive")

    @property
    def url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        scheme = "https" if self.tls_cert else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{self.base_path}"

    @property
    def ws_url(self) -> str:
        url = self.url
        return ("wss" + url[5:]) if url.startswith("https") else ("ws" + url[4:])


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False  # a name: dialable as it is
