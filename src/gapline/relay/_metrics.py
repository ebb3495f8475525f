"""Prometheus metrics of one relay process (its own registry, so tests can run several)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["RelayMetrics"]


class RelayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "meshline_relay_requests",
            "Method calls by method and transport.",
            ["method", "transport"],
            registry=self.registry,
        )
        self.errors = Counter(
            "meshline_relay_errors",
            "Failed method calls by method and error code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "meshline_relay_request_seconds",
            "Method call latency.",
            ["method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.appends = Counter(
            "meshline_relay_timeline_appends",
            "Timeline records appended.",
            registry=self.registry,
        )
        self.cleanup_removed = Counter(
            "meshline_relay_cleanup_removed",
            "Rows removed by retention cleanup, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.cleanup_runs = Counter(
            "meshline_relay_cleanup_runs", "Retention cleanup passes.", registry=self.registry
        )
        self.ws_connections = Gauge(
            "meshline_relay_ws_connections", "Open WebSocket connections.", registry=self.registry
        )
        self.peers = Gauge(
            "meshline_relay_peers", "Verified libp2p relay connections.", registry=self.registry
        )
        self.peer_calls = Counter(
            "meshline_relay_peer_calls",
            "Relay RPC requests answered, by method and outcome.",
            ["method", "outcome"],
            registry=self.registry,
        )
        self.dht_ops = Counter(
            "meshline_relay_dht_operations",
            "Relay DHT operations, by operation and outcome.",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.route_feed_up = Gauge(
            "meshline_relay_route_feed_up",
            "1 while this process hears every route commit (PostgreSQL) and keeps route answers.",
            registry=self.registry,
        )
        self.route_feed = Counter(
            "meshline_relay_route_feed_events",
            "Route feed events: connected (LISTEN acknowledged), lost, heard (a commit's key).",
            ["event"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "meshline_relay_deliveries",
            "Cross-relay deliveries ended or retried, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.notifications = Counter(
            "meshline_relay_notifications",
            "Notifications sent to WebSocket clients.",
            ["method"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "meshline_relay_rate_limited",
            "Calls refused by the rate limiter.",
            registry=self.registry,
        )
        self.refusals_held = Counter(
            "meshline_relay_refusals_held",
            "rate_limited answers held back because the caller kept ignoring Retry-After.",
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "meshline_relay_internal_errors",
            "Unexpected exceptions answered internal_error, by transport.",
            ["transport"],
            registry=self.registry,
        )
        self.connections = Gauge(
            "meshline_relay_connections", "Open client connections.", registry=self.registry
        )
        self.connections_refused = Counter(
            "meshline_relay_connections_refused",
            "Connections closed at accept by a cap, by cap (address, total).",
            ["cap"],
            registry=self.registry,
        )
        self.timeouts = Counter(
            "meshline_relay_timeouts",
            "Connections closed by a timeout, by phase (header, body, handshake, ws_auth).",
            ["phase"],
            registry=self.registry,
        )
        self.client_disconnects = Counter(
            "meshline_relay_client_disconnects",
            "Requests whose client went away before its body or answer was through.",
            registry=self.registry,
        )
        self.malformed_http = Counter(
            "meshline_relay_malformed_http",
            "HTTP messages refused by the parser (request line, headers, framing).",
            registry=self.registry,
        )

        # Labelled children by label values: ``labels()`` costs a lock and a tuple build
        # per call, paid twice on every request otherwise.
        self._children: dict[tuple[str, ...], Any] = {}

    def request_children(self, method: str, transport: str) -> tuple[Any, Any]:
        """(requests counter, latency histogram) children for one method and transport."""
        key = (method, transport)
        pair = self._children.get(key)
        if pair is None:
            pair = (self.requests.labels(method, transport), self.latency.labels(method))
            self._children[key] = pair
        return pair

    def render(self) -> bytes:
        return generate_latest(self.registry)
