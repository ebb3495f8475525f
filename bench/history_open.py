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
- ``open_ms_relations`` / ``open_relations_ratio``: the same open for a room retaining the
  large count of which 30% are edits, reactions and thread replies (10% each, of the plain
  messages around them), over the plain large room's in the same run (target <= 1.2);
  ``generate_relations_events_per_s`` how fast that store was built;
- ``rss_growth_mb``: the process's resident memory after scrolling an open room back
  through ``scroll_rows`` retained rows (``PaginateBackwards`` of 100, a mirror attached)
  minus before it (target < 50 MB: the window holds at most ``timeline_window`` rows);
  ``rows_held`` how many rows the timeline held at the end;
- ``loadavg``: ``/proc/loadavg`` at the end (the machine may be shared).

``--quick`` uses 1,000 / 20,000 retained, 10,000 ingested events and 5,000 scrolled
rows; ``--ingest-only`` skips the open figures (repeat the ingestion run cheaply).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gapline.history import Engine, Mirror, OpenRoom, PaginateBackwards, Publisher, TimelineReset
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


def make_related(start: int, count: int, room: str = ROOM) -> list[ClientEvent]:
    """Events of which 30% relate to the plain messages before them: every tenth event
    at offset 3 edits the one before it, at 6 reacts to the one two before, at 9 replies
    in the thread of the one five before (all targets are plain messages)."""
    out = []
    for i in range(start, start + count):
        content: dict[str, Any] = {"msgtype": "m.text", "body": f"message number {i} with text"}
        event_type = "m.room.message"
        match i % 10:
            case 3:
                content = {
                    "msgtype": "m.text",
                    "body": f"* edited {i - 1}",
                    "m.new_content": {"msgtype": "m.text", "body": f"edited {i - 1}"},
                    "m.relates_to": {"rel_type": "m.replace", "event_id": f"$e{i - 1}-{room}"},
                }
            case 6:
                event_type = "m.reaction"
                content = {
                    "m.relates_to": {
                        "rel_type": "m.annotation", "event_id": f"$e{i - 2}-{room}", "key": "👍"
                    }
                }  # fmt: skip
            case 9:
                content = {
                    "msgtype": "m.text",
                    "body": f"thread reply {i}",
                    "m.relates_to": {"rel_type": "m.thread", "event_id": f"$e{i - 5}-{room}"},
                }
        out.append(
            ClientEvent(
                event_id=f"$e{i}-{room}",
                type=event_type,
                sender="@bench:example.org",
                origin_server_ts=1_700_000_000_000 + i,
                content=content,
            )
        )
    return out


def _rss_mb() -> float:
    with contextlib.suppress(OSError):
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * 4096 / 2**20
    return float("nan")


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


async def build_store(path: Path, n: int, *, related: bool = False) -> float:
    backend = await open_backend(str(path / "history.sqlite3"))
    cipher = await open_cipher(backend, "bench", kdf_cost=KdfParams.cheap())
    store = await CacheStore.open(backend, cipher)
    t0 = time.perf_counter()
    step = 10_000
    make = make_related if related else make_events
    for start in range(0, n, step):
        events = make(start, min(step, n - start))

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


async def scroll_memory(path: Path, rows: int) -> tuple[float, int]:
    """RSS growth (MB) after scrolling back through ``rows`` retained rows, and the rows
    the timeline held at the end."""
    mirror = Mirror()
    async with Engine.open(
        path,
        None,
        passphrase="bench",
        sink=Publisher([mirror]),
        sync=False,
        kdf_cost=KdfParams.cheap(),
    ) as engine:
        await engine.execute(OpenRoom(ROOM))
        await engine.wait_idle(ROOM)  # the (offline) recent load settles first
        for _ in range(5):  # warm: caches, allocator
            await engine.execute(PaginateBackwards(ROOM, 100))
        gc.collect()
        before = _rss_mb()
        for _ in range(rows // 100):
            await engine.execute(PaginateBackwards(ROOM, 100))
        gc.collect()
        after = _rss_mb()
        held = len(engine.timeline(ROOM).state.items)
        assert len(mirror.items(ROOM) or ()) == held
    return after - before, held


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
            store = Path(tmp) / "related"
            log(f"building a store of {large} events, 30% of them relations")
            figures["generate_relations_events_per_s"] = round(
                await build_store(store, large, related=True)
            )
            log("opening it, and the plain one again (same run, side by side)")
            related, related_best = await time_open(store, 15)
            plain, _ = await time_open(Path(tmp) / f"open{large}", 15)
            figures["open_ms_relations"] = round(related, 3)
            figures["open_ms_min_relations"] = round(related_best, 3)
            figures["open_ms_plain_again"] = round(plain, 3)
            figures["open_relations_ratio"] = round(related / plain, 3)
            scroll = 5_000 if quick else 100_000
            log(f"scrolling back {scroll} rows of the related room")
            growth, held = await scroll_memory(store, scroll)
            figures["scroll_rows"] = scroll
            figures["rss_growth_mb"] = round(growth, 2)
            figures["rows_held"] = held
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
