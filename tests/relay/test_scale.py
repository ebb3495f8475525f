"""Several `gapline relay serve` processes on one PostgreSQL database.

- 10,000 concurrent sends to one account, split over two processes, get 10,000
  distinct, strictly increasing sequences (the account_heads row lock held from the
  head upsert to COMMIT, see the one-statement send in gapline.relay._store._sql_postgres).
- A WebSocket client on process A is notified of a send accepted by process B
  (LISTEN/NOTIFY through the storage backend).
"""

from __future__ import annotations

import asyncio
import itertools
import json

import aiohttp
import httpx
import pytest

from gapline.meshline.testing import make_account, make_send_params
from gapline.relay.devserver import RelayProcess
from tests.relay.harness import WsClient
from tests.relay.harness import remote as _remote

pytestmark = pytest.mark.postgres

SENDS = 10_000
SENDERS = 40


async def test_websocket_on_one_process_is_notified_of_a_send_through_the_other(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    a, b = two_relays
    async with httpx.AsyncClient(timeout=30) as http:
        ra, rb = _remote(a, http), _remote(b, http)
        assert ra.relay_id == rb.relay_id  # one relay key, generated once into the shared database
        alice, bob = make_account(), make_account()
        await rb.publish(alice)
        await ra.publish(bob)
        async with WsClient.connect(a.ws_url) as ws:
            challenge = await ws.result("auth.challenge", {"account": bob.account})
            await ws.result(
                "auth.device.verify", ra.device_verify_params(bob, bob.device(), challenge["nonce"])
            )
            token = await rb.login(alice)
            await rb.ok(
                "message.send",
                make_send_params(alice, bob, sender_boxes=False).to_wire(),
                token=token,
            )
            note = await asyncio.wait_for(ws.notifications.get(), 15)
            assert note == {
                "jsonrpc": "2.0",
                "method": "message.timeline.changed",
                "params": {"head": 0},
            }
            page = await ws.result("message.timeline.sync", {})
            assert [i["sequence"] for i in page["items"]] == [0]


@pytest.mark.slow
async def test_ten_thousand_concurrent_sends_get_distinct_increasing_sequences(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    procs = two_relays
    recipient = make_account()
    senders = [make_account() for _ in range(SENDERS)]
    async with httpx.AsyncClient(timeout=60) as http:
        remotes = [_remote(p, http) for p in procs]
        await remotes[0].publish(recipient)
        tokens = []
        for i, sender in enumerate(senders):
            await remotes[i % 2].publish(sender)
            tokens.append(await remotes[i % 2].login(sender))
        bodies = [
            json.dumps(
                make_send_params(senders[n % SENDERS], recipient, sender_boxes=False).to_wire()
            ).encode()
            for n in range(SENDS)
        ]
        statuses: list[str] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
            gate = asyncio.Semaphore(256)

            async def send(n: int) -> None:
                s = n % SENDERS
                async with (
                    gate,
                    session.post(
                        procs[s % 2].url + "/message/send",
                        data=bodies[n],
                        headers={
                            "Content-Type": "application/json",
                            "X-Meshline-Session": tokens[s],
                        },
                    ) as resp,
                ):
                    body = await resp.json()
                    assert resp.status == 200, body
                    statuses.append(body["status"])

            async with asyncio.TaskGroup() as tg:
                for n in range(SENDS):
                    tg.create_task(send(n))
        assert statuses == ["target_accepted"] * SENDS
        token = await remotes[1].login(recipient)
        seqs: list[int] = []
        after = -1
        while True:
            page = await remotes[1].ok(
                "message.timeline.sync", {"after": after, "limit": 1000}, token=token
            )
            seqs += [i["sequence"] for i in page["items"]]
            if not page["has_more"]:
                break
            after = seqs[-1]
        assert len(seqs) == SENDS
        assert len(set(seqs)) == SENDS
        assert all(x < y for x, y in itertools.pairwise(seqs))
        # No sequence was lost or doubled: the head is exactly the last one assigned.
        assert seqs[0] == 0 and seqs[-1] == SENDS - 1
