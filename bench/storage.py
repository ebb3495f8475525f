"""Durable single-row write throughput: 64 concurrent writers, group commit on vs off.

Runs SQLite and PostgreSQL (a throwaway cluster from the local binaries, fsync
on; group commit also with ``writers=4`` connections) in one process and prints one JSON object on stdout; progress goes to
stderr. Every write counted has *resolved*, i.e. its COMMIT returned (SQLite
``synchronous=FULL`` in WAL; PostgreSQL ``synchronous_commit=on``).

    python bench/storage.py [--quick] [--seconds S] [--writers N] [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gapline.storage import Migration, Tx, open_backend
from gapline.storage.devpostgres import DevPostgresError, start_cluster

ROWS = [
    Migration(
        1,
        "rows",
        sqlite="CREATE TABLE bench_rows (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, n INTEGER NOT NULL, body TEXT NOT NULL)",
        postgres="CREATE TABLE bench_rows (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, writer INTEGER NOT NULL, n INTEGER NOT NULL, body TEXT NOT NULL)",
    )
]
INSERT = "INSERT INTO bench_rows (writer, n, body) VALUES (?, ?, ?)"
BODY = "x" * 100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def measure(
    dsn: str, *, group_commit: bool, writers: int, seconds: float, connections: int = 1
) -> dict[str, Any]:
    opts: dict[str, Any] = {"writers": connections} if connections > 1 else {}
    backend = await open_backend(dsn, group_commit=group_commit, **opts)
    try:
        await backend.migrate("bench", ROWS)
        done = 0
        latencies: list[float] = []

        async def writer(w: int, deadline: float) -> None:
            nonlocal done
            n = 0
            clock = time.perf_counter
            while clock() < deadline:
                params = (w, n, BODY)

                def op(tx: Tx, params: tuple[int, int, str] = params) -> int:
                    return tx.execute(INSERT, params)

                start = clock()
                await backend.write(op)
                latencies.append(clock() - start)
                n += 1
            done += n

        # A short warm-up (connections, statement caches), then the measured run.
        warm = time.perf_counter() + min(0.3, seconds / 4)
        await asyncio.gather(*(writer(w, warm) for w in range(writers)))
        done, latencies = 0, []
        start = time.perf_counter()
        await asyncio.gather(*(writer(w, start + seconds) for w in range(writers)))
        elapsed = time.perf_counter() - start
        count = await backend.read(lambda tx: tx.one("SELECT count(*) FROM bench_rows"))
        assert count is not None and int(count[0]) >= done
    finally:
        await backend.close()
    latencies.sort()
    return {
        "writes": done,
        "seconds": round(elapsed, 3),
        "writes_per_s": round(done / elapsed, 1),
        "latency_ms_p50": round(latencies[len(latencies) // 2] * 1000, 3) if latencies else None,
        "latency_ms_p99": round(latencies[int(len(latencies) * 0.99)] * 1000, 3)
        if latencies
        else None,
    }


def fsync_latency_ms(directory: str, rounds: int) -> float:
    """Median time of one 4 KiB write + fsync in the benchmark's directory: the disk's floor."""
    path = os.path.join(directory, "fsync-probe")
    times = []
    with open(path, "wb") as f:
        for _ in range(rounds):
            f.write(b"\0" * 4096)
            f.flush()
            start = time.perf_counter()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - start)
    os.unlink(path)
    times.sort()
    return round(times[len(times) // 2] * 1000, 3)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 0.5 if args.quick else args.seconds
    machine: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        # The machine is shared: the load at the start says how loud the figures are.
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    result: dict[str, Any] = {
        "benchmark": "storage.durable_single_row_writes",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "writers": args.writers,
        "seconds_per_run": seconds,
        "quick": args.quick,
    }
    with tempfile.TemporaryDirectory(prefix="gapline-bench-") as tmp:
        machine["fsync_ms_p50"] = fsync_latency_ms(tmp, 20 if args.quick else 100)
        sqlite: dict[str, Any] = {}
        for group_commit in (True, False):
            label = "group_commit" if group_commit else "one_tx_per_write"
            log(f"sqlite {label} ...")
            sqlite[label] = await measure(
                str(Path(tmp) / f"{label}.db"),
                group_commit=group_commit,
                writers=args.writers,
                seconds=seconds,
            )
            log(f"  {sqlite[label]['writes_per_s']} writes/s")
        sqlite["speedup"] = round(
            sqlite["group_commit"]["writes_per_s"] / sqlite["one_tx_per_write"]["writes_per_s"], 2
        )
        result["sqlite"] = sqlite

    if args.no_postgres:
        result["postgres"] = {"skipped": "--no-postgres"}
        return result
    try:
        cluster = await asyncio.to_thread(start_cluster)
    except DevPostgresError as exc:
        result["postgres"] = {"skipped": str(exc)}
        return result
    try:
        postgres: dict[str, Any] = {}
        for group_commit in (True, False):
            label = "group_commit" if group_commit else "one_tx_per_write"
            log(f"postgres {label} ...")
            dsn = await asyncio.to_thread(cluster.create_database)
            postgres[label] = await measure(
                dsn, group_commit=group_commit, writers=args.writers, seconds=seconds
            )
            log(f"  {postgres[label]['writes_per_s']} writes/s")
        log("postgres group_commit, writers=4 connections ...")
        dsn = await asyncio.to_thread(cluster.create_database)
        postgres["group_commit_4_writers"] = await measure(
            dsn, group_commit=True, writers=args.writers, seconds=seconds, connections=4
        )
        log(f"  {postgres['group_commit_4_writers']['writes_per_s']} writes/s")
        postgres["speedup"] = round(
            postgres["group_commit"]["writes_per_s"] / postgres["one_tx_per_write"]["writes_per_s"],
            2,
        )
        with __import__("psycopg").connect(cluster.dsn()) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
        postgres["server_version"] = version[0] if version else None
        postgres["fsync"] = fsync[0] if fsync else None
        result["postgres"] = postgres
    finally:
        await asyncio.to_thread(cluster.stop)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (0.5 s per case)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per case")
    parser.add_argument("--writers", type=int, default=64, help="concurrent writers")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
