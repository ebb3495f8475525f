"""Relays as separate processes, federated over libp2p (SQLite and PostgreSQL mixed).

An account on relay A sends to accounts homed on B and C; relays killed with SIGKILL
mid-delivery and restarted deliver every accepted send exactly once; a route that moves
from B to C takes the deliveries with it; a peer that offers forged routes or breaks
framing is never believed; and the listener is advertised only while it is served.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gapline.meshline import (
    AccountKey,
    NetworkContext,
    cosign_route,
    encode_uvarint,
    route_record,
    sign_profile,
    sign_route,
)
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account
from gapline.relay._p2p._channel import Buffered
from gapline.relay._p2p._frames import FRAME_LIMIT, encode_frame, read_frame
from gapline.relay._p2p._host import P2pHost, VerifiedPeer
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay._p2p._kad import GET_VALUE, KadMessage
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._peers import FileRegistry, sign_registry_entry, verify_peer_descriptor
from gapline.relay._p2p._yamux import StreamReset, YamuxStream
from gapline.relay._peer_rpc import RELAY_PROTOCOL, PeerCallError, call_peer, notify_peer
from gapline.relay._route_federation import KAD_PROTOCOL
from gapline.relay.devserver import RelayProcess
from tests.relay.federation import (
    ARGS,
    Network,
    make_home,
    metric,
    received,
    send_body,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)


async def _statuses(r, token: str, ids: list[str]) -> dict[str, str]:
    out = {}
    for mid in ids:
        out[mid] = (await r.ok("message.delivery.status", {"message_id": mid}, token=token))[
            "status"
        ]
    return out


async def _all_accepted(r, token: str, ids: list[str]) -> None:
    async def done() -> bool:
        return set((await _statuses(r, token, ids)).values()) == {"target_accepted"}

    await wait_for(done, "every delivery to be target_accepted", within=90)


@pytest.mark.postgres
async def test_a_sends_to_b_and_c_across_sqlite_and_postgres(
    tmp_path: Path, postgres_dsn: str
) -> None:
    net = Network(tmp_path, [str(tmp_path / "a.db"), postgres_dsn, str(tmp_path / "c.db")])
    a, b, c = net.members
    try:
        for member in net.members:
            net.start(member)
        (addr,) = b.running.info["p2p"]
        assert TcpAddr.parse(addr).peer_id == PeerIdentity.from_relay_key(b.key).peer_id
        async with httpx.AsyncClient(timeout=30) as http:
            ra, rb, rc = a.client(http), b.client(http), c.client(http)
            assert addr in (await rb.ok("relay.descriptor"))["endpoints"]
            alice, bob, carol = make_account(), make_account(), make_account()
            await make_home(ra, alice, 1)
            await make_home(rb, bob, 1)
            await make_home(rc, carol, 1)
            token = await ra.login(alice)
            sent: dict[str, list[str]] = {bob.account: [], carol.account: []}
            for i in range(30):
                target = bob if i % 2 else carol
                body = send_body(alice, target)
                status = await ra.ok("message.send", body, token=token)
                assert status["status"] in ("delivering", "target_accepted")
                sent[target.account].append(body["envelope"]["message_id"])
                if i == 0:
                    # A retry of the same request is the same send: nothing new anywhere.
                    again = await ra.ok("message.send", body, token=token)
                    assert again["accepted_at"] == status["accepted_at"]
            await _all_accepted(ra, token, sent[bob.account] + sent[carol.account])
            # Each exactly once (deliveries run concurrently: arrival order is not send order).
            for r, account in ((rb, bob), (rc, carol)):
                got = await received(r, account)
                assert sorted(got) == sorted(sent[account.account])
            # Alice's sent records stay on A (her sender boxes never leave it).
            assert len(await received(ra, alice)) == 30
            # And back: B's account sends to A's.
            reply = send_body(bob, alice)
            btoken = await rb.login(bob)
            await rb.ok("message.send", reply, token=btoken)
            await _all_accepted(rb, btoken, [reply["envelope"]["message_id"]])
            assert (await received(ra, alice))[-1] == reply["envelope"]["message_id"]
            assert (
                await metric(a, "meshline_relay_deliveries_total", 'outcome="target_accepted"')
                >= 30
            )
            assert await metric(b, "meshline_relay_peers") == 2
            # Reads of an account homed elsewhere are answered by its home relay, verified.
            forwarded = await ra.ok("profile.resolve", {"account": bob.account}, token=token)
            assert forwarded == await rb.ok(
                "profile.resolve", {"account": bob.account}, token=btoken
            )
            state = await ra.ok("device.state.resolve", {"account": carol.account}, token=token)
            assert state == carol.state.to_wire()
    finally:
        net.stop_all()


@pytest.mark.slow
@pytest.mark.postgres
async def test_relays_killed_mid_delivery_deliver_every_accepted_send_once(
    tmp_path: Path, postgres_dsn: str
) -> None:
    net = Network(tmp_path, [str(tmp_path / "a.db"), postgres_dsn])
    a, b = net.members
    try:
        for member in net.members:
            net.start(member)
        async with httpx.AsyncClient(timeout=30) as http:
            ra, rb = a.client(http), b.client(http)
            alice, bob = make_account(), make_account()
            await make_home(ra, alice, 1)
            await make_home(rb, bob, 1)
            token = await ra.login(alice)
            bodies = [send_body(alice, bob) for _ in range(120)]
            accepted: list[str] = []

            async def send(body: dict[str, Any]) -> None:
                resp = await ra.call("message.send", body, token=token)
                if resp.status_code == 200:
                    accepted.append(body["envelope"]["message_id"])

            async with asyncio.TaskGroup() as tg:
                for i, body in enumerate(bodies):
                    if i == 40:
                        b.running.proc.kill()  # SIGKILL, mid-delivery
                    tg.create_task(send(body))
                    await asyncio.sleep(0.005)
            assert b.running.proc.wait() == -9
            assert len(accepted) == len(bodies)  # A accepts while B is down
            statuses = await _statuses(ra, token, accepted)
            assert "delivering" in statuses.values()
            # The source dies too, with deliveries still queued.
            a.running.proc.kill()
            a.running.proc.wait()
            net.start(a)
            net.start(b)
            ra, rb = a.client(http), b.client(http)
            token = await ra.login(alice)
            await _all_accepted(ra, token, accepted)
            got = await received(rb, bob)
            assert sorted(got) == sorted(accepted) and len(got) == len(set(got))
    finally:
        net.stop_all()


async def test_a_route_that_moves_from_b_to_c_takes_the_deliveries(tmp_path: Path) -> None:
    net = Network(tmp_path, [str(tmp_path / f"{n}.db") for n in "abc"])
    a, b, c = net.members
    try:
        for member in net.members:
            net.start(member)
        async with httpx.AsyncClient(timeout=30) as http:
            ra, rb, rc = a.client(http), b.client(http), c.client(http)
            alice, bob = make_account(), make_account()
            await make_home(ra, alice, 1)
            await make_home(rb, bob, 1)
            token = await ra.login(alice)
            before = send_body(alice, bob)
            await ra.ok("message.send", before, token=token)
            await _all_accepted(ra, token, [before["envelope"]["message_id"]])
            # Bob moves home: device state on C, then a higher-revision route naming C.
            await make_home(rc, bob, 2)
            moved = await rb.ok("account.route.resolve", {"account": bob.account})
            assert moved["relay_id"] == c.relay_id  # C replicated it to B on publication
            after = [send_body(alice, bob) for _ in range(5)]
            for body in after:
                await ra.ok("message.send", body, token=token)
            ids = [body["envelope"]["message_id"] for body in after]
            await _all_accepted(ra, token, ids)
            # B still holds bob's old state, but the route decides: B's own account's send
            # to bob goes to C too.
            dana = make_account()
            await make_home(rb, dana, 1)
            dtoken = await rb.login(dana)
            from_b = send_body(dana, bob)
            await rb.ok("message.send", from_b, token=dtoken)
            await _all_accepted(rb, dtoken, [from_b["envelope"]["message_id"]])
            got = await received(rc, bob)
            assert sorted(got[:-1]) == sorted(ids) and got[-1] == from_b["envelope"]["message_id"]
            assert await received(rb, bob) == [before["envelope"]["message_id"]]
    finally:
        net.stop_all()


async def test_a_backlog_of_sends_is_delivered_with_one_call_each(tmp_path: Path) -> None:
    """Sends that wait in the in-memory queue (the target is stopped, every delivery slot
    waits on it) are not also started by the queue scan, which reads the same rows."""
    net = Network(tmp_path, [str(tmp_path / f"{n}.db") for n in "ab"])
    a, b = net.members
    try:
        for member in net.members:
            net.start(member)
        async with httpx.AsyncClient(timeout=30) as http:
            ra, rb = a.client(http), b.client(http)
            alice, bob = make_account(), make_account()
            await make_home(ra, alice, 1)
            await make_home(rb, bob, 1)
            token = await ra.login(alice)
            bodies = [send_body(alice, bob) for _ in range(200)]
            await ra.ok("message.send", bodies[0], token=token)  # A learns bob's route
            await _all_accepted(ra, token, [bodies[0]["envelope"]["message_id"]])
            b.running.proc.send_signal(signal.SIGSTOP)
            try:

                async def sender(mine: list[dict[str, Any]]) -> None:
                    for body in mine:
                        await ra.ok("message.send", body, token=token)

                async with asyncio.TaskGroup() as tg:
                    for i in range(16):
                        tg.create_task(sender(bodies[1 + i :: 16]))
                await asyncio.sleep(2.5)  # more than one scan, well within the call timeout
            finally:
                b.running.proc.send_signal(signal.SIGCONT)
            ids = [body["envelope"]["message_id"] for body in bodies]
            await _all_accepted(ra, token, ids)
            assert sorted(await received(rb, bob)) == sorted(ids)
            calls = 'method="message.deliver",outcome="ok"'
            assert await metric(b, "meshline_relay_peer_calls_total", calls) == len(ids)
            accepted = 'outcome="target_accepted"'
            assert await metric(a, "meshline_relay_deliveries_total", accepted) == len(ids)
    finally:
        net.stop_all()


async def _true(value: bool) -> bool:
    return value


async def _at_least(figure: Awaitable[float], bound: float) -> bool:
    return await figure >= bound


def _fake_descriptor(key: AccountKey, url: str) -> bytes:
    peer = PeerIdentity.from_relay_key(key).peer_id
    body = {
        "$type": "meshline.relay.descriptor",
        "relay_id": key.relay_id(),
        "public_key": key.public_key_b64,
        "endpoints": [url, str(TcpAddr("ip4", "127.0.0.1", 9, peer))],
        "expires_at": int(time.time()) + 3600,
    }
    body["relay_signature"] = key.sign_object(body, TEST_CONTEXT, exclude=())
    return json.dumps(body).encode()


def _forged_routes(
    x: AccountKey, outsider: AccountKey, account_key: AccountKey, ctx: NetworkContext
) -> list[bytes]:
    now = int(time.time())
    forged = []
    # Co-signed by a relay key that is not the named relay's (X's relay_id, another key).
    draft = sign_route(
        account_key, ctx, relay_id=x.relay_id(), revision=7, updated_at=now, expires_at=now + 3600
    )
    forged.append(route_record(cosign_route(draft, outsider, ctx), ctx)[1])
    # Properly co-signed, by a relay the registry does not list.
    draft = sign_route(
        account_key,
        ctx,
        relay_id=outsider.relay_id(),
        revision=8,
        updated_at=now,
        expires_at=now + 3600,
    )
    forged.append(route_record(cosign_route(draft, outsider, ctx), ctx)[1])
    return forged


async def test_a_peer_with_forged_routes_or_broken_frames_is_never_believed(
    tmp_path: Path,
) -> None:
    net = Network(tmp_path, [str(tmp_path / "a.db")])
    (a,) = net.members
    x_key, outsider = AccountKey.generate(), AccountKey.generate()
    x_url = "http://127.0.0.1:9/meshline/v1"
    entries = json.loads(net.registry.read_text())["entries"]
    FileRegistry.write(net.registry, [*entries, sign_registry_entry(x_key, x_url, TEST_CONTEXT)])
    dave, erin = make_account(), make_account()
    forged = _forged_routes(x_key, outsider, dave.key, TEST_CONTEXT)
    # Erin's route is genuine and names X; X's answers about erin are not.
    now = int(time.time())
    erin_route = route_record(
        cosign_route(
            sign_route(
                erin.key, TEST_CONTEXT, relay_id=x_key.relay_id(), revision=1,
                updated_at=now, expires_at=now + 3600,
            ),
            x_key,
            TEST_CONTEXT,
        ),
        TEST_CONTEXT,
    )  # fmt: skip
    served: list[int] = []

    async def kad(stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
        message = KadMessage.decode(await read_frame(incoming, utf8=False))
        if message.type != GET_VALUE:
            stream.reset()  # X stores nothing for anyone
            return
        if message.key == erin_route[0]:
            value = erin_route[1]
        else:
            value = forged[len(served) % len(forged)]
            served.append(message.type)
        reply = KadMessage(GET_VALUE, message.key, (message.key, value))
        await stream.write(encode_frame(reply.encode()))
        await stream.close()

    registry = FileRegistry(net.registry, TEST_CONTEXT)
    x = P2pHost(
        PeerIdentity.from_relay_key(x_key),
        lambda: _fake_descriptor(x_key, x_url),
        lambda pid, raw: verify_peer_descriptor(
            pid, raw, registry=registry, context=TEST_CONTEXT, now=lambda: int(time.time())
        )[0],
    )
    x.set_handler(KAD_PROTOCOL, kad)
    profile = sign_profile(erin.device().keys, erin.account, TEST_CONTEXT, public_discovery=True)
    bad_profile = {
        "profile": {**profile.to_wire(), "public_discovery": False},  # signature now wrong
        "signer_certificate": erin.device().certificate.to_wire(),
    }
    bad_state = {**erin.state.to_wire(), "revision": erin.state.revision + 1}
    answers = {
        "profile.resolve": bad_profile,
        "device.state.resolve": bad_state,
        "message.deliver": {"status": "delivering", "accepted_at": 1},  # never acceptance
    }

    hints: list[dict[str, Any]] = []

    async def rpc(stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
        request = json.loads(await read_frame(incoming))
        if "id" not in request:  # a notification: no answer
            hints.append({"from": peer.relay_id, **request})
            await stream.close()
            return
        result = answers[request["method"]]
        body = {"jsonrpc": "2.0", "id": request["id"], "result": result}
        await stream.write(encode_frame(json.dumps(body).encode()))
        await stream.close()

    x.set_handler(RELAY_PROTOCOL, rpc)
    try:
        net.start(a)
        async with x.running(), httpx.AsyncClient(timeout=30) as http:
            ra = a.client(http)
            alice = make_account()
            await make_home(ra, alice, 1)  # before X joins: X acknowledges no PUT
            conn = await x.connect(TcpAddr.parse(a.running.info["p2p"][0]))
            token = await ra.login(alice)
            for _ in range(2):  # each lookup is answered with one forged record
                code = await ra.error("message.send", send_body(alice, dave), token=token)
                assert code == (404, "route_not_found")
            assert served and all(t == GET_VALUE for t in served)
            assert await ra.error("account.route.resolve", {"account": dave.account}) == (
                404,
                "not_found",
            )
            assert (
                await metric(
                    a, "meshline_relay_dht_operations_total", 'operation="get",outcome="rejected"'
                )
                >= 2
            )

            # X is erin's home by a genuine route, but its answers do not verify: the
            # client gets bad_gateway, never what X said.
            for method in ("profile.resolve", "device.state.resolve"):
                assert await ra.error(method, {"account": erin.account}, token=token) == (
                    503,
                    "bad_gateway",
                )
            refused = 'method="profile.resolve",outcome="unverified_answer"'
            assert await metric(a, "meshline_relay_peer_calls_total", refused) == 1
            # A delivery X answers with anything but target_accepted ends as bad_gateway.
            to_erin = send_body(alice, erin)
            assert (await ra.ok("message.send", to_erin, token=token))["status"] == "delivering"
            mid = to_erin["envelope"]["message_id"]

            async def ended() -> bool:
                st = await ra.ok("message.delivery.status", {"message_id": mid}, token=token)
                return st["status"] == "failed" and st["error"]["code"] == "bad_gateway"

            await wait_for(ended, "the delivery to end as bad_gateway")

            # Framing violations on relay RPC reset the stream; the connection stays.
            for raw in (
                encode_uvarint(FRAME_LIMIT + 1) + b"{}",
                b"\xff" * 10,
                encode_frame(b"\xc3"),
            ):
                stream, incoming = await conn.open(RELAY_PROTOCOL, raw)
                await stream.close()
                with pytest.raises(StreamReset):
                    await read_frame(incoming)
            # A request that is not JSON-RPC gets its error; then a real call is answered.
            stream, incoming = await conn.open(RELAY_PROTOCOL, encode_frame(b"[1]"))
            await stream.close()
            assert json.loads(await read_frame(incoming))["error"]["code"] == -32600
            status = await call_peer(
                conn,
                "device.status",
                {"account": alice.account, "device_id": alice.devices[0].device_id},
            )
            assert status["status"] == "active"
            # X asked about alice's device: A's next state change hints X.
            newer = alice.new_state(list(alice.devices), revision=alice.state.revision + 1)
            await ra.publish(alice, newer)
            await wait_for(lambda: _true(bool(hints)), "the device.status.changed hint")
            assert hints == [
                {
                    "from": a.relay_id,
                    "jsonrpc": "2.0",
                    "method": "device.status.changed",
                    "params": {"account": alice.account, "device_id": alice.devices[0].device_id},
                }
            ]
            # X is not alice's home: A refuses X's hint about her.
            await notify_peer(conn, "device.status.changed", hints[0]["params"])
            forbidden = 'method="device.status.changed",outcome="forbidden"'
            await wait_for(
                lambda: _at_least(metric(a, "meshline_relay_peer_calls_total", forbidden), 1),
                "A to refuse the hint",
            )
            with pytest.raises(PeerCallError) as refused:
                await call_peer(conn, "message.deliver", {"envelope": {}})
            assert refused.value.code == "bad_request"
    finally:
        net.stop_all()


async def test_the_descriptor_lists_libp2p_only_while_served(tmp_path: Path) -> None:
    net = Network(tmp_path, [str(tmp_path / "a.db")])
    (a,) = net.members
    plain = RelayProcess.start(a.dsn, extra_args=[*ARGS, "--relay-key", str(a.key_file)])
    try:
        assert "p2p" not in plain.info
        async with httpx.AsyncClient() as http:
            endpoints = (await http.get(plain.url + "/relay/descriptor")).json()["endpoints"]
        assert not any(e.startswith("/") for e in endpoints)
    finally:
        assert plain.stop() == 0


async def test_state_queries_cross_relays_with_the_target_rules(tmp_path: Path) -> None:
    from gapline.meshline import AccountRoute, issue_grant, sign_state_query

    net = Network(tmp_path, [str(tmp_path / "a.db"), str(tmp_path / "b.db")])
    a, b = net.members
    try:
        for member in net.members:
            net.start(member)
        async with httpx.AsyncClient(timeout=30) as http:
            ra, rb = a.client(http), b.client(http)
            alice, bob, carol = make_account(), make_account(), make_account()
            await make_home(ra, alice, 1)
            # Bob is homed on B without public discovery.
            await rb.publish(bob, public=False)
            await rb.publish_profile(bob, public_discovery=False)
            now = int(time.time())
            draft = sign_route(
                bob.key, TEST_CONTEXT, relay_id=b.relay_id, revision=1, updated_at=now,
                expires_at=now + 3600,
            )  # fmt: skip
            AccountRoute.from_wire(
                await rb.ok(
                    "account.route.publish", draft.to_wire(), token=await rb.account_login(bob)
                )
            )
            token = await ra.login(alice)
            # A public query crosses as a public query: B refuses it for a private account.
            assert await ra.error(
                "device.state.resolve", {"account": bob.account}, token=token
            ) == (
                403,
                "forbidden",
            )
            # The profile has no contact rules.
            resolved = await ra.ok("profile.resolve", {"account": bob.account}, token=token)
            assert resolved["profile"]["public_discovery"] is False

            def query(grantee: TestAccount) -> dict[str, Any]:
                dev = bob.device()
                grant = issue_grant(
                    dev.keys,
                    dev.device_id,
                    TEST_CONTEXT,
                    grantor=bob.account,
                    grantee=grantee.account,
                )
                asker = alice.device()
                return sign_state_query(
                    asker.keys, asker.certificate, TEST_CONTEXT, account=bob.account,
                    authorization=grant, created_at=int(time.time()),
                ).to_wire()  # fmt: skip

            answer = await ra.call("device.state.resolve", query(alice), token=token, verb="POST")
            assert answer.status_code == 200, answer.text
            assert answer.json() == bob.state.to_wire()
            wrong = await ra.call("device.state.resolve", query(carol), token=token, verb="POST")
            assert (wrong.status_code, wrong.json()["code"]) == (403, "forbidden")
    finally:
        net.stop_all()
