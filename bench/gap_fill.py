"""Benchmark: the engine's cost of filling a gap, page by page.

Prints one JSON object on stdout (progress on stderr):

- ``fake_overhead_ms_per_page``: for a 200-event gap (four pages of 50) against the
  in-process fake homeserver, the fill's wall time minus a raw walk of the same four
  ``/messages`` pages from the same cursor, per page: what the engine adds (commits with
  sealing and hashing, timeline diffs, publishing to a mirror). Target <= 3 ms. Median
  over ``runs`` fills; ``fake_total_ms_per_page`` is the whole fill per page, and
  ``fake_overhead_cpu_ms_per_page`` the same difference in process CPU time (both
  threads), which a machine shared with other work does not inflate.
- ``bare_commit_ms_per_page``: in the same run, the same rows (the fill's 50 events per
  page, sealed beforehand, plus one gap row) committed bare through the same backend,
  one durable transaction per page: the disk's floor (fsync with ``synchronous=FULL``).
  ``fake_overhead_beyond_commit_ms_per_page`` is the overhead minus that floor (median of
  per-run differences): what the engine adds besides the durable commit. Per-run values
  are in ``*_runs``; ``loadavg`` is ``/proc/loadavg`` at the end.
- ``fake_overhead_relations_ms_per_page``: the same overhead for a gap of which 30% are
  edits, reactions and thread replies of the messages around them, in the same run
  (alternating with the plain fills); ``relations_overhead_ratio`` is it over the plain
  fill's (target <= 1.3; ``relations_overhead_cpu_ratio`` the same in process CPU time),
  and ``plain_overhead_over_bare_commit`` the plain fill's overhead over the bare durable
  commit of its rows (target <= 2);
- ``synapse_fill_ms`` / ``synapse_raw_ms`` / ``synapse_ratio``: the same fill against a
  real Synapse next to a raw ``/messages`` walk of the same four pages from the same
  cursor, in rounds against one server (a new gap each round): the medians, and each
  round's ratio in ``synapse_ratio_runs``. Target ratio <= 1.3. ``null`` when Synapse is skipped
  (``--quick`` or ``--no-synapse``) or cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from gapline.history import (
    Cancel,
    Engine,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    Mirror,
    OpenRoom,
    Publisher,
    RetryRecent,
)
from gapline.history._updates import StoredEvent
from gapline.matrix import MatrixError, MessagesResponse, RetryPolicy, api
from gapline.matrix.devserver import SynapseStartError
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams

NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=1)
GAP = 200
SYNAPSE_ROUNDS = 7


def _loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def gaps_in(engine: Engine, room: str) -> list[HistoryGapItem]:
    return [i for i in engine.timeline(room).state.items if isinstance(i, HistoryGapItem)]


async def gap_in(engine: Engine, room: str) -> HistoryGapItem:
    [gap] = gaps_in(engine, room)
    return gap


async def bare_commits(engine: Engine, room: str, events: list[StoredEvent]) -> float:
    """Milliseconds per page to durably commit the fill's own rows again, bare.

    The same backend, the same sealed rows (sealed beforehand, outside the timing), one
    transaction per page like the fill: insert the page's 50 event rows (under a scratch
    room number, so nothing collides) and rewrite one gap row, then COMMIT with
    ``synchronous=FULL``. What is left of a page's overhead above this is the engine's own.
    """
    store = engine.store
    room_key = store.room_key(room)
    scratch = 1_000_000 + secrets.randbelow(1_000_000)
    pages = [events[i : i + 50] for i in range(0, len(events), 50)]
    sealed_pages = []
    for page in pages:
        rows = []
        for stored in page:
            ek = store.event_key(stored.event_id)
            body = store.cipher.encrypt(msgspec.json.encode(stored.event), room_key + ek)
            rows.append((scratch, 0, stored.pos, ek, body))
        sealed_pages.append(rows)
    cursor = store.cipher.encrypt(b"t-cursor", room_key)
    samples = []
    for rows in sealed_pages:

        def op(tx: Any, rows: list[tuple[Any, ...]] = rows) -> None:
            tx.executemany(
                "INSERT INTO history_event (room, ord, pos, event, body) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            tx.execute(
                "INSERT INTO history_gap (room, newer_ord, gap_id, older_ord, older_boundary,"
                " newer_boundary, cursor, lifecycle) VALUES (?, 0, 'bench', NULL, NULL, ?, ?,"
                " 'Idle') ON CONFLICT (room, newer_ord) DO UPDATE SET cursor = excluded.cursor",
                (scratch, cursor, cursor),
            )

        t0 = time.perf_counter()
        await store.backend.write(op)
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.mean(samples)


def send_related(fake: FakeHomeserver, sender: str, room: str, count: int) -> None:
    """``count`` events of which 30% relate to the messages before them (an edit at every
    tenth event's offset 3, a reaction at 6, a thread reply at 9)."""
    ids: list[str] = []
    for i in range(count):
        match i % 10:
            case 3:
                content = {
                    "msgtype": "m.text",
                    "body": "* edited",
                    "m.new_content": {"msgtype": "m.text", "body": f"edited {i - 1}"},
                    "m.relates_to": {"rel_type": "m.replace", "event_id": ids[i - 1]},
                }
                ids.append(fake.send_event(sender, room, "m.room.message", content))
            case 6:
                rel = {"rel_type": "m.annotation", "event_id": ids[i - 2], "key": "👍"}
                ids.append(fake.send_event(sender, room, "m.reaction", {"m.relates_to": rel}))
            case 9:
                content = {
                    "msgtype": "m.text",
                    "body": f"reply {i}",
                    "m.relates_to": {"rel_type": "m.thread", "event_id": ids[i - 5]},
                }
                ids.append(fake.send_event(sender, room, "m.room.message", content))
            case _:
                ids.append(fake.send_text(sender, room, f"new {i}"))


async def one_fake_fill(
    store: Path,
    pages_out: list[float],
    totals: list[float],
    cpu_out: list[float],
    bare_out: list[float],
    *,
    related: bool = False,
) -> None:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, name="bench")
    fake.send_messages(alice.user_id, room, [f"old {i}" for i in range(20)])
    async with (
        fake.client(alice, retry=NO_RETRY) as client,
        Engine.open(
            store,
            client,
            passphrase="bench",
            sink=Publisher([Mirror()]),
            sync=False,
            sync_timeline_limit=10,
            kdf_cost=KdfParams.cheap(),
        ) as engine,
    ):
        await engine.sync_once()
        await engine.execute(OpenRoom(room))
        await engine.execute(HistoryRepair(RetryRecent(room)))
        if related:
            send_related(fake, alice.user_id, room, GAP + 10)
        else:
            fake.send_messages(alice.user_id, room, [f"new {i}" for i in range(GAP + 10)])
        await engine.sync_once()
        gap = await gap_in(engine, room)
        record = await engine.store.gap(room, gap.id)
        assert record is not None
        before = {e.event_id for e in await engine.store.all_events(room)}
        t0, c0 = time.perf_counter(), time.process_time()
        await engine.execute(HistoryRepair(FillGap(room, gap.id)))
        total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
        pages = GAP // 50
        # The same pages fetched raw, one after another, from the same cursor.
        t0, c0 = time.perf_counter(), time.process_time()
        token = record.cursor
        for _ in range(pages):
            page = await client.request(
                api.messages(room, from_=token, dir="b", limit=50), MessagesResponse
            )
            token = page.end
        raw, raw_cpu = time.perf_counter() - t0, time.process_time() - c0
        pages_out.append((total - raw) * 1000 / pages)
        totals.append(total * 1000 / pages)
        cpu_out.append((total_cpu - raw_cpu) * 1000 / pages)
        # The same rows, committed bare through the same backend.
        filled = [e for e in await engine.store.all_events(room) if e.event_id not in before]
        bare_out.append(await bare_commits(engine, room, filled))


