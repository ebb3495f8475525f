"""Route answers kept in memory on PostgreSQL: every relay process hears each route commit
through its LISTEN feed, and keeps nothing while the feed may have missed one.

Against a real PostgreSQL: two `gapline relay serve` processes on one database, and the
feed itself with a recording cache (its order of suspension, LISTEN and resumption is
what makes a lost connection safe).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

from gapline.meshline import sign_route
from gapline.meshline.testing import TestAccount, make_account
from gapline.relay._route_feed import APPLICATION_NAME, RouteFeed
from gapline.relay._store import ROUTE_CHANNEL
from gapline.relay.devserver import RelayProcess
from tests.relay.harness import RelayUnderTest, remote

pytestmark = pytest.mark.postgres


def _draft(r: RelayUnderTest, account: TestAccount, revision: int) -> dict[str, Any]:
    now = r.clock()
    return sign_route(
        account.key,
        r.context,
        relay_id=r.relay_id,
        revision=revision,
        updated_at=now,
        expires_at=now + 3600,
    ).to_wire()


async def _feed_pids(dsn: str, relay_pid: int) -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (f"{APPLICATION_NAME} {relay_pid}",),
        )
        return [int(row[0]) for row in await cur.fetchall()]


async def _wait_for_feed(dsn: str, relay_pid: int, *, other_than: int | None = None) -> int:
    """The backend pid of the relay's feed connection, once it is (again) connected."""
    async with asyncio.timeout(30):
        while True:
            pids = [p for p in await _feed_pids(dsn, relay_pid) if p != other_than]
            if pids:
                return pids[0]
            await asyncio.sleep(0.05)


async def _terminate(dsn: str, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        row = await cur.fetchone()
        assert row is not None and row[0] is True


async def _feed_metrics(http: httpx.AsyncClient, proc: RelayProcess) -> dict[str, float]:
    """The relay's route feed figures: up (gauge), connected / lost / heard (counters)."""
    base = proc.url.split("/", 3)
    text = (await http.get(f"{base[0]}//{base[2]}/metrics")).text
    out: dict[str, float] = {"connected": 0, "lost": 0, "heard": 0}
    for line in text.splitlines():
        if line.startswith("meshline_relay_route_feed_up "):
            out["up"] = float(line.split()[-1])
        elif line.startswith("meshline_relay_route_feed_events_total{"):
            event = line.split('event="', 1)[1].split('"', 1)[0]
            out[event] = float(line.split()[-1])
    return out


async def _wait_metrics(
    http: httpx.AsyncClient, proc: RelayProcess, done: Callable[[dict[str, float]], bool]
) -> dict[str, float]:
    async with asyncio.timeout(30):
        while True:
            figures = await _feed_metrics(http, proc)
            if done(figures):
                return figures
            await asyncio.sleep(0.02)


async def test_a_route_committed_by_one_process_is_answered_by_the_other_once_heard(
    postgres_dsn: str, two_relays: tuple[RelayProcess, RelayProcess]
) -> None:
    first, second = two_relays
    async with httpx.AsyncClient(timeout=30) as http:
        ra, rb = (remote(p, http) for p in two_relays)
        await _wait_metrics(http, second, lambda f: f.get("up") == 1)
        alice = make_account()
        await ra.publish(alice, public=False)
        token = await ra.account_login(alice)
        query = {"account": alice.account}
        # Not found yet on B, and B keeps that answer (its feed is connected).
        assert await rb.error("account.route.resolve", query) == (404, "not_found")
        assert await rb.error("account.route.resolve", query) == (404, "not_found")
        for revision in (10, 11, 12):
            heard = (await _feed_metrics(http, second))["heard"]
            final = await ra.ok("account.route.publish", _draft(ra, alice, revision), token=token)
            # As soon as B heard A's commit (usually before the client heard of it: this
            # wait only removes the race with the notification), B answers it; the first
            # lookup reads the database, the next ones are kept answers.
            await _wait_metrics(http, second, lambda f, h=heard: f["heard"] > h)
            for _ in range(3):
                assert await rb.ok("account.route.resolve", query) == final

        # B's feed connection is killed: whatever is committed while it is away must never
        # be answered from what B kept, and nothing is kept until it listens again.
        for revision in (13, 14, 15):
            before = await _wait_metrics(http, second, lambda f: f.get("up") == 1)
            old_pid = await _wait_for_feed(postgres_dsn, second.proc.pid)
            assert await rb.ok("account.route.resolve", query) == final  # kept on B
            await _terminate(postgres_dsn, old_pid)
            await _wait_metrics(http, second, lambda f, b=before: f["lost"] > b["lost"])
            final = await ra.ok("account.route.publish", _draft(ra, alice, revision), token=token)
            assert await rb.ok("account.route.resolve", query) == final
            await _wait_metrics(
                http, second, lambda f, b=before: f["connected"] > b["connected"] and f["up"] == 1
            )
            assert await rb.ok("account.route.resolve", query) == final
        # Reconnected: B keeps answers again, and still hears A's commits.
        heard = (await _feed_metrics(http, second))["heard"]
        final = await ra.ok("account.route.publish", _draft(ra, alice, 16), token=token)
        await _wait_metrics(http, second, lambda f: f["heard"] > heard)
        for _ in range(3):
            assert await rb.ok("account.route.resolve", query) == final
        assert (await _feed_metrics(http, first))["lost"] == 0


class _Recorder:
    """A RouteCache that records what the feed told it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes]] = []
        self.changed = asyncio.Event()

    def invalidate(self, key: bytes) -> None:
        self.events.append(("invalidate", key))
        self.changed.set()

    def suspend_cache(self) -> None:
        self.events.append(("suspend", b""))
        self.changed.set()

    def resume_cache(self) -> None:
        self.events.append(("resume", b""))
        self.changed.set()

    async def wait_for(self, event: tuple[str, bytes]) -> None:
        async with asyncio.timeout(30):
            while event not in self.events:
                self.changed.clear()
                await self.changed.wait()


async def _notify(dsn: str, payload: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", (ROUTE_CHANNEL, payload))


async def test_the_feed_suspends_on_loss_and_resumes_only_after_listen(postgres_dsn: str) -> None:
    cache = _Recorder()
    feed = RouteFeed(postgres_dsn, cache)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(feed.run())
        await cache.wait_for(("resume", b""))
        assert cache.events == [("resume", b"")]
        await _notify(postgres_dsn, "aa" * 32)
        await cache.wait_for(("invalidate", b"\xaa" * 32))

        pid = await _wait_for_feed(postgres_dsn, os.getpid())
        cache.events.clear()
        await _terminate(postgres_dsn, pid)
        await cache.wait_for(("resume", b""))
        # Suspended before anything else, resumed only once LISTEN was acknowledged again
        # (a notification sent after the resumption is heard).
        assert cache.events[0] == ("suspend", b"")
        assert cache.events[-1] == ("resume", b"")
        assert feed.connects == 2
        await _notify(postgres_dsn, "bb" * 32)
        await cache.wait_for(("invalidate", b"\xbb" * 32))

        # A payload that is not a key drops everything (suspend, then resume).
        cache.events.clear()
        await _notify(postgres_dsn, "not a key")
        await cache.wait_for(("resume", b""))
        assert cache.events == [("suspend", b""), ("resume", b"")]
        task.cancel()
    # Cancelled: the cache is left suspended.
    assert cache.events[-1] == ("suspend", b"")
