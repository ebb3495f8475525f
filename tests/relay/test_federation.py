"""Relays as separate processes, federated over libp2p: the listener is advertised only
while served, bootstrap peers verify each other, and relay RPC answers another relay."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from gapline.meshline import AccountKey, b64u_encode
from gapline.meshline.testing import TEST_CONTEXT, make_account
from gapline.relay._p2p._host import P2pHost
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._peers import FileRegistry, sign_registry_entry, verify_peer_descriptor
from gapline.relay._peer_rpc import PeerCallError, call_peer
from gapline.relay.devserver import RelayProcess, free_port
from tests.relay.harness import Clock, RelayUnderTest

ARGS = ["--network-context", str(TEST_CONTEXT), "--rate", "1000000", "--burst", "1000000"]


def _key_file(tmp_path: Path, name: str) -> tuple[AccountKey, Path]:
    key = AccountKey.generate()
    path = tmp_path / f"{name}.key"
    path.write_text(b64u_encode(key.private_bytes()))
    return key, path


def _descriptor(key: AccountKey, port: int) -> bytes:
    """What the test process presents when it acts as a third relay."""
    peer = PeerIdentity.from_relay_key(key).peer_id
    body = {
        "$type": "meshline.relay.descriptor",
        "relay_id": key.relay_id(),
        "public_key": key.public_key_b64,
        "endpoints": [
            f"http://127.0.0.1:{port}/meshline/v1",
            str(TcpAddr("ip4", "127.0.0.1", 9, peer)),
        ],
        "expires_at": int(time.time()) + 3600,
    }
    body["relay_signature"] = key.sign_object(body, TEST_CONTEXT, exclude=())
    return json.dumps(body).encode()


async def _peers(url: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(url.rsplit("/meshline", 1)[0] + "/metrics")).text
    return next(
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("meshline_relay_peers ")
    )


async def test_two_relay_processes_federate_and_answer_relay_rpc(tmp_path: Path) -> None:
    key_a, file_a = _key_file(tmp_path, "a")
    key_b, file_b = _key_file(tmp_path, "b")
    key_c = AccountKey.generate()  # the test process, as a third relay
    registry = tmp_path / "registry.json"
    ports = {k.relay_id(): free_port() for k in (key_a, key_b, key_c)}
    FileRegistry.write(
        registry,
        [
            sign_registry_entry(
                k, f"http://127.0.0.1:{ports[k.relay_id()]}/meshline/v1", TEST_CONTEXT
            )
            for k in (key_a, key_b, key_c)
        ],
    )
    common = [*ARGS, "--registry-file", str(registry)]
    b = RelayProcess.start(
        str(tmp_path / "b.db"),
        port=ports[key_b.relay_id()],
        extra_args=[*common, "--relay-key", str(file_b), "--p2p-listen", "127.0.0.1:0"],
    )
    try:
        (b_addr,) = b.info["p2p"]
        assert TcpAddr.parse(b_addr).peer_id == PeerIdentity.from_relay_key(key_b).peer_id
        a = RelayProcess.start(
            str(tmp_path / "a.db"),
            port=ports[key_a.relay_id()],
            extra_args=[
                *common,
                "--relay-key",
                str(file_a),
                "--p2p-listen",
                "127.0.0.1:0",
                "--bootstrap",
                b_addr,
            ],
        )
        try:
            async with httpx.AsyncClient() as http:
                descriptor = (await http.get(b.url + "/relay/descriptor")).json()
            assert b_addr in descriptor["endpoints"]  # advertised because it is served
            for _ in range(100):
                if await _peers(a.url) == 1 and await _peers(b.url) == 1:
                    break
                await asyncio.sleep(0.1)
            assert await _peers(a.url) == 1 and await _peers(b.url) == 1

            # The test process calls B's relay RPC as relay C.
            alice = make_account()
            async with httpx.AsyncClient(timeout=30) as http:
                await RelayUnderTest(b.url, b.ws_url, b.relay_id, Clock(), http).publish(alice)
            reg = FileRegistry(registry, TEST_CONTEXT)
            host = P2pHost(
                PeerIdentity.from_relay_key(key_c),
                lambda: _descriptor(key_c, ports[key_c.relay_id()]),
                lambda pid, raw: verify_peer_descriptor(
                    pid, raw, registry=reg, context=TEST_CONTEXT, now=lambda: int(time.time())
                )[0],
            )
            async with host.running():
                conn = await host.connect(TcpAddr.parse(b_addr))
                assert conn.peer.relay_id == key_b.relay_id()
                device = alice.devices[0].device_id
                status = await call_peer(
                    conn, "device.status", {"account": alice.account, "device_id": device}
                )
                assert status["status"] == "active" and status["expires_at"] > time.time()
                other = make_account()
                stranger = await call_peer(
                    conn,
                    "device.status",
                    {"account": alice.account, "device_id": other.devices[0].device_id},
                )
                assert stranger == {"status": "inactive"}
                try:
                    await call_peer(
                        conn, "device.status", {"account": other.account, "device_id": device}
                    )
                    raise AssertionError("an account B holds nothing for was answered")
                except PeerCallError as exc:
                    assert exc.code == "target_not_local"
                try:
                    await call_peer(conn, "no.such.method", {})
                    raise AssertionError("an unknown method was answered")
                except PeerCallError as exc:
                    assert exc.number == -32601
        finally:
            assert a.stop() == 0
    finally:
        assert b.stop() == 0
    # Without the listener the descriptor lists no libp2p address.
    plain = RelayProcess.start(
        str(tmp_path / "b.db"), extra_args=[*ARGS, "--relay-key", str(file_b)]
    )
    try:
        assert "p2p" not in plain.info
        async with httpx.AsyncClient() as http:
            endpoints = (await http.get(plain.url + "/relay/descriptor")).json()["endpoints"]
        assert not any(e.startswith("/") for e in endpoints)
    finally:
        assert plain.stop() == 0
