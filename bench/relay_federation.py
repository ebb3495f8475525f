"""Meshline relay federation: cross-relay sends against same-relay sends and a bare
libp2p round trip, send-to-notification latency across relays, route resolution.

All relays are `gapline relay serve` subprocesses on SQLite files, peered over libp2p on
loopback, sharing one signed registry file. In one run:

The three throughput arms run in ``--turns`` alternating turns (same, cross, bare, same,
...), each arm's rate taken over its own turns, so the shared machine's drift reaches all
three alike.

- ``same_relay``: ``--clients`` sender accounts on relay B send to one account on B as
  fast as B answers (each send counts at its HTTP 200: committed, ``target_accepted``).
- ``cross_relay``: ``--clients`` sender accounts on relay A send to one account on B;
  A answers ``delivering`` and delivers with ``message.deliver``. The rate counts
  deliveries B accepted, from the first send until A has seen the last
  ``target_accepted`` (A's ``meshline_relay_deliveries_total{outcome="target_accepted"}``).
- ``bare_round_trip``: this process joins as a registered relay, opens one verified libp2p
  connection to B and makes ``--clients`` concurrent relay RPC calls with a
  ``message.deliver``-sized body to a method B does not have: one stream, one frame each
  way, a JSON-RPC envelope check and an answer, no business work.
- ``per_delivery_ratio`` = cost per cross-relay delivery / (cost per bare round trip +
  cost per same-relay send on B), costs being the inverse rates (target at most 1.5).
- ``notify_latency_ms``: an account on B with a WebSocket session; an account on A sends
  one message at a time; time from the send's start to ``message.timeline.changed`` on B.
- ``route_resolution_ms``: with 3, then 10 relays, fresh routes published on the last
  relay are each resolved once from A over HTTP (``account.route.resolve``: a Kademlia
  GET over A's peers, every record verified into A's replica).

    python bench/relay_federation.py [--quick] [--clients N] [--per-client N] [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gapline.meshline import AccountKey, b64u_encode, sign_route
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account, make_send_params
from gapline.relay._p2p._host import P2pHost
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._peers import (
    FileRegistry,
    sign_registry_entry,
    verify_peer_descriptor,
)
from gapline.relay._peer_rpc import PeerCallError, call_peer
from gapline.relay.devserver import RelayProcess, free_port
from relay_clients import RawSender, Relay, log

COMMON = [
    "--network-context", str(TEST_CONTEXT),
    "--rate", "1000000", "--burst", "1000000",
    "--unauthenticated-rate", "1000000", "--unauthenticated-burst", "1000000",
    "--account-rate", "1000000", "--account-burst", "1000000",
    "--log-level", "warning",
]  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


class Net:
    def __init__(self, tmp: Path, count: int) -> None:
        self.tmp = tmp
        self.keys = [AccountKey.generate() for _ in range(count)]
        self.ports = [free_port() for _ in range(count)]
        self.bench_key = AccountKey.generate()  # this process, as a registered relay
        self.registry = tmp / "registry.json"
        entries = [
            sign_registry_entry(k, f"http://127.0.0.1:{p}/meshline/v1", TEST_CONTEXT)
            for k, p in zip(self.keys, self.ports, strict=True)
        ]
        entries.append(sign_registry_entry(self.bench_key, "http://127.0.0.1:9/x", TEST_CONTEXT))
        FileRegistry.write(self.registry, entries)
        self.procs: list[RelayProcess] = []

    def start(self, i: int) -> RelayProcess:
        key_file = self.tmp / f"relay{i}.key"
        key_file.write_text(b64u_encode(self.keys[i].private_bytes()))
        bootstrap = ["--bootstrap", self.procs[0].info["p2p"][0]] if self.procs else []
        proc = RelayProcess.start(
            str(self.tmp / f"relay{i}.db"),
            port=self.ports[i],
            extra_args=[
                *COMMON,
                "--registry-file", str(self.registry),
                "--relay-key", str(key_file),
                "--p2p-listen", "127.0.0.1:0",
                *bootstrap,
            ],
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


async def metric(proc: RelayProcess, http: aiohttp.ClientSession, name: str, labels: str) -> float:
    async with http.get(proc.url.rsplit("/meshline", 1)[0] + "/metrics") as resp:
        text = await resp.text()
    prefix = f"{name}{{{labels}}} "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


async def home(relay: Relay, account: TestAccount, revision: int = 1) -> None:
    await relay.publish(account)
    await relay.publish_profile(account, public_discovery=True)
    now = int(time.time())
    draft = sign_route(
        account.key, TEST_CONTEXT, relay_id=relay.relay_id, revision=revision,
        updated_at=now, expires_at=now + 3600,
    )  # fmt: skip
    await relay.call(
        "PUT", "account.route.publish", draft.to_wire(), await relay.account_token(account)
    )


async def senders(relay: Relay, count: int) -> list[tuple[TestAccount, str]]:
    out = []
    for _ in range(count):
        account = make_account()
        await relay.publish(account)
        out.append((account, await relay.login(account)))
    return out


async def flood(
    relay: Relay,
    clients: list[tuple[TestAccount, str]],
    to: TestAccount,
    per_client: int,
    started: float | None = None,
) -> tuple[int, float]:
    """Every client sends ``per_client`` pre-sealed messages to ``to``; (sent, seconds).

    Sealing happens first; the clock starts after it (or at ``started``, when given)."""
    bodies = [
        [
            json.dumps(make_send_params(a, to, sender_boxes=False).to_wire()).encode()
            for _ in range(per_client)
        ]
        for a, _ in clients
    ]
    sent = 0

    async def client(i: int) -> None:
        nonlocal sent
        async with RawSender(relay.url, clients[i][1]) as raw:
            for body in bodies[i]:
                await raw.call(raw.request(body))
                sent += 1

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for i in range(len(clients)):
            tg.create_task(client(i))
    return sent, time.perf_counter() - (start if started is None else started)


@contextlib.asynccontextmanager
async def bare_connection(net: Net, b: RelayProcess) -> AsyncGenerator[Any]:
    """This process as a registered relay, with one verified libp2p connection to B."""
    registry = FileRegistry(net.registry, TEST_CONTEXT)
    key = net.bench_key
    peer = PeerIdentity.from_relay_key(key)

    def descriptor() -> bytes:
        desc = {
            "$type": "meshline.relay.descriptor", "relay_id": key.relay_id(),
            "public_key": key.public_key_b64,
            "endpoints": ["http://127.0.0.1:9/x", str(TcpAddr("ip4", "127.0.0.1", 9, peer.peer_id))],
            "expires_at": int(time.time()) + 3600,
        }  # fmt: skip
        desc["relay_signature"] = key.sign_object(desc, TEST_CONTEXT, exclude=())
        return json.dumps(desc).encode()

    host = P2pHost(
        peer, descriptor,
        lambda pid, raw: verify_peer_descriptor(pid, raw, registry=registry, context=TEST_CONTEXT, now=lambda: int(time.time()))[0],
    )  # fmt: skip
    async with host.running():
        yield await host.connect(TcpAddr.parse(b.info["p2p"][0]))


async def bare_call(conn: Any, body: dict[str, Any]) -> None:
    """One relay RPC round trip that B answers without business work (no such method)."""
    try:
        await call_peer(conn, "gapline.bench.echo", body)
    except PeerCallError as exc:
        assert exc.number == -32601, exc


async def bare_turn(conn: Any, clients: int, calls: int, body: dict[str, Any]) -> tuple[int, float]:
    done = 0

    async def worker(n: int) -> None:
        nonlocal done
        for _ in range(n):
            await bare_call(conn, body)
            done += 1

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(clients):
            tg.create_task(worker(max(1, calls // clients)))
    return done, time.perf_counter() - start


async def cross_turn(
    a: Relay,
    pa: RelayProcess,
    http: aiohttp.ClientSession,
    clients: list[tuple[TestAccount, str]],
    to: TestAccount,
    per_client: int,
) -> tuple[int, float, float]:
    """(sends, seconds until B accepted the last, seconds until A answered the last)."""
    label = 'outcome="target_accepted"'
    before = await metric(pa, http, "meshline_relay_deliveries_total", label)
    start = time.perf_counter()
    sent, answered = await flood(a, clients, to, per_client, started=start)
    while True:  # polling another process's counter: no event to wait on
        done = await metric(pa, http, "meshline_relay_deliveries_total", label)
        if done - before >= sent:
            break
        await asyncio.sleep(0.05)  # each poll costs A a metrics render: not too often
    return sent, time.perf_counter() - start, answered


async def notify_latency(
    a: Relay, b: Relay, probes: int, http: aiohttp.ClientSession
) -> dict[str, Any]:
    sender, recipient = make_account(), make_account()
    await home(a, sender)
    await home(b, recipient)
    token = await a.login(sender)
    bodies = [
        make_send_params(sender, recipient, sender_boxes=False).to_wire() for _ in range(probes)
    ]
    latencies = []
    async with http.ws_connect(b.proc.ws_url, max_msg_size=0) as ws:
        next_id = 0

        async def rpc(method: str, params: Any) -> Any:
            nonlocal next_id
            next_id += 1
            await ws.send_json(
                {"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}
            )
            while True:
                msg = json.loads((await ws.receive()).data)
                if msg.get("id") == next_id:
                    return msg["result"]

        challenge = await rpc("auth.challenge", {"account": recipient.account})
        await rpc("auth.device.verify", b.verify_params(recipient, challenge["nonce"]))
        for body in bodies:
            t0 = time.perf_counter()
            await a.call("POST", "message.send", body, token)
            while True:
                msg = json.loads((await ws.receive()).data)
                if msg.get("method") == "message.timeline.changed":
                    break
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)
    return {"probes": len(latencies), "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99)}


async def resolution(a: Relay, last: Relay, count: int) -> dict[str, Any]:
    accounts = [make_account() for _ in range(count)]
    for account in accounts:
        await home(last, account)
    latencies = []
    for account in accounts:
        t0 = time.perf_counter()
        route = await a.call("GET", "account.route.resolve", {"account": account.account})
        latencies.append(time.perf_counter() - t0)
        assert route["relay_id"] == last.relay_id, route
    return {"lookups": count, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99)}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=100, help="sends per client per arm")
    parser.add_argument("--turns", type=int, default=5, help="alternating turns per arm")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--lookups", type=int, default=50)
    args = parser.parse_args()
    sizes = (3, 10)
    if args.quick:
        args.clients, args.per_client, args.probes, args.lookups, args.turns = 4, 6, 10, 5, 2
        sizes = (3, 4)
    result: dict[str, Any] = {
        "bench": "relay_federation",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "quick": args.quick,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_name:
        net = Net(Path(tmp_name), max(sizes))
        try:
            pa, pb = net.start(0), net.start(1)
            async with aiohttp.ClientSession() as http:
                a, b = Relay(pa, http), Relay(pb, http)
                bob = make_account()
                await home(b, bob)
                on_b = await senders(b, args.clients)
                on_a = await senders(a, args.clients)
                sample = make_send_params(on_a[0][0], bob, sender_boxes=False).to_wire()
                sample["signer_certificate"] = on_a[0][0].device().certificate.to_wire()
                per_turn = max(1, args.per_client // args.turns)
                same_n = cross_n = bare_n = 0
                same_s = cross_s = answered_s = bare_s = 0.0
                async with bare_connection(net, pb) as conn:
                    sequential = []
                    for _ in range(300 if not args.quick else 20):
                        t0 = time.perf_counter()
                        await bare_call(conn, sample)
                        sequential.append(time.perf_counter() - t0)
                    # Turns alternate, so drift on the shared machine hits all three arms.
                    for turn in range(args.turns):
                        log(f"turn {turn + 1}/{args.turns}: same-relay on B, A -> B, bare RPC to B")
                        n, secs = await flood(b, on_b, bob, per_turn)
                        same_n, same_s = same_n + n, same_s + secs
                        n, secs, answered = await cross_turn(a, pa, http, on_a, bob, per_turn)
                        cross_n, cross_s, answered_s = (
                            cross_n + n,
                            cross_s + secs,
                            answered_s + answered,
                        )
                        n, secs = await bare_turn(
                            conn, args.clients, args.clients * per_turn, sample
                        )
                        bare_n, bare_s = bare_n + n, bare_s + secs
                same = {
                    "sends": same_n,
                    "seconds": round(same_s, 2),
                    "sends_per_second": round(same_n / same_s, 1),
                }
                cross = {
                    "sends": cross_n, "seconds": round(cross_s, 2),
                    "deliveries_per_second": round(cross_n / cross_s, 1),
                    "accepted_by_a_per_second": round(cross_n / answered_s, 1),
                }  # fmt: skip
                bare = {
                    "calls": bare_n, "clients": args.clients, "seconds": round(bare_s, 2),
                    "calls_per_second": round(bare_n / bare_s, 1),
                    "sequential_p50_ms": pct(sequential, 0.5), "sequential_p99_ms": pct(sequential, 0.99),
                    "request_bytes": len(json.dumps(sample)),
                }  # fmt: skip
                log(f"  same {same}\n  cross {cross}\n  bare {bare}")
                cost_cross = 1 / cross["deliveries_per_second"]
                cost_bare = 1 / bare["calls_per_second"]
                cost_same = 1 / same["sends_per_second"]
                result["same_relay"] = same
                result["cross_relay"] = cross
                result["bare_round_trip"] = bare
                result["turns"] = args.turns
                result["per_delivery_ratio"] = round(cost_cross / (cost_bare + cost_same), 2)
                result["cross_over_bare"] = round(cost_cross / cost_bare, 2)
                result["cross_over_same"] = round(cost_cross / cost_same, 2)

                log("send -> notification across relays")
                result["notify_latency_ms"] = await notify_latency(a, b, args.probes, http)
                log(f"  {result['notify_latency_ms']}")

                result["route_resolution_ms"] = {}
                for size in sizes:
                    while len(net.procs) < size:
                        net.start(len(net.procs))
                    await asyncio.sleep(2.0)  # peering through the registry
                    last = Relay(net.procs[-1], http)
                    log(f"route resolution with {size} relays")
                    figures = await resolution(a, last, args.lookups)
                    result["route_resolution_ms"][str(size)] = figures
                    log(f"  {figures}")
        finally:
            net.stop()
    result["targets"] = {"per_delivery_ratio": "<= 1.5"}
    result["met"] = {"per_delivery_ratio": result["per_delivery_ratio"] <= 1.5}
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
