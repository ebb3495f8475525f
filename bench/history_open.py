"""Benchmark: opening a room with 1,000 and 1,000,000 retained encrypted events, and sync
ingestion throughput.

Prints one JSON object on stdout (progress on stderr):

- ``open_ms_<n>`` (``open_ms_min_<n>``): median (best) of 15 times from ``OpenRoom`` to its
  ``TimelineReset`` being published, each in a freshly opened engine, for a room retaining
  ``n`` events (target < 20 ms at both sizes, 1M within 2x of 1k);
- ``open_ratio``: the large size over the small one;
- ``ingest_events_per_s``: ``n_ingest`` events committed through ``Engine.ingest`` in
  syncs of ``batch`` events each, sealed and hashed (target >= 50,000/s);
- ``ingest_cpu_events_per_s``: the same over the process's CPU time (wall time on a
  shared machine includes other work);
- ``generate_events_per_s``: how fast the large store was built (bulk appends through
  ``Sections.ingest_sync``, one transaction per 10,000 events);
- ``loadavg``: ``/proc/loadavg`` at the end (the machine may be shared).

``--quick`` uses 1,000 / 20,000 retained and 10,000 ingested events; ``--ingest-only``
skips the open figures (repeat the ingestion run cheaply).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gapline.history import Engine, OpenRoom, TimelineReset
from gapline.history._cache_store import CacheStore
from gapline.history._sections import Sections
from gapline.matrix import ClientEvent, SyncResponse
from gapline.matrix._responses import JoinedRoom, Rooms
from gapline.matrix._responses import Timeline as SyncTimeline
from gapline.storage import KdfParams, open_backend, open_cipher

ROOM = "!bench:example.org"


def make_events(start: int, count: int, room: str = ROOM) -> list[ClientEvent]:
    return [
        ClientEvent(
            event_id=f"$e{i}-{room}",
            type="m.room.message",
            sender="@bench:example.org",
            origin_server_ts=1_700_000_000_000 + i,
            content={"msgtype": "m.text", "body": f"message number {i} with a little text"},
        )
        for i in range(start, start + count)
    ]


def _loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


class ResetClock:
    """An EventSink noting when each TimelineReset is published."""

    def __init__(self) -> None:
        self.at: float | None = None

    async def publish(self, event: object) -> None:
        if isinstance(event, TimelineReset) and self.at is None:
            self.at = time.perf_counter()


async def build_store(path: Path, n: int) -> float:
    backend = await open_backend(str(path / "history.sqlite3"))
    cipher = await open_cipher(backend, "bench", kdf_cost=KdfParams.cheap())
    store = await CacheStore.open(backend, cipher)
    t0 = time.perf_counter()
    step = 10_000
    for start in range(0, n, step):
        events = make_events(start, min(step, n - start))

        def op(tx, events=events, first=start == 0):
            sections = Sections(store, tx, ROOM)
            sections.ingest_sync(events, limited=first, prev_batch="t0" if first else None)

        await backend.write(op)
        if start and start % 200_000 == 0:
            log(f"  built {start} events")
    elapsed = time.perf_counter() - t0
    await backend.close()
    return n / elapsed


async def time_open(path: Path, repeats: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeats):
        clock = ResetClock()
        async with Engine.open(
            path, None, passphrase="bench", sink=clock, sync=False, kdf_cost=KdfParams.cheap()
        ) as engine:
            t0 = time.perf_counter()
            await engine.execute(OpenRoom(ROOM))
            assert clock.at is not None
            samples.append((clock.at - t0) * 1000)
            assert len(engine.timeline(ROOM).state.items) >= 100
    return statistics.median(samples), min(samples)


async def time_ingest(path: Path, total: int, batch: int) -> tuple[float, float]:
    async with Engine.open(
        path, None, passphrase="bench", sync=False, kdf_cost=KdfParams.cheap()
    ) as engine:
        responses = []
        for k, start in enumerate(range(0, total, batch)):
            timeline = SyncTimeline(events=make_events(start, batch, "!ingest:example.org"))
            responses.append(
                SyncResponse(
                    next_batch=f"s{k}",
                    rooms=Rooms(join={"!ingest:example.org": JoinedRoom(timeline=timeline)}),
                )
            )
        t0, c0 = time.perf_counter(), time.process_time()
        for response in responses:
            await engine.ingest(response)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return total / wall, total / cpu


async def main(quick: bool, ingest_only: bool = False) -> dict[str, Any]:
    small, large = (1_000, 20_000) if quick else (1_000, 1_000_000)
    n_ingest, batch = (10_000, 1_000) if quick else (100_000, 1_000)
    figures: dict[str, Any] = {"quick": quick, "small": small, "large": large}
    with tempfile.TemporaryDirectory() as tmp:
        for n in () if ingest_only else (small, large):
            store = Path(tmp) / f"open{n}"
            log(f"building a store of {n} events")
            rate = await build_store(store, n)
            if n == large:
                figures["generate_events_per_s"] = round(rate)
            log(f"opening it ({n})")
            median, best = await time_open(store, 15)
            figures[f"open_ms_{n}"] = round(median, 3)
            figures[f"open_ms_min_{n}"] = round(best, 3)
        if not ingest_only:
            figures["open_ms_small"] = figures[f"open_ms_{small}"]
            figures["open_ms_large"] = figures[f"open_ms_{large}"]
            figures["open_ratio"] = round(figures["open_ms_large"] / figures["open_ms_small"], 3)
        log(f"ingesting {n_ingest} events")
        figures["ingest_events"] = n_ingest
        figures["ingest_batch"] = batch
        rate, cpu_rate = await time_ingest(Path(tmp) / "ingest", n_ingest, batch)
        figures["ingest_events_per_s"] = round(rate)
        # Events per second of this process's CPU (both threads): the figure on a quiet
        # machine, where wall time is not shared with other work.
        figures["ingest_cpu_events_per_s"] = round(cpu_rate)
    figures["loadavg"] = _loadavg()
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument(
        "--ingest-only", action="store_true", help="only the ingestion figures (no 1M store)"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick, args.ingest_only))))
