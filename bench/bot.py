"""Benchmark: the echo bot end to end against a real Synapse.

Closed loop: S concurrent senders, each in its own room with the bot, send a
message, wait until the bot's final answer is acknowledged, and send the next.
Every journal transaction the bot makes is timed (a wrapper around the
principal-bound journal), and attributed to the answer it served.

Figures (one JSON object on stdout; progress on stderr):

- ``answers_per_s``: acknowledged final answers per wall-clock second;
- ``e2e_ms``: sender's PUT start to the final answer's acknowledgement;
- ``journal_ms``: the summed duration of that answer's journal transactions
  (admit, begin_turn, enqueues, claims, acknowledgements, record_result, turn
  reads); ``homeserver_and_wait_ms`` is the rest (sync delivery, sends, queueing);
- ``admission_to_enqueue_ms`` / ``claim_to_ack_ms``: the two spans the issue
  names (wall time), each next to the journal's own part of it;
- ``journal_share``: median and p95 of journal_ms / e2e_ms; target < 0.10.

    python bench/bot.py [--quick] [--senders 20] [--messages 10] [--store DSN]
                        [--homeserver URL]   # reuse a running open-registration Synapse
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from gapline.journal import (
    Bot,
    BotConfig,
    Delivery,
    DeliveryRequest,
    DeliveryStage,
    InboundEvent,
    JournalStore,
    PrincipalJournal,
    echo,
)
from gapline.matrix import MatrixClient
from gapline.matrix.devserver import SynapseServer


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Answer:
    sent_at: float = 0.0
    admit_start: float | None = None
    enqueue_final_end: float | None = None
    claim_final_start: float | None = None
    ack_final_end: float | None = None
    journal_s: float = 0.0
    journal_admit_to_enqueue_s: float = 0.0
    journal_claim_to_ack_s: float = 0.0
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Timings:
    def __init__(self) -> None:
        self.answers: dict[str, Answer] = defaultdict(Answer)
        self.ops: dict[str, list[float]] = defaultdict(list)

    def add(self, turn_id: str, started: float, ended: float, *, span: str | None = None) -> None:
        answer = self.answers[turn_id]
        answer.journal_s += ended - started
        if span == "admit_to_enqueue":
            answer.journal_admit_to_enqueue_s += ended - started
        elif span == "claim_to_ack":
            answer.journal_claim_to_ack_s += ended - started


class TimedJournal:
    """Times every call the bot makes on its journal and files it under its turn."""

    def __init__(self, inner: PrincipalJournal, timings: Timings) -> None:
        self._inner = inner
        self._t = timings
        self._claimed: set[tuple[str, DeliveryStage]] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _timed(
        self, turn_id: str | None, call: Awaitable[Any], span: str | None, op: str
    ) -> Any:
        started = time.perf_counter()
        result = await call
        ended = time.perf_counter()
        self._t.ops[op].append(ended - started)
        if turn_id is not None:
            self._t.add(turn_id, started, ended, span=span)
        return result

    async def admit(self, event: InboundEvent, *, epoch: int) -> Any:
        # Keyed by event id whether or not the sender has registered it yet: sync
        # may deliver the message before the sender's PUT returns.
        answer = self._t.answers[event.event_id]
        if answer.admit_start is None:
            answer.admit_start = time.perf_counter()
        return await self._timed(
            event.event_id, self._inner.admit(event, epoch=epoch), "admit_to_enqueue", "admit"
        )

    async def begin_turn(self, source_event_id: str) -> Any:
        return await self._timed(
            source_event_id,
            self._inner.begin_turn(source_event_id),
            "admit_to_enqueue",
            "begin_turn",
        )

    async def record_result(self, turn_id: str, result: bytes) -> Any:
        return await self._timed(
            turn_id, self._inner.record_result(turn_id, result), "admit_to_enqueue", "record_result"
        )

    async def turn(self, turn_id: str) -> Any:
        return await self._timed(turn_id, self._inner.turn(turn_id), "admit_to_enqueue", "turn")

    async def enqueue(self, request: DeliveryRequest, *, settle_source: bool = False) -> Any:
        result = await self._timed(
            request.turn_id,
            self._inner.enqueue(request, settle_source=settle_source),
            "admit_to_enqueue",
            "enqueue",
        )
        if request.stage is DeliveryStage.FINAL:
            self._t.answers[request.turn_id].enqueue_final_end = time.perf_counter()
        return result

    async def claim(self, limit: int) -> Any:
        started = time.perf_counter()
        deliveries = await self._inner.claim(limit)
        ended = time.perf_counter()
        self._t.ops["claim"].append(ended - started)
        for delivery in deliveries:
            # A row still in flight is offered again by later claims; only the claim
            # that first handed it out is part of its latency.
            key = (delivery.delivery_id, delivery.stage)
            if key in self._claimed:
                continue
            self._claimed.add(key)
            final = delivery.stage is DeliveryStage.FINAL
            self._t.add(delivery.turn_id, started, ended, span="claim_to_ack" if final else None)
            if final:
                self._t.answers[delivery.turn_id].claim_final_start = started
        return deliveries

    async def acknowledge(self, delivery: Delivery, event_id: str) -> Any:
        final = delivery.stage is DeliveryStage.FINAL
        result = await self._timed(
            delivery.turn_id,
            self._inner.acknowledge(delivery, event_id),
            "claim_to_ack" if final else None,
            "acknowledge",
        )
        if final:
            answer = self._t.answers[delivery.turn_id]
            answer.ack_final_end = time.perf_counter()
            if not answer.done.done():
                answer.done.set_result(None)
        return result


class TimedBot(Bot):
    timings: Timings

    def bind(self, store: JournalStore, principal_id: str) -> PrincipalJournal:
        return cast(PrincipalJournal, TimedJournal(store.principal(principal_id), self.timings))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "p50": round(pct(ms, 0.5), 2),
        "p95": round(pct(ms, 0.95), 2),
        "mean": round(statistics.fmean(ms), 2) if ms else float("nan"),
    }


async def run(
    args: argparse.Namespace, homeserver: str, server: SynapseServer | None
) -> dict[str, Any]:
    tag = f"b{int(time.time())}"
    async with MatrixClient(homeserver) as anon:
        await anon.register(f"{tag}_bot", "password")
    bot_id = f"@{tag}_bot:{homeserver_name(homeserver, server)}"
    timings = Timings()
    scratch: str | None = None
    if args.store:
        store = args.store
    else:
        scratch = tempfile.mkdtemp(prefix="gapline-bench-")
        store = str(Path(scratch) / "journal.sqlite3")
    bot = TimedBot(
        BotConfig(
            homeserver=homeserver, user=bot_id, password="password", store=store, handler=echo
        )
    )
    bot.timings = timings
    bot_task = asyncio.create_task(bot.run())
    senders: list[MatrixClient] = []
    rooms: list[str] = []
    try:
        await asyncio.wait_for(bot.ready.wait(), 60)
        for i in range(args.senders):
            client = MatrixClient(homeserver)
            await client.register(f"{tag}_s{i}", "password")
            room = await client.create_room(preset="private_chat", invite=[bot_id])
            senders.append(client)
            rooms.append(room)
        for client, room in zip(senders, rooms, strict=True):
            while bot_id not in await client.joined_members(room):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        log(
            f"bench: {args.senders} senders x {args.messages} messages, store {store.split('@')[-1]}"
        )

        async def sender(client: MatrixClient, room: str, index: int) -> None:
            for n in range(args.messages):
                started = time.perf_counter()
                event_id = await client.send_text(room, f"sender {index} message {n}")
                answer = timings.answers[event_id]
                answer.sent_at = started
                await asyncio.wait_for(answer.done, 120)

        wall_start = time.perf_counter()
        await asyncio.gather(
            *(sender(c, r, i) for i, (c, r) in enumerate(zip(senders, rooms, strict=True)))
        )
        wall = time.perf_counter() - wall_start
    finally:
        bot_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bot_task
        for client in senders:
            await client.aclose()
        if scratch is not None:
            shutil.rmtree(scratch)  # the journal this run made for itself

    done = [a for a in timings.answers.values() if a.sent_at and a.ack_final_end is not None]
    e2e = [a.ack_final_end - a.sent_at for a in done if a.ack_final_end is not None]
    journal = [a.journal_s for a in done]
    share = [
        a.journal_s / (a.ack_final_end - a.sent_at) for a in done if a.ack_final_end is not None
    ]
    a2e = [
        a.enqueue_final_end - a.admit_start for a in done if a.enqueue_final_end and a.admit_start
    ]
    c2a = [
        a.ack_final_end - a.claim_final_start
        for a in done
        if a.ack_final_end and a.claim_final_start
    ]
    return {
        "benchmark": "bot",
        "quick": args.quick,
        "backend": "postgres" if store.startswith("postgres") else "sqlite",
        "senders": args.senders,
        "messages_per_sender": args.messages,
        "answers": len(done),
        "wall_s": round(wall, 3),
        "answers_per_s": round(len(done) / wall, 2),
        "e2e_ms": summary(e2e),
        "journal_ms": summary(journal),
        "homeserver_and_wait_ms": summary([e - j for e, j in zip(e2e, journal, strict=True)]),
        "admission_to_enqueue_ms": summary(a2e),
        "admission_to_enqueue_journal_ms": summary([a.journal_admit_to_enqueue_s for a in done]),
        "claim_to_ack_ms": summary(c2a),
        "claim_to_ack_journal_ms": summary([a.journal_claim_to_ack_s for a in done]),
        "journal_share": {"p50": round(pct(share, 0.5), 4), "p95": round(pct(share, 0.95), 4)},
        "journal_ops_ms": {
            op: summary(v) | {"calls": len(v)} for op, v in sorted(timings.ops.items())
        },
        "target_journal_share": 0.10,
        "target_met": bool(share) and pct(share, 0.5) < 0.10,
    }


def homeserver_name(homeserver: str, server: SynapseServer | None) -> str:
    return server.server_name if server is not None else "localhost"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--senders", type=int, default=None)
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument(
        "--store", default=None, help="journal DSN (default: a temporary SQLite file)"
    )
    parser.add_argument(
        "--homeserver", default=None, help="a running Synapse with open registration"
    )
    args = parser.parse_args(argv)
    args.senders = args.senders or (4 if args.quick else 20)
    args.messages = args.messages or (3 if args.quick else 10)
    server = None
    if args.homeserver is None:
        log("bench: starting Synapse")
        server = SynapseServer.start()
    try:
        homeserver = args.homeserver or (server.base_url if server is not None else "")
        result = asyncio.run(run(args, homeserver, server))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
