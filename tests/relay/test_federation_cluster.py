"""One relay served by two processes on one PostgreSQL database, each with its own libp2p
listener (both advertised with ``--p2p-announce``), and a relay on SQLite delivering to an
account homed on that relay: every delivery lands once, also after the process the SQLite
relay was talking to is killed and it turns to the other listener."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gapline.meshline.testing import make_account
from gapline.relay.devserver import RelayProcess, free_port
from tests.relay.federation import ARGS, Network, make_home, metric, received, send_body, wait_for
from tests.relay.harness import Clock, RelayUnderTest

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]


async def _accepted(r: RelayUnderTest, token: str, ids: list[str]) -> None:
    async def done() -> bool:
        for mid in ids:
            status = await r.ok("message.delivery.status", {"message_id": mid}, token=token)
            if status["status"] != "target_accepted":
                return False
        return True

    await wait_for(done, "every delivery to be target_accepted", within=120)


async def _metric(http: httpx.AsyncClient, proc: RelayProcess, name: str, labels: str) -> float:
    text = (await http.get(proc.url.rsplit("/meshline", 1)[0] + "/metrics")).text
    prefix = f"{name}{{{labels}}} "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


async def test_two_processes_on_one_database_are_one_relay_to_the_network(
    tmp_path: Path, postgres_dsn: str
) -> None:
    net = Network(tmp_path, [postgres_dsn, str(tmp_path / "c.db")])
    cluster, c = net.members
    second_port, second_p2p = free_port(), free_port()
    listeners = [f"/ip4/127.0.0.1/tcp/{cluster.p2p_port}", f"/ip4/127.0.0.1/tcp/{second_p2p}"]
    announce = [arg for addr in listeners for arg in ("--p2p-announce", addr)]
    second: RelayProcess | None = None
    try:
        first = net.start(cluster, *announce)
        second = RelayProcess.start(
            postgres_dsn,
            port=second_port,
            extra_args=[
                *ARGS,
                "--registry-file",
                str(net.registry),
                "--relay-key",
                str(cluster.key_file),
                "--p2p-listen",
                f"127.0.0.1:{second_p2p}",
                *announce,
            ],
        )
        # One relay: the same key, Peer ID and descriptor addresses from either process.
        assert first.relay_id == second.relay_id == cluster.relay_id
        assert first.info["p2p"] == second.info["p2p"]
        assert [a.split("/p2p/")[0] for a in first.info["p2p"]] == listeners
        net.start(c)  # bootstraps to the first listener
        async with httpx.AsyncClient(timeout=30) as http:
            r1 = cluster.client(http)
            r2 = RelayUnderTest(second.url, second.ws_url, second.relay_id, Clock(), http)
            rc = c.client(http)
            alice, bob = make_account(), make_account()
            await make_home(r1, bob, 1)
            await make_home(rc, alice, 1)
            token = await rc.login(alice)
            sent: list[str] = []

            async def send(count: int) -> list[str]:
                ids = []
                for _ in range(count):
                    body: dict[str, Any] = send_body(alice, bob)
                    status = await rc.ok("message.send", body, token=token)
                    assert status["status"] in ("delivering", "target_accepted")
                    ids.append(body["envelope"]["message_id"])
                return ids

            sent += await send(20)
            await _accepted(rc, token, sent)
            # Each once, whichever process reads the shared timeline.
            for r in (r1, r2):
                got = await received(r, bob)
                assert sorted(got) == sorted(sent) and len(got) == len(set(got))

            delivered = 'method="message.deliver",outcome="ok"'
            before = [
                await _metric(http, p, "meshline_relay_peer_calls_total", delivered)
                for p in (first, second)
            ]
            assert sum(before) >= 20
            # The process C delivers through is killed: C turns to the other listener.
            first.proc.kill()
            assert first.proc.wait() == -9
            sent += await send(20)
            await _accepted(rc, token, sent)
            got = await received(r2, bob)
            assert sorted(got) == sorted(sent) and len(got) == len(set(got))
            assert await metric(c, "meshline_relay_peers") == 1
            # The second process took what the first could no longer take.
            after = await _metric(http, second, "meshline_relay_peer_calls_total", delivered)
            assert after - before[1] >= 20
    finally:
        if second is not None:
            second.stop()
        net.stop_all()
