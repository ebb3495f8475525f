"""Connections: caps at accept, the request-head timeout, and spec-shaped refusals.

aiohttp gives a keep-alive timeout (used as the idle timeout) but nothing that
stops a client trickling a request head, nothing that caps connections, and its
own refusals (a malformed request line, an over-long header, an exception that
escaped a handler) are ``text/plain`` with a traceback in the log. Here:

- :class:`RelayProtocol`, aiohttp's protocol with three additions: a connection over
  the per-address or total cap is answered at once (429 ``rate_limited`` / 503
  ``temporarily_unavailable``, ``Connection: close``) and closed; a request head
  must arrive within ``header_timeout`` of the connection opening, or of the first
  byte of the next request on a kept-alive one; and aiohttp's parser refusals are
  ``RelayError`` bodies, logged as one debug line.
- :func:`guard_middleware`: marks a request in progress for the head timer, turns
  aiohttp's HTTP exceptions into ``RelayError`` bodies and any unexpected exception
  into ``internal_error`` with an error id (see :func:`gapline.relay._rpc.unexpected`).
- :class:`GuardedSite`: the listening socket with that protocol and a TLS handshake
  timeout.

With TLS the caps count a connection once its handshake is done; handshakes are
bounded by ``handshake_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from gapline.relay._bounds import address_key
from gapline.relay._config import RelayConfig
from gapline.relay._errors import RelayFailure
from gapline.relay._http import failure_response
from gapline.relay._metrics import RelayMetrics
from gapline.relay._rpc import unexpected

__all__ = [
    "ConnectionGuard",
    "GuardedSite",
    "RelayProtocol",
    "expect_continue",
    "guard_middleware",
    "no_such_path",
]

log = logging.getLogger("gapline.relay")

# Request line (path and query) and each header line; a request may carry this many
# headers. Larger is request_too_large before the relay sees the request.
MAX_LINE = 8190
MAX_HEADERS = 64
# How long a response may wait for the rest of an unread body to drain before close.
LINGER = 2.0
# Descriptors kept free beyond the connection cap (database, logs, listening sockets).
_FD_RESERVE = 256


def _refusal(cap: str) -> bytes:
    if cap == "address":
        status = "429 Too Many Requests"
        body: dict[str, Any] = {
            "code": "rate_limited",
            "message": "too many connections from this address",
            "data": {"retry_after": 1},
        }
    else:
        status = "503 Service Unavailable"
        body = {"code": "temporarily_unavailable", "message": "too many connections"}
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


class ConnectionGuard:
    """Counts open connections per address key and in total; refuses over the caps."""

    def __init__(self, config: RelayConfig, metrics: RelayMetrics) -> None:
        self.metrics = metrics
        self.header_timeout = config.header_timeout
        self.max_total = config.max_connections
        self.max_per_address = config.max_connections_per_address
        self.total = 0
        self.by_address: Counter[str] = Counter()

    def fit_descriptor_limit(self) -> None:
        """Raise the soft descriptor limit to fit the cap, or lower the cap to fit it.

        A process that runs out of descriptors cannot even accept a connection to
        refuse it; the cap must bite first.
        """
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = self.max_total + _FD_RESERVE
        if soft != resource.RLIM_INFINITY and soft < wanted:
            target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
        if soft != resource.RLIM_INFINITY and soft < wanted:
            self.max_total = max(1, soft - _FD_RESERVE)
            log.warning(
                "descriptor limit below the connection cap; cap lowered",
                extra={"max_connections": self.max_total},
            )

    def admit(self, address: str) -> str | None:
        """None when the connection may stay, else the cap it hit."""
        if self.total >= self.max_total:
            cap = "total"
        elif self.by_address[address] >= self.max_per_address:
            cap = "address"
        else:
            self.total += 1
            self.by_address[address] += 1
            self.metrics.connections.inc()
            return None
        self.metrics.connections_refused.labels(cap).inc()
        return cap

    def release(self, address: str) -> None:
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]
        self.metrics.connections.dec()


class RelayProtocol(web.RequestHandler):
    """aiohttp's HTTP protocol, with the caps, the head timer and JSON refusals."""

    __slots__ = ("_address", "_admitted", "_busy", "_guard", "_head_timer")

    def __init__(self, manager: web.Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._address = "?"
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._busy = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._address = address_key(peer[0] if isinstance(peer, tuple) and peer else None)
        cap = self._guard.admit(self._address)
        if cap is not None:
            log.debug("connection refused", extra={"remote": self._address, "reason": cap})
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(_refusal(cap))
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._busy and self._head_timer is None:
            self._arm_head_timer()  # the first byte of the next request on this connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._cancel_head_timer()
        self._guard.release(self._address)
        super().connection_lost(exc)

    # -- the head timer ------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer = self._loop.call_later(self._guard.header_timeout, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._busy or self.transport is None:
            return
        self._guard.metrics.timeouts.labels("header").inc()
        log.debug(
            "request head not received in time; closing",
            extra={"remote": self._address, "timeout": self._guard.header_timeout},
        )
        self.force_close()

    def request_started(self) -> None:
        self._busy += 1
        self._cancel_head_timer()

    def request_finished(self) -> None:
        self._busy -= 1

    # -- aiohttp's own refusals ------------------------------------------------------

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot answer the error")
        if status >= 500:
            # Something escaped the middleware's catch-all: still one record, one id.
            try:
                raise exc or RuntimeError(message or f"HTTP {status}")
            except BaseException:  # noqa: BLE001 - re-raised only to log it with its traceback
                failure = unexpected(self._guard.metrics, "http")
        else:
            self._guard.metrics.malformed_http.inc()
            reason = message or (str(exc) if exc is not None else f"HTTP {status}")
            log.debug("malformed HTTP request", extra={"remote": self._address, "reason": reason})
            code = "request_too_large" if isinstance(exc, LineTooLong) else "bad_request"
            failure = RelayFailure(code, f"malformed HTTP request: {reason}"[:300])
        response = failure_response(failure)
        response.force_close()
        return response


def guard_middleware(metrics: RelayMetrics) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Marks requests in progress; HTTP exceptions and surprises become RelayError bodies."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        protocol = request.protocol
        guarded = isinstance(protocol, RelayProtocol)
        if guarded:
            protocol.request_started()
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return failure_response(_http_failure(exc))
        except Exception:  # noqa: BLE001 - logged with an error id by unexpected()
            return failure_response(unexpected(metrics, "http"))
        finally:
            if guarded:
                protocol.request_finished()

    return middleware


async def expect_continue(request: web.Request) -> None:
    """``Expect: 100-continue`` is answered as usual; any other expectation is ignored.

    aiohttp's own handler raises 417 for those, outside the middleware (text/plain,
    and a header value it cannot encode back made it a 500).
    """
    if request.version == (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


async def no_such_path(request: web.Request) -> web.StreamResponse:
    """Everything outside the relay's paths, so that too gets a RelayError body."""
    return failure_response(RelayFailure("not_found", "no such path"))


def _http_failure(exc: web.HTTPException) -> RelayFailure:
    if exc.status == 413:
        return RelayFailure("request_too_large", exc.reason)
    if exc.status == 404:
        return RelayFailure("not_found", "no such path")
    return RelayFailure("bad_request", exc.text or exc.reason)


class GuardedSite(web.BaseSite):
    """A TCP listener whose connections run :class:`RelayProtocol`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        handshake_timeout: float,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._factory = factory
        self._host = host
        self._port = port
        self._handshake_timeout = handshake_timeout

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        sockets = getattr(self._server, "sockets", None) or ()
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self._ssl_context is not None:
            tls = {"ssl": self._ssl_context, "ssl_handshake_timeout": self._handshake_timeout}
        self._server = await loop.create_server(
            self._factory,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
            **tls,
        )
