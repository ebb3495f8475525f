"""Meshline relay throughput and notification latency, with Synapse as the peer anchor.

Scenarios (each a fresh database, relays run as `gapline relay serve` subprocesses):

- ``sqlite``: one relay on a SQLite file.
- ``postgres``: two relay processes on one PostgreSQL database (throwaway cluster from
  the local binaries, fsync on); clients are split between the processes.

In each, ``--clients`` sender clients (own account and device session each; first
over HTTP keep-alive, then again over one WebSocket each) send pre-sealed messages (with sender boxes, so each send appends two
timeline records) to one shared recipient account as fast as the relay answers. A
send counts once its HTTP 200 arrived, i.e. after the durable commit. Client-side
sealing is done before the clock starts.

Latency probe (running during the load): a recipient with a WebSocket session on the
first process; a probe sender on the last process sends one message every
``--probe-interval`` seconds and records (a) send start -> ``message.timeline.changed``
received, (b) send start -> the following ``message.timeline.sync`` returned the record.

Synapse: the matrix fixture's Synapse (in-memory SQLite, rate limits off), ``--clients``
users in one room each sending ``m.room.message`` as fast as Synapse answers.

Abuse (``abuse`` key): see "the relay under abuse" below.

    python bench/relay.py [--quick] [--seconds S] [--clients N] [--no-postgres] [--no-synapse]
        [--no-abuse] [--abuse-seconds S] [--slow-clients N]
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
import urllib.parse
from typing import Any

import aiohttp

from gapline.meshline import account_auth_input, device_auth_input, relay_origin
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account, make_send_params
from gapline.relay.devserver import RelayProcess


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RawSender:
    """One keep-alive HTTP/1.1 connection that POSTs pre-built requests and checks the answers.

    Deliberately minimal (see the module docstring): the relay's cost is the figure, so
    the client spends a few microseconds per request instead of an HTTP library's
    hundreds. It understands exactly what the relay sends back: a status line, headers
    with ``Content-Length``, and a JSON body.
    """

    def __init__(self, url: str, token: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path + "/message/send"
        self.token = token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def request(self, body: bytes) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nX-Meshline-Session: {self.token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def __aenter__(self) -> RawSender:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.writer is not None
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

    async def send(self, request: bytes) -> None:
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = -1
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length < 0:
            raise RuntimeError(f"message.send: no Content-Length in {head!r}")
        body = await self.reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200 "):
            status = head.split(b"\r\n", 1)[0]
            raise RuntimeError(f"message.send: {status!r} {body!r}")
        if json.loads(body).get("status") != "target_accepted":
            raise RuntimeError(f"message.send: unexpected result {body!r}")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


class Relay:
    """A minimal HTTP client for one relay process."""

    def __init__(self, proc: RelayProcess, http: aiohttp.ClientSession) -> None:
        self.proc = proc
        self.http = http
        self.url = proc.url
        self.origin = relay_origin(proc.url)
        self.relay_id = proc.relay_id

    async def call(
        self, verb: str, method: str, params: Any = None, token: str | None = None
    ) -> Any:
        headers = {"X-Meshline-Session": token} if token else {}
        url = self.url + "/" + method.replace(".", "/")
        if verb == "GET":
            ctx = self.http.get(url, params=params or {}, headers=headers)
        elif isinstance(params, bytes):
            headers["Content-Type"] = "application/json"
            ctx = self.http.request(verb, url, data=params, headers=headers)
        else:
            ctx = self.http.request(verb, url, json=params, headers=headers)
        async with ctx as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"{method}: {resp.status} {body}")
            return body

    async def publish(self, account: TestAccount) -> None:
        challenge = await self.call("POST", "auth.challenge", {"account": account.account})
        payload = account_auth_input(
            relay_id=self.relay_id,
            origin=self.origin,
            account=account.account,
            account_public_key=account.key.public_key_b64,
            nonce=challenge["nonce"],
        )
        creds = await self.call(
            "POST",
            "auth.account.verify",
            {
                "nonce": challenge["nonce"],
                "account_public_key": account.key.public_key_b64,
                "account_signature": account.key.sign_object(payload, TEST_CONTEXT, exclude=()),
            },
        )
        await self.call("PUT", "device.state.publish", account.state.to_wire(), creds["token"])

    def verify_params(self, account: TestAccount, nonce: str) -> dict[str, Any]:
        device = account.device()
        ts = int(time.time())
        payload = device_auth_input(
            relay_id=self.relay_id,
            origin=self.origin,
            account=account.account,
            device_id=device.device_id,
            nonce=nonce,
            timestamp=ts,
        )
        return {
            "nonce": nonce,
            "timestamp": ts,
            "signer_certificate": device.certificate.to_wire(),
            "device_signature": device.keys.sign_object(payload, TEST_CONTEXT, exclude=()),
        }

    async def login(self, account: TestAccount) -> str:
        challenge = await self.call("POST", "auth.challenge", {"account": account.account})
        creds = await self.call(
            "POST", "auth.device.verify", self.verify_params(account, challenge["nonce"])
        )
        return str(creds["token"])


async def run_relay_scenario(
    procs: list[RelayProcess],
    *,
    clients: int,
    seconds: float,
    probe_interval: float,
    transport: str = "http",
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        relays = [Relay(p, http) for p in procs]
        recipient = make_account(1)
        senders = [make_account(1) for _ in range(clients)]
        probe_to, probe_from = make_account(1), make_account(1)
        await relays[0].publish(recipient)
        await relays[0].publish(probe_to)
        await relays[-1].publish(probe_from)
        for i, s in enumerate(senders):
            await relays[i % len(relays)].publish(s)
        tokens = [await relays[i % len(relays)].login(s) for i, s in enumerate(senders)]
        probe_token = await relays[-1].login(probe_from)
        # Pre-seal enough messages for the run (sealing is the client's cost, not the relay's):
        # room for 5,000 sends/s. Should the senders still run out, the rate is taken over
        # the time they were sending, and the result says so (``presealed_exhausted``).
        per_client = max(50, int(seconds * 5000 / clients) + 50)
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
        relay_cpu0 = sum(_cpu_seconds(pid) for pid in pids)
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
        relay_cpu = sum(_cpu_seconds(pid) for pid in pids) - relay_cpu0
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


# -- the relay under abuse (slow clients, a flood of invalid requests) ------------------
#
# One relay process with its default limits and timeouts. Valid senders (own account
# and session each, pre-sealed sends over HTTP keep-alive, as above) run four phases of
# ``--abuse-seconds`` each: a warm-up, alone, while ``--slow-clients`` slow clients are held open,
# alone, while a flood of invalid requests runs (from its own process), and alone. The
# figures are the sends/s of each phase and the relay's CPU per valid send, each attack
# against the mean of the lone phases beside it, and the relay's descriptors and RSS
# during and after the attacks.
#
# Slow clients come from 50 loopback addresses (127.0.2.x), a quarter each: a request
# head trickled a byte a second, a body trickled the same way, an idle unauthenticated
# WebSocket, a bare TCP connection; each reconnects when the relay closes it. The flood
# comes from 4 addresses (127.0.3.x), 8 keep-alive connections each sending the next
# invalid request as soon as the last is answered: a 5,000-digit query integer, a random
# session header on auth.challenge, a non-JSON body, a random token on a session method.

ABUSE_TARGETS = {"slow_clients_throughput_ratio_min": 0.9, "flood_cpu_per_send_ratio_max": 1.3}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def _slow_client(port: int, kind: str, address: str, stop: asyncio.Event) -> int:
    """Hold one slow connection open, reconnecting whenever the relay closes it."""
    opened = 0
    heads = {
        "head": b"GET /meshline/v1/relay/info HTTP/1.1\r\nHost: bench\r\nX-Slow: ",
        "body": b"POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: bench\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
        "ws": b"GET /meshline/v1 HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n",
        "bare": b"",
    }
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(address, 0)
            )
        except OSError:
            await asyncio.sleep(0.2)
            continue
        opened += 1
        try:
            writer.write(heads[kind])
            while not stop.is_set():
                if kind in ("head", "body"):
                    writer.write(b"a")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        if not await reader.read(65536) and reader.at_eof():
                            break  # closed by the relay: open the next one
        except OSError:
            pass
        finally:
            writer.close()
    return opened


async def _invalid_flood(port: int, address: str, stop: asyncio.Event, counts: dict) -> None:
    import secrets

    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    n = 0
    try:
        while not stop.is_set():
            token = secrets.token_urlsafe(32)
            kind = n % 4
            n += 1
            if kind == 0:
                head = f"GET /meshline/v1/message/timeline/sync?limit={'9' * 5000} HTTP/1.1\r\n"
                req = (head + f"Host: b\r\nX-Meshline-Session: {token}\r\n\r\n").encode()
            elif kind == 1:
                body = b'{"account":"nope"}'
                req = (
                    "POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: b\r\n"
                    f"X-Meshline-Session: {token}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode() + body
            elif kind == 2:
                body = b"{not json"
                req = (
                    "POST /meshline/v1/message/send HTTP/1.1\r\nHost: b\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode() + body
            else:
                req = (
                    "GET /meshline/v1/message/delivery/status?message_id=x HTTP/1.1\r\n"
                    f"Host: b\r\nX-Meshline-Session: {token}\r\n\r\n"
                ).encode()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1].decode()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            counts[status] = counts.get(status, 0) + 1
            if b"connection: close" in head.lower():
                writer.close()
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=(address, 0)
                )
    except (OSError, asyncio.IncompleteReadError):
        counts["closed"] = counts.get("closed", 0) + 1
    finally:
        writer.close()


async def flood_until_stdin_closes(port: int) -> None:
    """The attacker process of the flood phase: prints its answer counts as JSON."""
    stop = asyncio.Event()
    counts: dict[str, int] = {}
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def watch() -> None:
        await reader.read()
        stop.set()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(watch())
        for i in range(32):
            tg.create_task(_invalid_flood(port, f"127.0.3.{1 + i % 4}", stop, counts))
    print(json.dumps(counts), flush=True)


async def run_abuse_scenario(
    proc: RelayProcess, *, clients: int, seconds: float, slow_clients: int
) -> dict[str, Any]:
    pid = proc.proc.pid
    port = int(urllib.parse.urlsplit(proc.url).port or 80)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        relay = Relay(proc, http)
        recipient = make_account(1)
        senders = [make_account(1) for _ in range(clients)]
        await relay.publish(recipient)
        for s in senders:
            await relay.publish(s)
        tokens = [await relay.login(s) for s in senders]
        phases = range(6)  # warm-up, alone, slow clients, alone, flood, alone
        per_client = max(20, int(seconds * 3500 / clients) + 20)
        log(f"  abuse: sealing {per_client * clients * len(phases)} messages ...")
        raw = [RawSender(relay.url, t) for t in tokens]
        queues = [
            [
                raw[i].request(json.dumps(make_send_params(s, recipient).to_wire()).encode())
                for _ in range(per_client * len(phases))
            ]
            for i, s in enumerate(senders)
        ]
        baseline = {"fds": _fds(pid), "rss_kib": _rss_kib(pid)}

        async def valid_phase() -> dict[str, Any]:
            done = 0
            stop_at = time.perf_counter() + seconds

            async def sender(i: int) -> None:
                nonlocal done
                async with raw[i] as conn:
                    while queues[i] and time.perf_counter() < stop_at:
                        await conn.send(queues[i].pop())
                        done += 1

            cpu0, start = _cpu_seconds(pid), time.perf_counter()
            async with asyncio.TaskGroup() as tg:
                for i in range(clients):
                    tg.create_task(sender(i))
            elapsed = time.perf_counter() - start
            cpu = _cpu_seconds(pid) - cpu0
            return {
                "sends": done,
                "sends_per_second": round(done / elapsed, 1),
                "relay_cpu_ms_per_send": round(1000 * cpu / max(done, 1), 3),
            }

        async def sampled(attack: Any, name: str) -> dict[str, Any]:
            """Run ``attack(stop)`` beside a valid phase; sample fds/RSS while it runs."""
            stop = asyncio.Event()
            samples: list[tuple[int, int]] = []

            async def sample() -> None:
                while not stop.is_set():
                    samples.append((_fds(pid), _rss_kib(pid)))
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            await stop.wait()

            async with asyncio.TaskGroup() as tg:
                attackers = attack(tg, stop)
                tg.create_task(sample())
                await asyncio.sleep(min(2.0, seconds / 2))  # let the attack build up
                figures = await valid_phase()
                stop.set()
            figures["during"] = {
                "fds_max": max(f for f, _ in samples),
                "rss_kib_max": max(r for _, r in samples),
            }
            figures.update(attackers())
            log(f"  abuse {name}: {figures}")
            return figures

        def slow(tg: asyncio.TaskGroup, stop: asyncio.Event) -> Any:
            kinds = ("head", "body", "ws", "bare")
            tasks = [
                tg.create_task(_slow_client(port, kinds[i % 4], f"127.0.2.{2 + i % 50}", stop))
                for i in range(slow_clients)
            ]
            return lambda: {
                "slow_clients": slow_clients,
                "slow_connections_opened": sum(t.result() for t in tasks if t.done()),
            }

        def flood(tg: asyncio.TaskGroup, stop: asyncio.Event) -> Any:
            # In its own process: the attacker's CPU must not slow the valid senders' loop.
            counts: dict[str, int] = {}

            async def attacker() -> None:
                child = await asyncio.create_subprocess_exec(
                    sys.executable,
                    __file__,
                    "--flood-port",
                    str(port),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
                assert child.stdin is not None and child.stdout is not None
                await stop.wait()
                child.stdin.close()  # the child floods until its stdin closes
                counts.update(json.loads(await child.stdout.read()))
                await child.wait()

            tg.create_task(attacker())
            return lambda: {"flood_answers": dict(sorted(counts.items()))}

        # Lone phases before, between and after the attacks; each attack is compared
        # with the mean of the lone phases beside it (the machine is shared: drift).
        out: dict[str, Any] = {"clients": clients, "phase_seconds": seconds}
        # The first phase on a fresh relay runs faster than every later one (an empty
        # database, a young heap): it warms up and is left out of the ratios.
        out["warmup"] = await valid_phase()
        log(f"  abuse warm-up: {out['warmup']}")
        lone = []
        for name, attack in (("slow_clients", slow), ("flood", flood), (None, None)):
            lone.append(await valid_phase())
            log(f"  abuse alone: {lone[-1]}")
            if name is not None:
                out[name] = await sampled(attack, name)
        out["alone"] = lone

        def mean(a: int, b: int, key: str) -> float:
            return (lone[a][key] + lone[b][key]) / 2

        await asyncio.sleep(1.0)  # let the relay see the last closes
        out["fds_rss"] = {
            "before": baseline,
            "after": {"fds": _fds(pid), "rss_kib": _rss_kib(pid)},
        }
        out["slow_clients_throughput_ratio"] = round(
            out["slow_clients"]["sends_per_second"] / mean(0, 1, "sends_per_second"), 3
        )
        out["flood_cpu_per_send_ratio"] = round(
            out["flood"]["relay_cpu_ms_per_send"] / mean(1, 2, "relay_cpu_ms_per_send"), 3
        )
        out["flood_throughput_ratio"] = round(
            out["flood"]["sends_per_second"] / mean(1, 2, "sends_per_second"), 3
        )
        out["targets"] = ABUSE_TARGETS
        out["met"] = {
            "slow_clients": out["slow_clients_throughput_ratio"]
            >= ABUSE_TARGETS["slow_clients_throughput_ratio_min"],
            "flood": out["flood_cpu_per_send_ratio"]
            <= ABUSE_TARGETS["flood_cpu_per_send_ratio_max"],
        }
        return out


async def run_abuse(args: argparse.Namespace) -> dict[str, Any]:
    """The abuse figures on a fresh SQLite relay with its default limits and timeouts."""
    log(f"abuse: {args.slow_clients} slow clients, then an invalid flood, SQLite")
    with (
        tempfile.TemporaryDirectory() as tmp,
        RelayProcess.start(
            os.path.join(tmp, "relay.db"),
            extra_args=["--network-context", str(TEST_CONTEXT), "--log-level", "warning"],
        ) as proc,
    ):
        return await run_abuse_scenario(
            proc,
            clients=min(args.clients, 32),
            seconds=args.abuse_seconds,
            slow_clients=args.slow_clients,
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--probe-interval", type=float, default=0.05)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-synapse", action="store_true")
    parser.add_argument("--no-abuse", action="store_true", help="skip the abuse figures")
    parser.add_argument("--abuse-seconds", type=float, default=5.0)
    parser.add_argument("--slow-clients", type=int, default=500)
    parser.add_argument("--flood-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood_port:
        await flood_until_stdin_closes(args.flood_port)
        return
    if args.quick:
        args.seconds, args.clients = 1.0, 4
        args.abuse_seconds, args.slow_clients = 1.0, 40
    common = [
        "--network-context",
        str(TEST_CONTEXT),
        "--rate",
        "1000000",
        "--burst",
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

    async def both(procs: list[RelayProcess], name: str) -> None:
        figures = {}
        for transport in ("http", "ws"):
            log(f"{name}: {len(procs)} relay process(es), sends over {transport}")
            figures[transport] = await run_relay_scenario(
                procs,
                clients=args.clients,
                seconds=args.seconds,
                probe_interval=args.probe_interval,
                transport=transport,
            )
            log(f"  {figures[transport]}")
        # The scenario's headline figures are the HTTP ones; WebSocket sends are nested.
        result[name] = {**figures["http"], "websocket": figures["ws"]}

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
    result["targets"] = {"sqlite_sends_per_second": 2000, "times_synapse": 20}
    print(json.dumps(result))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
