"""Benchmark: the durable send queue's local echo latency and its sustained send rate.

Prints one JSON object on stdout (progress on stderr):

- ``echo_ms_p50`` / ``echo_ms_p99``: from ``SendMessage`` being executed to its
  ``Pending`` row being published (the ``TimelineChanged`` reaching the sink), on the
  engine's own SQLite store (``synchronous=FULL``), with the worker not started so no
  request competes. ``commit_ms_p50`` / ``commit_ms_p99``: in the same run, alternating
  with the sends, one durable one-row commit through the same backend: the disk's floor.
  Target: ``echo_ms_p99 <= commit_ms_p99 + 2``; ``echo_over_commit_p99_ms`` is the
  difference.
- ``queue_sends_per_s`` / ``raw_sends_per_s`` / ``queue_slowdown``: against a real
  Synapse, the same number of messages sent through the queue (enqueued one after the
  other; the clock stops when the last answer is committed) and sent with raw
  sequential ``PUT /send`` calls, in alternating rounds of one run. Target slowdown
  (raw rate over queue rate) <= 1.2. ``null`` with ``--quick``/``--no-synapse`` or
  when Synapse cannot start.
- ``room_list_ms_p50`` / ``room_list_ms_p99``: the room list (``RoomDirectory``) taking
  one sync answer that touches 100 joined rooms (ten new messages each, names, unread
  counts) and listing the rooms again by recent activity. Target p99 < 20 ms.
- ``loadavg``: ``/proc/loadavg`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from gapline.history import Engine, Event, OpenRoom, SendMessage, TimelineChanged
from gapline.matrix import RetryPolicy
from gapline.matrix.devserver import SynapseStartError
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams

NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=3)
PASSPHRASE = "bench passphrase"


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def _loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class EchoClock:
    """A sink noting when the first diff after a mark is published."""

    def __init__(self) -> None:
        self.seen: asyncio.Event = asyncio.Event()
        self.at = 0.0

    async def publish(self, event: Event) -> None:
        if isinstance(event, TimelineChanged) and not self.seen.is_set():
            self.at = time.perf_counter()
            self.seen.set()


async def echo_latency(tmp: Path, count: int) -> dict[str, Any]:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="bench")
    clock = EchoClock()
    echo: list[float] = []
    commit: list[float] = []
    async with (
        fake.client(alice, retry=NO_RETRY) as client,
        Engine.open(
            tmp / "echo",
            client,
            passphrase=PASSPHRASE,
            sink=clock,
            sync=False,
            send=False,
            kdf_cost=KdfParams.cheap(),
        ) as engine,
    ):
        await engine.sync_once()
        await engine.execute(OpenRoom(room))
        backend = engine.store.backend
        await backend.write(
            lambda tx: tx.execute(
                "CREATE TABLE IF NOT EXISTS bench_row (id INTEGER PRIMARY KEY, v BLOB)"
            )
        )
        for i in range(count + 10):  # the first ten warm up
            clock.seen.clear()
            started = time.perf_counter()
            await engine.execute(SendMessage(room, f"message {i}"))
            await clock.seen.wait()
            took_echo = clock.at - started
            started = time.perf_counter()
            await backend.write(
                lambda tx, i=i: tx.execute(
                    "INSERT INTO bench_row (id, v) VALUES (?, ?)", (i, b"x" * 200)
                )
            )
            took_commit = time.perf_counter() - started
            if i >= 10:
                echo.append(took_echo * 1000)
                commit.append(took_commit * 1000)
    figures = {
        "echo_ms_p50": round(statistics.median(echo), 3),
        "echo_ms_p99": round(_pct(echo, 0.99), 3),
        "commit_ms_p50": round(statistics.median(commit), 3),
        "commit_ms_p99": round(_pct(commit, 0.99), 3),
        "echo_samples": len(echo),
    }
    figures["echo_over_commit_p99_ms"] = round(figures["echo_ms_p99"] - figures["commit_ms_p99"], 3)
    return figures


async def _queued_bodies(client: Any, room: str) -> set[str]:
    """Every queued message's body in the room, each checked to be there once."""
    seen: list[str] = []
    token = None
    while True:
        page = await client.messages(room, from_=token, dir="b", limit=500)
        seen.extend(
            body
            for e in page.chunk
            if isinstance(body := e.content.get("body"), str) and body.startswith("queued ")
        )
        if page.end is None:
            break
        token = page.end
    if len(seen) != len(set(seen)):
        raise SystemExit("a queued message arrived twice")
    return set(seen)


