"""The relay under abuse: valid sends beside slow clients and beside a flood of invalid requests.

Run by ``bench/relay.py`` (its ``abuse`` key; ``--no-abuse`` skips it). This file is
also the attacker process of the flood phase: ``python bench/relay_abuse.py
--flood-port PORT`` floods until its stdin closes, then prints its answer counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.parse
from typing import Any

import aiohttp

from gapline.meshline.testing import TEST_CONTEXT, make_account, make_send_params
from gapline.relay.devserver import RelayProcess
from relay_clients import RawSender, Relay, cpu_seconds, log

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
    proc: RelayProcess,
    *,
    clients: int,
    seconds: float,
    slow_clients: int,
    preseal_rate: int = 3500,
) -> dict[str, Any]:
    pid = proc.proc.pid
    port = int(urllib.parse.urlsplit(proc.url).port or 80)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        relay = Relay(proc, http)
        recipient = make_account(1)
        senders = [make_account(1) for _ in range(clients)]
        await relay.publish(recipient)
        await relay.publish_profile(recipient, public_discovery=True)  # no grant needed
        for s in senders:
            await relay.publish(s)
        tokens = [await relay.login(s) for s in senders]
        phases = range(6)  # warm-up, alone, slow clients, alone, flood, alone
        per_client = max(20, int(seconds * preseal_rate / clients) + 20)
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

            cpu0, start = cpu_seconds(pid), time.perf_counter()
            async with asyncio.TaskGroup() as tg:
                for i in range(clients):
                    tg.create_task(sender(i))
            elapsed = time.perf_counter() - start
            cpu = cpu_seconds(pid) - cpu0
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
            **({} if args.preseal_rate is None else {"preseal_rate": args.preseal_rate}),
        )


def _flood_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flood-port", type=int, required=True)
    asyncio.run(flood_until_stdin_closes(parser.parse_args().flood_port))


if __name__ == "__main__":
    _flood_main()
