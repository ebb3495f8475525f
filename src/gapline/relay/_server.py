"""One relay process: aiohttp app (HTTP methods, WebSocket, /metrics, /health), the
notification fan-out, the retention cleanup job, and graceful shutdown.

Lifecycle (structured): ``async with RelayServer.start(config) as server`` opens the
backend, migrates, loads or creates the relay key, binds the socket and starts its
background tasks in one TaskGroup; leaving the block stops accepting connections,
closes WebSockets (1001), lets in-flight requests and their writes finish, cancels
the background tasks and closes the backend (which waits for queued writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

from gapline.meshline import AccountKey, b64u_decode, b64u_encode
from gapline.relay._config import RelayConfig
from gapline.relay._errors import RelayFailure
from gapline.relay._guard import (
    LINGER,
    MAX_HEADERS,
    MAX_LINE,
    ConnectionGuard,
    GuardedSite,
    RelayProtocol,
    expect_continue,
    guard_middleware,
    no_such_path,
)
from gapline.relay._http import http_handler
from gapline.relay._methods import Relay
from gapline.relay._metrics import RelayMetrics
from gapline.relay._ratelimit import Admission, ChallengeQuota
from gapline.relay._store import (
    DEVICE_STATE_CHANNEL,
    TIMELINE_CHANNEL,
    AcceptedSend,
    Session,
    TimelineStore,
)
from gapline.relay._ws import WsConnection, ws_handler
from gapline.storage import Backend, BackendClosed, Dialect, StorageError, open_backend

__all__ = ["RelayServer", "load_relay_key"]

log = logging.getLogger("gapline.relay")


async def load_relay_key(store: TimelineStore, key_file: Path | None) -> AccountKey:
    """The relay's P-256 key: from ``key_file`` (32 raw bytes, or base64url text), else the
    one stored in the database, generated there on first start (race-safe across processes)."""
    if key_file is not None:
        data = await asyncio.to_thread(key_file.read_bytes)
        secret = data if len(data) == 32 else b64u_decode(data.decode().strip(), length=32)
        return AccountKey.from_private_bytes(secret)
    fresh = b64u_encode(AccountKey.generate().private_bytes())
    stored = await store.meta_get_or_set("relay_key", fresh)
    return AccountKey.from_private_bytes(b64u_decode(stored, length=32))


class RelayServer:
    def __init__(
        self, config: RelayConfig, backend: Backend, store: TimelineStore, key: AccountKey
    ) -> None:
        self.config = config
        self.backend = backend
        self.store = store
        self.relay = Relay(config, store, key)
        self.metrics = RelayMetrics()
        self.admission = Admission(
            session=(config.rate_per_second, config.rate_burst),
            account=(config.account_rate_per_second, config.account_burst),
            address=(config.rate_per_second, config.rate_burst),
            unauthenticated=(config.unauthenticated_rate_per_second, config.unauthenticated_burst),
        )
        self.challenges = ChallengeQuota(
            config.challenges_per_address, config.challenges_per_account, config.clock
        )
        self.guard = ConnectionGuard(config, self.metrics)
        self.connections: set[WsConnection] = set()
        self._by_account: dict[str, set[WsConnection]] = {}
        self._sessions: dict[str, Session] = {}
        self.relay.on_state_accepted = self._state_accepted_locally
        self.relay.on_appended = self._appended
        self.port = config.port
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self.federation: Any = None  # the Federation, when a libp2p listener is configured
        self.route_feed: Any = None  # the RouteFeed, on PostgreSQL

    # -- sessions ----------------------------------------------------------------------

    def cached_session(self, token_hash: str) -> Session | None:
        """The live session for a token hash if this process already knows it (no I/O)."""
        session = self._sessions.get(token_hash)
        return None if session is None else self._live(token_hash, session)

    async def session(self, token_hash: str) -> Session | None:
        """The live session for a token hash (cached; dropped on device-state changes)."""
        session = self._sessions.get(token_hash)
        if session is None:
            try:
                session = await self.store.accounts.get_session(token_hash)
            except BackendClosed:
                raise RelayFailure(
                    "temporarily_unavailable", "the relay is shutting down"
                ) from None
            except StorageError:
                log.exception("session lookup failed")
                raise RelayFailure("internal_error", "storage failure") from None
            if session is None:
                return None
            if len(self._sessions) > 100_000:
                self._sessions.clear()
            self._sessions[token_hash] = session
        return self._live(token_hash, session)

    def _live(self, token_hash: str, session: Session) -> Session | None:
        if session.origin != self.relay.origin:
            return None  # a token is valid only at the origin that issued it
        if session.expires_at <= self.config.clock():
            self._sessions.pop(token_hash, None)
            return None
        return session

    def _forget_sessions(self, account: str) -> None:
        for digest in [d for d, s in self._sessions.items() if s.account == account]:
            del self._sessions[digest]

    # -- connection registry -----------------------------------------------------------

    def track(self, conn: WsConnection) -> None:
        if conn.session is not None:
            self._by_account.setdefault(conn.session.account, set()).add(conn)

    def untrack(self, conn: WsConnection) -> None:
        if conn.session is not None:
            conns = self._by_account.get(conn.session.account)
            if conns is not None:
                conns.discard(conn)
                if not conns:
                    del self._by_account[conn.session.account]

    # -- notifications -----------------------------------------------------------------

    def _appended(self, accepted: AcceptedSend) -> None:
        self.metrics.appends.inc(len(accepted.appended))

    async def _state_accepted_locally(self, account: str, revision: int) -> None:
        # Same-process callers see the revocation at once; other processes learn it from
        # the device-state channel below.
        self._forget_sessions(account)
        if self.federation is not None:
            self.federation.queries.state_changed(account)

    def _timeline_changed(self, account: str, head: int) -> None:
        for conn in list(self._by_account.get(account, ())):
            if conn.session is not None and conn.session.mode == "device":
                conn.notify("message.timeline.changed", {"head": head})

    async def _device_state_changed(self, account: str, revision: int) -> None:
        self._forget_sessions(account)
        for conn in list(self._by_account.get(account, ())):
            if conn.token_hash is None or conn.session is None or conn.session.mode != "device":
                continue
            if await self.session(conn.token_hash) is None:
                conn.unbind()  # its device left the state: stop its pushes
                continue
            conn.notify("device.state.changed", {"revision": revision})

    async def _listen(self, channel: str, first: AsyncIterator[str]) -> None:
        """Fan one channel out to local connections; resubscribe if the feed fails."""
        feed: AsyncIterator[str] | None = first
        while True:
            try:
                if feed is None:
                    feed = self.backend.subscribe(channel)
                async for payload in feed:
                    await self._deliver(channel, payload)
                return
            except BackendClosed:
                return
            except StorageError:
                log.exception("notification feed failed; resubscribing", extra={"channel": channel})
                feed = None
                await asyncio.sleep(1.0)

    async def _deliver(self, channel: str, payload: str) -> None:
        account, _, number = payload.rpartition(" ")
        try:
            value = int(number)
        except ValueError:
            log.warning("malformed notification", extra={"channel": channel})
            return
        if channel == TIMELINE_CHANNEL:
            self._timeline_changed(account, value)
            return
        try:
            await self._device_state_changed(account, value)
        except RelayFailure:
            log.warning("could not re-check sessions after a device-state change")

    # -- retention ---------------------------------------------------------------------

    async def cleanup_once(self) -> None:
        report = await self.store.cleanup(self.config.clock())
        self.metrics.cleanup_runs.inc()
        self.metrics.cleanup_removed.labels("records").inc(report.records)
        self.metrics.cleanup_removed.labels("visibility").inc(report.visibility_rows)
        self.metrics.cleanup_removed.labels("sends").inc(report.sends)
        if report.total:
            log.info(
                "retention cleanup",
                extra={
                    "records": report.records,
                    "visibility": report.visibility_rows,
                    "sends": report.sends,
                },
            )

    async def _cleanup_loop(self) -> None:
        while True:
            try:
                await self.cleanup_once()
            except BackendClosed:
                return
            except StorageError:
                log.exception("retention cleanup failed; retrying next interval")
            await asyncio.sleep(self.config.cleanup_interval)

    # -- HTTP app ----------------------------------------------------------------------

    def app(self) -> web.Application:
        base = self.config.base_path
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[guard_middleware(self.metrics)],
        )
        expect = expect_continue
        app.router.add_route("GET", base, ws_handler(self), expect_handler=expect)
        app.router.add_route("*", base + "/{path:.+}", http_handler(self), expect_handler=expect)
        app.router.add_route("GET", "/metrics", self._metrics_handler, expect_handler=expect)
        app.router.add_route("GET", "/health", self._health_handler, expect_handler=expect)
        app.router.add_route("*", "/{tail:.*}", no_such_path, expect_handler=expect)
        return app

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _health_handler(self, request: web.Request) -> web.Response:
        if self._stopping:
            return web.json_response({"status": "stopping"}, status=503)
        try:
            await self.store.timelines.head("health-check")
        except StorageError:
            return web.json_response({"status": "database unavailable"}, status=503)
        return web.json_response({"status": "ok", "relay_id": self.relay.relay_id})

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, config: RelayConfig, backend: Backend | None = None
    ) -> AsyncGenerator[RelayServer]:
        owned = backend is None
        if backend is None:
            backend = await open_backend(config.dsn)
        try:
            store = TimelineStore(backend, config.clock)
            await store.migrate()
            key = await load_relay_key(store, config.relay_key_file)
            server = cls(config, backend, store, key)
            async with server._serving():
                yield server
        finally:
            if owned:
                await backend.close()

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncGenerator[None]:
        ssl_context: ssl.SSLContext | None = None
        if self.config.tls_cert is not None:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        config = self.config
        runner = web.AppRunner(
            self.app(),
            access_log=None,
            shutdown_timeout=config.shutdown_timeout,
            handle_signals=False,
        )
        await runner.setup()
        self._runner = runner
        manager = runner.server
        assert manager is not None
        loop = asyncio.get_running_loop()
        self.guard.fit_descriptor_limit()

        def protocol() -> RelayProtocol:
            return RelayProtocol(
                manager,
                self.guard,
                loop=loop,
                keepalive_timeout=config.idle_timeout,
                access_log=None,
                max_line_size=MAX_LINE,
                max_field_size=MAX_LINE,
                max_headers=MAX_HEADERS,
                lingering_time=LINGER,
                # Bodies are JSON; a compressed one is refused as such, never inflated.
                auto_decompress=False,
            )

        site = GuardedSite(
            runner,
            protocol,
            config.host,
            config.port,
            ssl_context=ssl_context,
            handshake_timeout=config.handshake_timeout,
        )
        # The background tasks are owned here: created after the socket is bound, cancelled
        # and awaited on the way out. (Not a TaskGroup around the yield, so an exception in
        # the caller's block reaches it unwrapped.)
        # Subscribe before accepting requests, so no commit's notification is missed.
        timeline_feed = self.backend.subscribe(TIMELINE_CHANNEL)
        state_feed = self.backend.subscribe(DEVICE_STATE_CHANNEL)
        await site.start()
        tasks = [
            asyncio.create_task(
                self._listen(TIMELINE_CHANNEL, timeline_feed), name="relay-timeline-listener"
            ),
            asyncio.create_task(
                self._listen(DEVICE_STATE_CHANNEL, state_feed), name="relay-state-listener"
            ),
            asyncio.create_task(self._cleanup_loop(), name="relay-cleanup"),
        ]
        if self.backend.dialect is Dialect.POSTGRES:
            from gapline.relay._route_feed import RouteFeed

            # Other processes may commit routes: answers are kept only while this feed hears
            # every commit (until it first connects, none are).
            dsn = getattr(self.backend, "dsn", config.dsn)
            self.route_feed = RouteFeed(dsn, self.relay.routes, self.metrics)
            tasks.append(asyncio.create_task(self.route_feed.run(), name="relay-route-feed"))
        peers = contextlib.AsyncExitStack()
        try:
            if site.port:
                self.port = site.port
                self.relay.set_url(self.url)
            if config.p2p_listen is not None:
                from gapline.relay._federation import Federation

                self.federation = await peers.enter_async_context(
                    Federation(self.relay, config, self.metrics).running()
                )
            log.info("relay listening", extra={"url": self.url, "relay_id": self.relay.relay_id})
            yield
        finally:
            await peers.aclose()
            self._stopping = True
            for conn in list(self.connections):
                await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"relay shutting down")
            # Stops listening, then waits (up to shutdown_timeout) for in-flight handlers,
            # whose writes complete before they answer.
            await runner.cleanup()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            log.info("relay stopped")

    @property
    def url(self) -> str:
        """The HTTP base URL actually bound (port resolved when configured as 0)."""
        if self.config.public_url:
            return self.config.url
        scheme = "https" if self.config.tls_cert else "http"
        return f"{scheme}://{self.config.host}:{self.port}{self.config.base_path}"

    @property
    def ws_url(self) -> str:
        url = self.url
        return ("wss" + url[5:]) if url.startswith("https") else ("ws" + url[4:])

    def describe(self) -> dict[str, Any]:
        out = {"url": self.url, "ws_url": self.ws_url, "relay_id": self.relay.relay_id}
        if self.relay.p2p_endpoints:
            out["p2p"] = list(self.relay.p2p_endpoints)
        return out
