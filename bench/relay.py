"""Meshline relay throughput and notification latency, with Synapse as the peer anchor.

Scenarios (each a fresh database, relays run as `gapline relay serve` subprocesses):

- ``sqlite``: one relay on a SQLite file.
- ``postgres``: two relay processes on one PostgreSQL database (throwaway cluster from
  the local binaries, fsync on); clients are split between the processes.

In each, ``--clients`` sender clients (own account and device session each; first
over HTTP keep-alive, then again over one WebSocket each) send pre-sealed messages (with sender boxes, so each send appends two
timeline records) to one shared recipient account as fast as the relay answers. A
send counts once its HTTP 200 arrived, i.e. after the durable commit. Client-side
sealing is done before the clock starts, for ``--preseal-rate`` sends a second
(``presealed_exhausted`` says when the senders ran out and the rate is over the
time they were sending).

Latency probe (running during the load): a recipient with a WebSocket session on the
first process; a probe sender on the last process sends one message every
``--probe-interval`` seconds and records (a) send start -> ``message.timeline.changed``
received, (b) send start -> the following ``message.timeline.sync`` returned the record.

Contact authorization (same processes, after the sends above): every sender also sends
to a second recipient, without public discovery, carrying that recipient's
``ContactGrant``; turns of those sends alternate with turns of the plain sends to the
public recipient, and each arm's rate is taken over its own turns
(``authorization.grant_slowdown`` = plain rate / granted rate; target at most 1.3).

Route lookups: ``account.route.resolve`` of a published route (no session) in turns
alternating with ``relay.info``, the cheapest request, over the same keep-alive
connections (``route_lookup.resolve_over_info``; target at least 0.7).

Synapse: the matrix fixture's Synapse (in-memory SQLite, rate limits off), ``--clients``
users in one room each sending ``m.room.message`` as fast as Synapse answers.

Abuse (``abuse`` key): see "the relay under abuse" below.

    python bench/relay.py [--quick] [--seconds S] [--clients N] [--no-postgres] [--no-synapse]
        [--no-abuse] [--abuse-seconds S] [--slow-clients N] [--preseal-rate N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

from gapline.meshline import issue_grant, sign_route
from gapline.meshline.testing import TEST_CONTEXT, make_account, make_send_params
from gapline.relay.devserver import RelayProcess
from relay_abuse import run_abuse
from relay_clients import RawSender, Relay, cpu_seconds, log


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def run_relay_scenario(
    procs: list[RelayProcess],
    *,
    clients: int,
    seconds: float,
    probe_interval: float,
    transport: str = "http",
    preseal_rate: int = 5000,
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        relays = [Relay(p, http) for p in procs]
        recipient = make_account(1)
        senders = [make_account(1) for _ in range(clients)]
        probe_to, probe_from = make_account(1), make_account(1)
        await relays[0].publish(recipient)
        await relays[0].publish(probe_to)
        for public in (recipient, probe_to):  # anyone may write to them without a grant
            await relays[0].publish_profile(public, public_discovery=True)
        await relays[-1].publish(probe_from)
        for i, s in enumerate(senders):
            await relays[i % len(relays)].publish(s)
        tokens = [await relays[i % len(relays)].login(s) for i, s in enumerate(senders)]
        probe_token = await relays[-1].login(probe_from)
        # Pre-seal enough messages for the run (sealing is the client's cost, not the relay's):
        # room for ``preseal_rate`` sends/s. Should the senders still run out, the rate is
        # taken over the time they were sending, and the result says so (``presealed_exhausted``).
        per_client = max(50, int(seconds * preseal_rate / clients) + 50)
        log(f"  sealing {per_client * clients} messages ...")
        batches = [
            [
                json.dumps(make_send_params(s, recipient).to_wire()).encode()
                for _ in range(per_client)
            ]
            for s in senders
        ]
        raw = [RawSender(relays[i % len(relays)].url, tokens[i]) for i in range(len(senders))]
        requests = [[raw[i].request(body) for body in batch] for i, batch in enumerate(batches)]
        probes = [
            make_send_params(probe_from, probe_to).to_wire()
            for _ in range(int(seconds / probe_interval) + 20)
        ]

        done = 0
        stop_at = 0.0
        last_send_at = 0.0  # when the last sender answered its last request
        notify_lat: list[float] = []
        synced_lat: list[float] = []

        async def sender(i: int) -> None:
            nonlocal done, last_send_at
            async with raw[i] as conn:
                for request in requests[i]:
                    if time.perf_counter() >= stop_at:
                        return
                    await conn.send(request)
                    done += 1
            last_send_at = max(last_send_at, time.perf_counter())  # ran out of requests

        async def ws_sender(i: int) -> None:
            # The same sends as JSON-RPC over one WebSocket per client, one at a time.
            nonlocal done, last_send_at
            relay = relays[i % len(relays)]
            async with http.ws_connect(procs[i % len(procs)].ws_url, max_msg_size=0) as ws:
                hello = {"account": senders[i].account}
                await ws.send_json(
                    {"jsonrpc": "2.0", "id": 0, "method": "auth.challenge", "params": hello}
                )
                nonce = json.loads((await ws.receive()).data)["result"]["nonce"]
                proof = relay.verify_params(senders[i], nonce)
                await ws.send_json(
                    {"jsonrpc": "2.0", "id": 1, "method": "auth.device.verify", "params": proof}
                )
                assert "result" in json.loads((await ws.receive()).data)
                for n, params in enumerate(batches[i]):
                    if time.perf_counter() >= stop_at:
                        return
                    await ws.send_str(
                        f'{{"jsonrpc":"2.0","id":{n + 2},"method":"message.send",'
                        f'"params":{params.decode()}}}'
                    )
                    while True:
                        msg = json.loads((await ws.receive()).data)
                        if msg.get("id") == n + 2:
                            assert msg.get("result", {}).get("status") == "target_accepted", msg
                            break
                    done += 1
            last_send_at = max(last_send_at, time.perf_counter())  # ran out of requests

        async def probe() -> None:
            url = procs[0].ws_url
            async with http.ws_connect(url, max_msg_size=0) as ws:
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

                challenge = await rpc("auth.challenge", {"account": probe_to.account})
                await rpc(
                    "auth.device.verify", relays[0].verify_params(probe_to, challenge["nonce"])
                )
                position = -1
                for params in probes:
                    if time.perf_counter() >= stop_at:
                        return
                    t0 = time.perf_counter()
                    await relays[-1].call("POST", "message.send", params, probe_token)
                    while True:
                        msg = json.loads((await ws.receive()).data)
                        if msg.get("method") == "message.timeline.changed":
                            break
                    notify_lat.append(time.perf_counter() - t0)
                    page = await rpc("message.timeline.sync", {"after": position})
                    assert page["items"], page
                    position = page["items"][-1]["sequence"]
                    synced_lat.append(time.perf_counter() - t0)
                    await asyncio.sleep(probe_interval)

        pids = [p.proc.pid for p in procs]
        relay_cpu0 = sum(cpu_seconds(pid) for pid in pids)
        client_cpu0 = time.process_time()
        start = time.perf_counter()
        stop_at = start + seconds
        async with asyncio.TaskGroup() as tg:
            for i in range(clients):
                tg.create_task(ws_sender(i) if transport == "ws" else sender(i))
            tg.create_task(probe())
        elapsed = time.perf_counter() - start
        exhausted = 0.0 < last_send_at < stop_at
        if exhausted:  # the probe ran on alone after the senders' last answer
            elapsed = last_send_at - start
        relay_cpu = sum(cpu_seconds(pid) for pid in pids) - relay_cpu0
        client_cpu = time.process_time() - client_cpu0
        return {
            "transport": transport,
            "processes": len(procs),
            "clients": clients,
            "sends": done,
            "seconds": round(elapsed, 2),
            "sends_per_second": round(done / elapsed, 1),
            "presealed_exhausted": exhausted,
            # CPU seconds used during the timed phase; per send in milliseconds.
            "cpu": {
                "relay_seconds": round(relay_cpu, 2),
                "client_seconds": round(client_cpu, 2),
                "relay_ms_per_send": round(1000 * relay_cpu / max(done, 1), 3),
                "client_ms_per_send": round(1000 * client_cpu / max(done, 1), 3),
                "load_avg_1m_after": round(os.getloadavg()[0], 2),
            },
            "notify_latency_ms": {
                "p50": _pct(notify_lat, 0.5),
                "p99": _pct(notify_lat, 0.99),
                "samples": len(notify_lat),
            },
            "sync_latency_ms": {
                "p50": _pct(synced_lat, 0.5),
                "p99": _pct(synced_lat, 0.99),
                "samples": len(synced_lat),
            },
        }


async def _alternate(
    raws: list[RawSender],
    arms: dict[str, list[Iterator[bytes]]],
    *,
    seconds: float,
    slices: int,
    sends: bool,
) -> dict[str, Any]:
    """Run ``arms`` in turns of ``seconds / slices / len(arms)``: in its turn, every client
    sends the arm's next request as soon as the previous one was answered. Each arm's
    rate is taken over its own turns, so both see the same machine load."""
    counts = dict.fromkeys(arms, 0)
    spent = dict.fromkeys(arms, 0.0)
    exhausted = False
    turn = seconds / slices / len(arms)
    for k in range(slices * len(arms)):
        arm = list(arms)[k % len(arms)]
        stop_at = time.perf_counter() + turn

        async def client(i: int, arm: str = arm, stop_at: float = stop_at) -> None:
            nonlocal exhausted
            stream = arms[arm][i]
            while time.perf_counter() < stop_at:
                request = next(stream, None)
                if request is None:
                    exhausted = True
                    return
                if sends:
                    await raws[i].send(request)
                else:
                    await raws[i].call(request)
                counts[arm] += 1

        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(len(raws)):
                tg.create_task(client(i))
        spent[arm] += time.perf_counter() - start
    figures: dict[str, Any] = {
        arm: {
            "requests": counts[arm],
            "seconds": round(spent[arm], 2),
            "per_second": round(counts[arm] / spent[arm], 1),
        }
        for arm in arms
    }
    figures["exhausted"] = exhausted
    return figures


async def run_authorization_scenario(
    procs: list[RelayProcess],
    *,
    clients: int,
    seconds: float,
    slices: int = 6,
    preseal_rate: int = 4000,
) -> dict[str, Any]:
    """``message.send`` with a ``ContactGrant`` (to an account without public discovery)
    against the same send without one (to a public account), in alternating turns."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        relays = [Relay(p, http) for p in procs]
        public_to, private_to = make_account(1), make_account(1)
        for recipient, public in ((public_to, True), (private_to, False)):
            await relays[0].publish(recipient)
            await relays[0].publish_profile(recipient, public_discovery=public)
        senders = [make_account(1) for _ in range(clients)]
        for i, sender in enumerate(senders):
            await relays[i % len(relays)].publish(sender)
        tokens = [await relays[i % len(relays)].login(s) for i, s in enumerate(senders)]
        raws = [RawSender(relays[i % len(relays)].url, tokens[i]) for i in range(clients)]
        granter = private_to.device()
        per_client = max(30, int(seconds / 2 * preseal_rate / clients) + 30)
        log(f"  sealing {2 * per_client * clients} messages ...")

        def requests(i: int, *, grant: bool) -> Iterator[bytes]:
            sender = senders[i]
            material = issue_grant(
                granter.keys,
                granter.device_id,
                TEST_CONTEXT,
                grantor=private_to.account,
                grantee=sender.account,
            ).to_wire()
            made = []
            for _ in range(per_client):
                wire = make_send_params(sender, private_to if grant else public_to).to_wire()
                if grant:
                    wire["authorization"] = material
                made.append(raws[i].request(json.dumps(wire).encode()))
            return iter(made)

        arms = {
            "without_authorization": [requests(i, grant=False) for i in range(clients)],
            "with_grant": [requests(i, grant=True) for i in range(clients)],
        }
        async with contextlib.AsyncExitStack() as stack:
            for raw in raws:
                await stack.enter_async_context(raw)
            figures = await _alternate(raws, arms, seconds=seconds, slices=slices, sends=True)
    without = figures["without_authorization"]["per_second"]
    with_grant = figures["with_grant"]["per_second"]
    return {
        "clients": clients,
        "processes": len(procs),
        **figures,
        "grant_slowdown": round(without / with_grant, 3) if with_grant else None,
    }