async def send_rates(tmp: Path, count: int, rounds: int) -> dict[str, Any]:
    from gapline.matrix.devserver import SynapseServer

    log("starting Synapse")
    server = await asyncio.to_thread(SynapseServer.start)
    try:
        alice = await server.register_user(server.unique_localpart("alice"), "password")
        room = await server.create_room(alice, name="bench")
        raw_rates: list[float] = []
        queue_rates: list[float] = []
        async with (
            server.client(alice, retry=NO_RETRY) as client,
            Engine.open(
                tmp / "queue",
                client,
                passphrase=PASSPHRASE,
                sync=False,
                send=True,
                kdf_cost=KdfParams.cheap(),
            ) as engine,
        ):
            await engine.sync_once()
            await engine.execute(OpenRoom(room))
            for text in ("warm raw", "warm queue"):  # connections, Synapse's caches
                await client.send_text(room, text, uuid.uuid4().hex)
            await engine.execute(SendMessage(room, "warm queue"))
            await engine.send_queue.wait_sent(1)
            sent = 1
            for r in range(rounds):
                # Alternate which goes first, so neither gets the warmer server.
                for kind in ("raw", "queue") if r % 2 == 0 else ("queue", "raw"):
                    started = time.perf_counter()
                    if kind == "raw":
                        for i in range(count):
                            await client.send_text(room, f"raw {r}.{i}", uuid.uuid4().hex)
                        raw_rates.append(count / (time.perf_counter() - started))
                        continue
                    for i in range(count):
                        await engine.execute(SendMessage(room, f"queued {r}.{i}"))
                    sent += count
                    await engine.send_queue.wait_sent(sent)
                    queue_rates.append(count / (time.perf_counter() - started))
                log(f"round {r}: raw {raw_rates[-1]:.1f}/s, queue {queue_rates[-1]:.1f}/s")
                await engine.sync_once()  # settle the echoes between rounds
            arrived = await _queued_bodies(client, room)
            expected = {f"queued {r}.{i}" for r in range(rounds) for i in range(count)}
            if arrived != expected:
                raise SystemExit(f"the queue lost or duplicated messages: {len(arrived)}")
    finally:
        await asyncio.to_thread(server.stop)
    raw, queued = statistics.median(raw_rates), statistics.median(queue_rates)
    return {
        "raw_sends_per_s": round(raw, 1),
        "queue_sends_per_s": round(queued, 1),
        "queue_slowdown": round(raw / queued, 3),
        "raw_runs": [round(x, 1) for x in raw_rates],
        "queue_runs": [round(x, 1) for x in queue_rates],
        "messages_per_round": count,
    }


def room_list_update(runs: int) -> dict[str, Any]:
    from gapline.history.rooms import RoomDirectory
    from gapline.matrix import SyncResponse

    def answer(n: int) -> SyncResponse:
        rooms = {}
        for r in range(100):
            events = [
                {
                    "event_id": f"$m{n}.{r}.{i}",
                    "type": "m.room.message",
                    "sender": f"@u{i}:bench",
                    "origin_server_ts": n * 1000 + r * 10 + i,
                    "content": {"msgtype": "m.text", "body": f"message {n}.{i} in room {r}"},
                }
                for i in range(10)
            ]
            name = {
                "event_id": f"$n{n}.{r}",
                "type": "m.room.name",
                "sender": "@u0:bench",
                "origin_server_ts": n * 1000,
                "state_key": "",
                "content": {"name": f"room {r}"},
            }
            rooms[f"!room{r}:bench"] = {
                "timeline": {"events": events},
                "state": {"events": [name]},
                "unread_notifications": {"notification_count": n, "highlight_count": n % 3},
            }
        body = {"next_batch": f"s{n}", "rooms": {"join": rooms}}
        return msgspec.json.decode(msgspec.json.encode(body), type=SyncResponse)

    answers = [answer(n) for n in range(runs + 5)]  # decoded beforehand: not the list's cost
    directory = RoomDirectory()
    took: list[float] = []
    for n, response in enumerate(answers):
        started = time.perf_counter()
        directory.observe(response)
        listed = directory.room_list()
        elapsed = time.perf_counter() - started
        assert len(listed) == 100 and listed[0].last_ts == n * 1000 + 99 * 10 + 9
        if n >= 5:
            took.append(elapsed * 1000)
    return {
        "room_list_ms_p50": round(statistics.median(took), 3),
        "room_list_ms_p99": round(_pct(took, 0.99), 3),
    }


async def main(quick: bool, with_synapse: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {"quick": quick}
    with tempfile.TemporaryDirectory(prefix="gapline-sendq-") as tmp:
        log("local echo latency")
        figures.update(await echo_latency(Path(tmp), 50 if quick else 1000))
        log("room list update")
        figures.update(room_list_update(20 if quick else 200))
        figures.update(
            {
                "raw_sends_per_s": None,
                "queue_sends_per_s": None,
                "queue_slowdown": None,
            }
        )
        if with_synapse and not quick:
            try:
                figures.update(await send_rates(Path(tmp), 200, 4))
            except SynapseStartError as exc:
                log(f"Synapse skipped: {exc}")
    figures["loadavg"] = _loadavg()
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (no Synapse)")
    parser.add_argument("--no-synapse", action="store_true", help="skip the Synapse figures")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick, not args.no_synapse))))