async def raw_walk(client: Any, room: str, cursor: str | None) -> float:
    """Seconds to fetch the gap's pages with plain ``/messages`` calls, one after another."""
    t0 = time.perf_counter()
    token = cursor
    for _ in range(GAP // 50):
        page = await client.request(
            api.messages(room, from_=token, dir="b", limit=50), MessagesResponse
        )
        token = page.end
    return time.perf_counter() - t0


async def synapse_fill(tmp: Path, rounds: int = SYNAPSE_ROUNDS) -> dict[str, Any]:
    """``rounds`` fills of a fresh 200-event gap against one Synapse, each beside a raw walk
    of the same pages from the same cursor; the ratio is the median of the rounds' (one
    fill of four round trips moves by a third from one run to the next on this machine)."""
    from gapline.matrix.devserver import SynapseServer

    log("starting Synapse")
    server = await asyncio.to_thread(SynapseServer.start)
    fills: list[float] = []
    raws: list[float] = []
    seen: set[str] = set()
    try:
        alice = await server.register_user(server.unique_localpart("bench"))
        room = await server.create_room(alice, name="bench")
        await server.send_messages(alice, room, [f"old {i}" for i in range(20)])
        async with (
            server.client(alice, retry=NO_RETRY) as client,
            Engine.open(
                tmp / "synapse",
                client,
                passphrase="bench",
                sink=Publisher([Mirror()]),
                sync=False,
                sync_timeline_limit=10,
                kdf_cost=KdfParams.cheap(),
            ) as engine,
        ):
            await engine.sync_once()
            await engine.execute(OpenRoom(room))
            await engine.execute(HistoryRepair(Cancel(room)))
            for r in range(rounds):
                log(f"Synapse round {r + 1}/{rounds}: sending {GAP + 10} messages")
                await server.send_messages(alice, room, [f"new {r}.{i}" for i in range(GAP + 10)])
                await engine.sync_once()  # a limited sync: a new gap below its events
                [gap] = [g for g in gaps_in(engine, room) if g.id not in seen]
                seen.add(gap.id)  # an earlier round's stays where its fill paused
                record = await engine.store.gap(room, gap.id)
                assert record is not None and record.cursor is not None
                cursor = record.cursor
                # Warm both paths alike (connection, Synapse's event caches): one raw
                # walk of the same pages first, so neither side pays for a cold server.
                await raw_walk(client, room, cursor)
                t0 = time.perf_counter()
                await engine.execute(HistoryRepair(FillGap(room, gap.id)))
                fills.append(time.perf_counter() - t0)
                raws.append(await raw_walk(client, room, cursor))
        ratios = [f / r for f, r in zip(fills, raws, strict=True)]
        return {
            "synapse_fill_ms": round(statistics.median(fills) * 1000, 2),
            "synapse_raw_ms": round(statistics.median(raws) * 1000, 2),
            "synapse_ratio": round(statistics.median(ratios), 3),
            "synapse_ratio_runs": [round(x, 3) for x in ratios],
        }
    finally:
        await asyncio.to_thread(server.stop)


async def main(quick: bool, with_synapse: bool) -> dict[str, Any]:
    runs = 3 if quick else 9
    overheads: list[float] = []
    totals: list[float] = []
    cpu: list[float] = []
    bare: list[float] = []
    rel_overheads: list[float] = []
    rel_cpu: list[float] = []
    rel_unused: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(runs):
            log(f"fake fill {k + 1}/{runs} (plain, then with relations)")
            await one_fake_fill(Path(tmp) / f"fake{k}", overheads, totals, cpu, bare)
            await one_fake_fill(
                Path(tmp) / f"rel{k}", rel_overheads, rel_unused, rel_cpu, rel_unused,
                related=True,
            )  # fmt: skip
        figures: dict[str, Any] = {
            "quick": quick,
            "gap_events": GAP,
            "page_size": 50,
            "runs": runs,
            "fake_overhead_ms_per_page": round(statistics.median(overheads), 3),
            "fake_total_ms_per_page": round(statistics.median(totals), 3),
            "fake_overhead_cpu_ms_per_page": round(statistics.median(cpu), 3),
            "bare_commit_ms_per_page": round(statistics.median(bare), 3),
            "fake_overhead_beyond_commit_ms_per_page": round(
                statistics.median(o - b for o, b in zip(overheads, bare, strict=True)), 3
            ),
            "fake_overhead_ms_per_page_runs": [round(o, 3) for o in overheads],
            "fake_overhead_relations_ms_per_page": round(statistics.median(rel_overheads), 3),
            "fake_overhead_relations_ms_per_page_runs": [round(o, 3) for o in rel_overheads],
            "relations_overhead_ratio": round(
                statistics.median(rel_overheads) / statistics.median(overheads), 3
            ),
            "fake_overhead_relations_cpu_ms_per_page": round(statistics.median(rel_cpu), 3),
            "relations_overhead_cpu_ratio": round(
                statistics.median(rel_cpu) / statistics.median(cpu), 3
            ),
            "plain_overhead_over_bare_commit": round(
                statistics.median(overheads) / statistics.median(bare), 3
            ),
            "bare_commit_ms_per_page_runs": [round(b, 3) for b in bare],
            "loadavg": _loadavg(),
            "synapse_fill_ms": None,
            "synapse_raw_ms": None,
            "synapse_ratio": None,
        }
        if with_synapse:
            try:
                figures.update(await synapse_fill(Path(tmp)))
            except (SynapseStartError, MatrixError, OSError) as exc:  # reported in the figures
                log(f"Synapse part skipped: {exc}")
                figures["synapse_error"] = str(exc).splitlines()[0]
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few runs, no Synapse")
    parser.add_argument("--no-synapse", action="store_true", help="skip the Synapse part")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick, not (args.quick or args.no_synapse)))))