async def _feed_up(http: aiohttp.ClientSession, proc: RelayProcess) -> bool | None:
    """Whether the process's ``meshline_relay_route_feed_up`` gauge is 1."""
    scheme, _, host = proc.url.split("/", 3)[:3]
    async with http.get(f"{scheme}//{host}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("meshline_relay_route_feed_up "):
            return float(line.split()[-1]) == 1
    return None


async def run_lookup_scenario(
    procs: list[RelayProcess], *, clients: int, seconds: float, slices: int = 6
) -> dict[str, Any]:
    """``account.route.resolve`` (no session) against ``relay.info`` (the cheapest request),
    in alternating turns over the same keep-alive connections."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        relays = [Relay(p, http) for p in procs]
        account = make_account(1)
        await relays[0].publish(account)
        now = int(time.time())
        draft = sign_route(
            account.key,
            TEST_CONTEXT,
            relay_id=relays[0].relay_id,
            revision=now * 1000,
            updated_at=now,
            expires_at=now + 86400,
        )
        token = await relays[0].account_token(account)
        await relays[0].call("PUT", "account.route.publish", draft.to_wire(), token)
        raws = [RawSender(relays[i % len(relays)].url) for i in range(clients)]
        info: list[Iterator[bytes]] = [itertools.repeat(raw.get("relay.info")) for raw in raws]
        query = {"account": account.account}
        resolve: list[Iterator[bytes]] = [
            itertools.repeat(raw.get("account.route.resolve", query)) for raw in raws
        ]
        async with contextlib.AsyncExitStack() as stack:
            for raw in raws:
                await stack.enter_async_context(raw)
            for raw in raws:  # every process answers the published route
                answer = json.loads(await raw.call(next(resolve[0])))
                assert answer.get("relay_signature"), answer
            figures = await _alternate(
                raws,
                {"relay.info": info, "account.route.resolve": resolve},
                seconds=seconds,
                slices=slices,
                sends=False,
            )
        # On PostgreSQL (several processes): whether each one's route feed was up, so that
        # it kept route answers (SQLite's single process always does).
        feed_up = [await _feed_up(http, p) for p in procs] if len(procs) > 1 else None
    info_rate = figures["relay.info"]["per_second"]
    resolve_rate = figures["account.route.resolve"]["per_second"]
    return {
        "clients": clients,
        "processes": len(procs),
        "route_feed_up": feed_up,
        **figures,
        "resolve_over_info": round(resolve_rate / info_rate, 3) if info_rate else None,
    }


async def run_synapse(*, clients: int, seconds: float) -> dict[str, Any]:
    from gapline.matrix.devserver import SynapseServer

    server = await asyncio.to_thread(SynapseServer.start)
    try:
        users = [
            await server.register_user(server.unique_localpart("bench"), "password")
            for _ in range(clients)
        ]
        room = await server.create_room(users[0], name="bench")
        for u in users[1:]:
            await server.invite_and_join(users[0], room, u)
        done = 0
        stop_at = time.perf_counter() + seconds

        async def sender(i: int) -> None:
            nonlocal done
            async with server.client(users[i]) as client:
                n = 0
                while time.perf_counter() < stop_at:
                    await client.send_text(room, f"message {i}-{n}")
                    n += 1
                    done += 1

        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(clients):
                tg.create_task(sender(i))
        elapsed = time.perf_counter() - start
        return {
            "clients": clients,
            "sends": done,
            "seconds": round(elapsed, 2),
            "sends_per_second": round(done / elapsed, 1),
        }
    finally:
        await asyncio.to_thread(server.stop)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--probe-interval", type=float, default=0.05)
    parser.add_argument(
        "--preseal-rate",
        type=int,
        default=None,
        help="messages sealed before each phase, per second of it, all clients together"
        " (default: 5,000 for sends, 4,000 with grants, 3,500 under abuse)",
    )
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-synapse", action="store_true")
    parser.add_argument("--no-abuse", action="store_true", help="skip the abuse figures")
    parser.add_argument("--abuse-seconds", type=float, default=5.0)
    parser.add_argument("--slow-clients", type=int, default=500)
    parser.add_argument(
        "--lookups-only", action="store_true", help="only the route lookup figures (no sends)"
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.clients = 1.0, 4
        args.abuse_seconds, args.slow_clients = 1.0, 40
        # Four clients send about 1,000/s: sealing for 5,000/s was most of a quick run.
        args.preseal_rate = 2000
    common = [
        "--network-context",
        str(TEST_CONTEXT),
        "--rate",
        "1000000",
        "--burst",
        "1000000",
        # Throughput, not the limits, is measured here (the abuse figures use the defaults):
        # route lookups and relay.info carry no session, so they share the unverified bucket.
        "--unauthenticated-rate",
        "1000000",
        "--unauthenticated-burst",
        "1000000",
        "--account-rate",
        "1000000",
        "--account-burst",
        "1000000",
        "--log-level",
        "warning",
    ]
    result: dict[str, Any] = {
        "bench": "relay",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "quick": args.quick,
    }

    rate = {} if args.preseal_rate is None else {"preseal_rate": args.preseal_rate}

    async def both(procs: list[RelayProcess], name: str) -> None:
        figures: dict[str, Any] = {"http": {}, "ws": {}}
        for transport in () if args.lookups_only else ("http", "ws"):
            log(f"{name}: {len(procs)} relay process(es), sends over {transport}")
            figures[transport] = await run_relay_scenario(
                procs,
                clients=args.clients,
                seconds=args.seconds,
                probe_interval=args.probe_interval,
                transport=transport,
                **rate,
            )
            log(f"  {figures[transport]}")
        # The scenario's headline figures are the HTTP ones; WebSocket sends are nested.
        result[name] = {**figures["http"], "websocket": figures["ws"]}
        if not args.lookups_only:
            log(f"{name}: message.send with a ContactGrant against without, alternating")
            result[name]["authorization"] = await run_authorization_scenario(
                procs, clients=args.clients, seconds=args.seconds, **rate
            )
            log(f"  {result[name]['authorization']}")
        log(f"{name}: account.route.resolve against relay.info, alternating")
        result[name]["route_lookup"] = await run_lookup_scenario(
            procs, clients=args.clients, seconds=args.seconds
        )
        log(f"  {result[name]['route_lookup']}")

    with (
        tempfile.TemporaryDirectory() as tmp,
        RelayProcess.start(os.path.join(tmp, "relay.db"), extra_args=common) as proc,
    ):
        await both([proc], "sqlite")
    if not args.no_postgres:
        from gapline.storage.devpostgres import start_cluster

        cluster = await asyncio.to_thread(start_cluster)
        try:
            dsn = cluster.create_database()
            first = RelayProcess.start(dsn, extra_args=common)
            with first, RelayProcess.start(dsn, extra_args=common) as second:
                await both([first, second], "postgres")
        finally:
            await asyncio.to_thread(cluster.stop)
    if not args.no_synapse:
        log("synapse: message sends into one room")
        from gapline.matrix.devserver import SynapseStartError

        try:
            result["synapse"] = await run_synapse(clients=args.clients, seconds=args.seconds)
        except SynapseStartError as exc:  # the anchor is optional; say why it is missing
            result["synapse"] = {
                "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            }
        log(f"  {result['synapse']}")
        syn = result["synapse"].get("sends_per_second")
        if syn:
            for name in ("sqlite", "postgres"):
                if name in result:
                    result[f"{name}_vs_synapse"] = round(result[name]["sends_per_second"] / syn, 1)
                    result[f"{name}_websocket_vs_synapse"] = round(
                        result[name]["websocket"]["sends_per_second"] / syn, 1
                    )
    if not args.no_abuse:
        result["abuse"] = await run_abuse(args)
    result["targets"] = {
        "sqlite_sends_per_second": 2000,
        "times_synapse": 20,
        "grant_slowdown_at_most": 1.3,
        "route_resolve_over_relay_info_at_least": 0.7,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
