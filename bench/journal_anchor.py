"""The anchor for bench/journal.py: the same workload on the published ``mindroom`` journal.

Runs ONLY under the separate virtual environment ``.bench-anchor/`` (Python 3.12; mindroom
requires >= 3.12 and is never vendored here). Set it up once with::

    uv venv --python 3.12 .bench-anchor
    uv pip install --python .bench-anchor/bin/python "mindroom==2026.10.589" "psycopg[binary]"

then ``bench/journal.py`` runs this script and reports its figures beside gapline's.
Prints ONE JSON object on stdout; progress goes to stderr. The workload mirrors
bench/journal.py: sequential and 64-way concurrent admission of actionable messages,
pending pages of 500 settled one by one (then by 64 tasks), a walk of an M-message
conversation seeded directly into ``visible_messages``, and one 50-row deep page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mindroom.event_journal import (  # ty: ignore[import-not-found]
    ConversationCursor,
    EventClass,
    EventJournalStore,
    EventKind,
    InboundEvent,
    ProjectedEvent,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")
PRINCIPAL = "@bench:example.org"
ROOM = "!bench:example.org"
WALK_ROOM = "!walk:example.org"
BASE_TS = 1_700_000_000_000


def log(message: str) -> None:
    print(f"[bench/journal_anchor] {message}", file=sys.stderr, flush=True)


WARMUP = 500  # as in bench/journal.py: both columns measure a steady-size WAL


def _event(n: int, prefix: str, actionable: bool = True) -> tuple[Any, Any]:
    event_id = f"${prefix}{n:08d}:example.org"
    content = {"msgtype": "m.text", "body": f"benchmark message {n} " + "lorem ipsum " * 8}
    source = {
        "event_id": event_id,
        "room_id": ROOM,
        "sender": "@user:example.org",
        "origin_server_ts": BASE_TS + n,
        "type": "m.room.message",
        "content": content,
    }
    inbound = InboundEvent(
        event_id=event_id,
        room_id=ROOM,
        thread_id=None,
        kind=EventKind.MESSAGE,
        event_class=EventClass.ACTIONABLE if actionable else EventClass.CONTEXT_ONLY,
        sender="@user:example.org",
        origin_server_ts=BASE_TS + n,
        source=source,
    )
    projected = ProjectedEvent(
        event_id=event_id,
        room_id=ROOM,
        thread_id=None,
        sender="@user:example.org",
        origin_server_ts=BASE_TS + n,
        content=content,
        replaces_event_id=None,
        redacts_event_id=None,
    )
    return inbound, projected


async def _concurrently(
    items: list[Any], workers: int, fn: Callable[[Any], Awaitable[Any]]
) -> None:
    it = iter(items)

    async def worker() -> None:
        for item in it:
            await fn(item)

    async with asyncio.TaskGroup() as tg:
        for _ in range(workers):
            tg.create_task(worker())


def _walk_ts(i: int) -> int:
    return BASE_TS + (i // 2) * 10


async def run(
    store: Any,
    *,
    n_seq: int,
    n_conc: int,
    messages: int,
    deep_repeats: int,
    postgres: bool,
    phase: str = "all",
    warmup: int = WARMUP,
) -> dict[str, Any]:
    bot = store.principal(PRINCIPAL)
    figures: dict[str, Any] = {}
    if phase in ("all", "admission"):
        figures.update(await run_admission(bot, n_seq=n_seq, n_conc=n_conc, warmup=warmup))
    if phase in ("all", "walk"):
        figures.update(
            await run_walk(
                store, bot, messages=messages, deep_repeats=deep_repeats, postgres=postgres
            )
        )
    return figures


async def run_admission(bot: Any, *, n_seq: int, n_conc: int, warmup: int) -> dict[str, Any]:
    seq_events = [_event(i, "seq") for i in range(n_seq)]
    conc_events = [_event(i, "conc") for i in range(n_conc)]
    for i in range(warmup):
        await bot.admit(*_event(i, "warm", actionable=False))
    t0 = time.perf_counter()
    for inbound, projected in seq_events:
        await bot.admit(inbound, projected)
    t_seq = time.perf_counter() - t0
    log(f"admit sequential: {n_seq} in {t_seq:.2f}s")
    t0 = time.perf_counter()
    await _concurrently(conc_events, 64, lambda pair: bot.admit(pair[0], pair[1]))
    t_conc = time.perf_counter() - t0
    log(f"admit 64 concurrent: {n_conc} in {t_conc:.2f}s")

    t0 = time.perf_counter()
    settled = 0
    while settled < n_seq:
        page = await bot.pending(limit=500)
        if not page:
            break
        for event in page:
            if settled >= n_seq:
                break
            await bot.settle(event.event_id)
            settled += 1
    t_settle = time.perf_counter() - t0
    log(f"settle sequential: {settled} in {t_settle:.2f}s")
    t0 = time.perf_counter()
    ids: list[str] = []
    after = None
    while True:
        page = await bot.pending(limit=500, after_receipt_order=after)
        if not page:
            break
        ids.extend(e.event_id for e in page)
        after = page.resume_after
        if after is None:
            break
    await _concurrently(ids, 64, bot.settle)
    t_settle_conc = time.perf_counter() - t0
    log(f"pending+settle 64 concurrent: {len(ids)} in {t_settle_conc:.2f}s")
    return {
        "admit_sequential_per_s": round(n_seq / t_seq, 1),
        "admit_concurrent64_per_s": round(n_conc / t_conc, 1),
        "settle_sequential_per_s": round(settled / t_settle, 1),
        "settle_concurrent64_per_s": round(len(ids) / t_settle_conc, 1) if ids else None,
    }


async def run_walk(
    store: Any, bot: Any, *, messages: int, deep_repeats: int, postgres: bool
) -> dict[str, Any]:

    log(f"seeding a {messages}-message conversation")
    chunk = 50_000
    for start in range(0, messages, chunk):
        rows = [
            (
                PRINCIPAL,
                WALK_ROOM,
                f"$walk{i:08d}:example.org",
                "",
                "@user:example.org",
                _walk_ts(i),
                f"$walk{i:08d}:example.org",
                _walk_ts(i),
                json.dumps(
                    {"msgtype": "m.text", "body": f"walk message {i} lorem ipsum dolor sit amet"}
                ),
                None,
                0,
            )
            for i in range(start, min(messages, start + chunk))
        ]

        def insert(tx: Any, rows: list[tuple[Any, ...]] = rows) -> None:
            for row in rows:
                tx.execute(
                    "INSERT INTO visible_messages (principal_id, room_id, logical_event_id, thread_id,"
                    " sender, created_ts, revision_event_id, revision_ts, content_json, refresh_token,"
                    " membership_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )

        await store.backend.write(insert)
    if postgres:
        await store.backend.write(lambda tx: tx.execute("ANALYZE visible_messages"))
    t0 = time.perf_counter()
    seen = 0
    pages = 0
    cursor = None
    while True:
        page = await bot.read_conversation(
            room_id=WALK_ROOM, thread_id=None, limit=500, before=cursor
        )
        seen += len(page.messages)
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    walk = time.perf_counter() - t0
    log(f"walk: {seen} messages, {pages} pages in {walk:.2f}s")
    deep = ConversationCursor(
        created_ts=_walk_ts(50), logical_event_id=f"$walk{50:08d}:example.org"
    )
    times = []
    for _ in range(deep_repeats):
        t0 = time.perf_counter()
        page = await bot.read_conversation(room_id=WALK_ROOM, thread_id=None, limit=50, before=deep)
        times.append(time.perf_counter() - t0)
    deep_ms = statistics.median(times) * 1000
    log(f"deep page: median {deep_ms:.3f} ms ({len(page.messages)} rows)")
    return {
        "walk_messages": seen,
        "walk_pages": pages,
        "walk_seconds": round(walk, 3),
        "deep_page_ms": round(deep_ms, 3),
        "deep_page_rows": len(page.messages),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import version

    import mindroom  # ty: ignore[import-not-found]

    result: dict[str, Any] = {
        "source": f"mindroom {version('mindroom')} ({Path(mindroom.__file__).parent})"
    }
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory(prefix="gapline-bench-anchor-") as tmp:
        if "sqlite" in backends:
            log("sqlite")
            store = EventJournalStore.open_sqlite(Path(tmp) / "anchor.sqlite3")
            try:
                result["sqlite"] = await run(
                    store,
                    n_seq=args.admit,
                    n_conc=args.concurrent,
                    messages=args.messages,
                    deep_repeats=args.deep_repeats,
                    postgres=False,
                    phase=args.phase,
                    warmup=args.warmup,
                )
            finally:
                await store.backend.close()
        if "postgres" in backends:
            log("postgres")
            cluster = None
            dsn = args.postgres_dsn
            if dsn is None:
                sys.path.insert(0, SRC)
                from gapline.storage.devpostgres import start_cluster  # stdlib-only helper

                cluster = start_cluster()
                dsn = cluster.create_database()
            try:
                store = EventJournalStore.open_postgres(dsn)
                try:
                    result["postgres"] = await run(
                        store,
                        n_seq=args.admit,
                        n_conc=args.concurrent,
                        messages=args.pg_messages,
                        deep_repeats=args.deep_repeats,
                        postgres=True,
                        phase=args.phase,
                        warmup=args.warmup,
                    )
                finally:
                    await store.backend.close()
            finally:
                if cluster is not None:
                    cluster.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--postgres-dsn", default=None)
    parser.add_argument("--admit", type=int, default=3000)
    parser.add_argument("--concurrent", type=int, default=12800)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--pg-messages", type=int, default=1_000_000)
    parser.add_argument("--deep-repeats", type=int, default=200)
    parser.add_argument("--phase", choices=["all", "admission", "walk"], default="all")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
