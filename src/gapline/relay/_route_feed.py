"""Route answer invalidation on PostgreSQL: every relay process on one database hears of
every route commit, or keeps no route answers at all.

Each route commit sends its key on ``ROUTE_CHANNEL`` inside its own transaction
(``Routes.commit``), so the notification exists exactly when the commit does. This feed is
one LISTEN connection of its own (psycopg's async notifications, on the relay's loop) that
drops the answer of each key it hears. LISTEN loses what is sent while its connection is
down, so trust follows the connection: the cache is dropped and bypassed the moment the
connection fails (an error, the server closing it, a heartbeat unanswered), and trusted
again only once a new connection has acknowledged LISTEN; everything kept before is dropped
again then, and a lookup that began before that point is not kept (``RouteCache``).

What remains is the delivery delay of a notification: an answer changed by another process
can be served until its notification arrives here (well under a millisecond on one host);
a connection that dies silently is noticed within ``HEARTBEAT`` plus ``HEARTBEAT_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Protocol

import psycopg
from psycopg import sql as pgsql

from gapline.relay._metrics import RelayMetrics
from gapline.relay._store import ROUTE_CHANNEL

__all__ = ["APPLICATION_NAME", "HEARTBEAT", "HEARTBEAT_TIMEOUT", "RouteCache", "RouteFeed"]

log = logging.getLogger("gapline.relay.routes")

HEARTBEAT = 1.0  # seconds without a notification before the connection is probed
HEARTBEAT_TIMEOUT = 2.0  # an unanswered probe counts as a lost connection
_BACKOFF_MAX = 2.0
# How operators (and tests) find a process's feed connection in pg_stat_activity.
APPLICATION_NAME = "gapline-route-feed"


class RouteCache(Protocol):
    """What the feed keeps coherent: ``RouteMethods``."""

    def invalidate(self, key: bytes) -> None: ...

    def suspend_cache(self) -> None: ...

    def resume_cache(self) -> None: ...


class RouteFeed:
    """One LISTEN connection keeping a ``RouteCache`` trustworthy; ``run`` until cancelled."""

    def __init__(self, dsn: str, cache: RouteCache, metrics: RelayMetrics | None = None) -> None:
        self.dsn = dsn
        self.cache = cache
        self.metrics = metrics
        self.connects = 0  # connections that reached LISTEN (the first and every reconnect)
        self.connected = asyncio.Event()  # set while the cache is trusted

    async def run(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._serve()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("route invalidation feed lost; route answers are not kept: %s", exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _serve(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            application_name=f"{APPLICATION_NAME} {os.getpid()}",
            # A peer that vanished without closing (no FIN) is found by the heartbeat; the
            # keepalives bound the probe's wait at the socket level as well.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=1,
            keepalives_count=3,
        )
        try:
            # LISTEN takes effect when its (autocommit) transaction commits, before the
            # server answers: every route commit after this point is heard.
            await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(ROUTE_CHANNEL)))
            self.connects += 1
            self.cache.resume_cache()
            self.connected.set()
            self._event("connected", 1)
            while True:
                async for note in conn.notifies(timeout=HEARTBEAT):
                    self._heard(note.payload)
                async with asyncio.timeout(HEARTBEAT_TIMEOUT):
                    await conn.execute("SELECT 1")
        finally:
            # Any way out (error, cancellation): nothing this process keeps can be trusted.
            self.connected.clear()
            self.cache.suspend_cache()
            self._event("lost", 0)
            await conn.close()

    def _event(self, event: str, up: int | None = None) -> None:
        if self.metrics is not None:
            self.metrics.route_feed.labels(event).inc()
            if up is not None:
                self.metrics.route_feed_up.set(up)

    def _heard(self, payload: str) -> None:
        self._event("heard")
        try:
            key = bytes.fromhex(payload)
        except ValueError:
            log.warning("malformed route notification; dropping every route answer")
            self.cache.suspend_cache()
            self.cache.resume_cache()
            return
        self.cache.invalidate(key)
