"""The relay under abuse: the four findings of the review as regressions, the slow-client
timeouts, the connection caps, the rate limits with forged session headers, and the
internal-error contract."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import socket
import struct
from typing import Any

import pytest
import websockets

from gapline.meshline.testing import make_account
from gapline.relay._ratelimit import Admission
from tests.relay.harness import RelayUnderTest, WsClient, start_relay
from tests.relay.logcapture import capture_logs

# Generous: a close "within the timeout" is checked only against this bound.
BOUND = 30.0


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the relay sends until it closes the connection (bounded wait)."""
    data = b""
    async with asyncio.timeout(BOUND):
        while chunk := await reader.read(65536):
            data += chunk
    return data


def _response(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


async def _metric(r: RelayUnderTest, line: str) -> float:
    text = r.server.metrics.render().decode()
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


# -- finding 1: a huge integer in a query string ----------------------------------------


@pytest.mark.parametrize("field", ["limit", "after"])
@pytest.mark.parametrize("digits", [17, 4301, 5000])
async def test_huge_query_integers_are_bad_request_not_500(
    sqlite_dsn: str, field: str, digits: int
) -> None:
    with capture_logs() as logs:
        async with start_relay(sqlite_dsn) as r:
            alice = make_account()
            await r.publish(alice)
            token = await r.login(alice)
            for headers in ({"X-Meshline-Session": token}, {}):
                resp = await r.http.get(
                    r.url + f"/message/timeline/sync?{field}=" + "9" * digits, headers=headers
                )
                assert resp.headers["content-type"].startswith("application/json")
                assert resp.status_code == 400 and resp.json()["code"] == "bad_request"
    assert logs.tracebacks() == []


async def test_huge_integers_in_a_frame_or_body_are_refused(sqlite_dsn: str) -> None:
    with capture_logs() as logs:
        async with start_relay(sqlite_dsn) as r:
            big = "9" * 5000
            resp = await r.http.post(
                r.url + "/auth/challenge",
                content=('{"account":' + big + "}").encode(),
                headers={"Content-Type": "application/json"},
            )
            assert resp.status_code == 400 and resp.json()["code"] == "bad_request"
            async with websockets.connect(r.ws_url) as ws:
                frame = '{"jsonrpc":"2.0","id":1,"method":"message.timeline.sync",'
                await ws.send(frame + '"params":{"limit":' + big + "}}")
                answer = json.loads(await asyncio.wait_for(ws.recv(), BOUND))
                assert answer["error"]["code"] == -32700 and answer["id"] is None
                await ws.send('{"jsonrpc":"2.0","id":2,"method":"relay.info"}')
                assert "result" in json.loads(await asyncio.wait_for(ws.recv(), BOUND))
    assert logs.tracebacks() == []


async def test_long_arrays_and_tokens_are_bounded(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        body = json.dumps({"account": "x", "pad": [0] * 5000}).encode()
        resp = await r.http.post(
            r.url + "/auth/challenge", content=body, headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 400 and "1024" in resp.json()["message"]
        async with websockets.connect(r.ws_url) as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x", "p": [0] * 5000}))
            answer = json.loads(await asyncio.wait_for(ws.recv(), BOUND))
            assert answer["error"]["code"] == -32600
        resp = await r.http.get(
            r.url + "/message/timeline/sync", headers={"X-Meshline-Session": "t" * 5000}
        )
        assert resp.status_code == 401 and resp.json()["code"] == "unauthorized"
        query = "&".join(f"k{i}=1" for i in range(100))
        resp = await r.http.get(r.url + "/relay/info?" + query)
        assert resp.status_code == 400 and resp.json()["code"] == "bad_request"


# -- finding 2: the rate limiter keyed on an unverified header --------------------------


async def test_random_session_headers_buy_no_buckets(sqlite_dsn: str) -> None:
    frozen = 1000.0  # the buckets' clock stands still: exactly the burst gets through
    async with start_relay(sqlite_dsn, rate_per_second=1.0, rate_burst=20) as r:
        for limiter in (r.server.admission.addresses, r.server.admission.sessions):
            limiter._clock = lambda: frozen
        r.server.admission.TARPIT_SECONDS = 0.0  # type: ignore[misc]  # answer refusals at once
        account = make_account().account
        codes = []
        for _ in range(150):
            resp = await r.http.post(
                r.url + "/auth/challenge",
                json={"account": account},
                headers={"X-Meshline-Session": secrets.token_urlsafe(32)},
            )
            codes.append(resp.json().get("code", "ok") if resp.status_code != 200 else "ok")
        assert codes.count("ok") == 20 and codes.count("rate_limited") == 130
        assert await _challenge_rows(r) == 20


async def test_verified_sessions_are_charged_to_session_and_account(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account()
        await r.publish(alice)
        token = await r.login(alice)
        # The token's first use is a store lookup, paid by the address; then it is known.
        await r.ok("message.timeline.sync", {}, token=token)
        admission = r.server.admission
        # The address bucket runs dry: unverified calls are refused ...
        admission.addresses.take = lambda key: 7  # type: ignore[method-assign]
        resp = await r.http.post(r.url + "/auth/challenge", json={"account": alice.account})
        assert resp.status_code == 429 and resp.json()["data"]["retry_after"] == 7
        # ... but a verified session is charged to its own buckets (session, then account).
        page = await r.http.get(
            r.url + "/message/timeline/sync", headers={"X-Meshline-Session": token}
        )
        assert page.status_code == 200
        charged: list[str] = []
        admission.accounts.take = lambda key: charged.append(key) or 0  # type: ignore[method-assign]
        await r.http.get(r.url + "/message/timeline/sync", headers={"X-Meshline-Session": token})
        assert charged == [alice.account]
        # A token the relay has never issued is still only the address's claim.
        bogus = await r.http.get(
            r.url + "/message/timeline/sync", headers={"X-Meshline-Session": "forged-token"}
        )
        assert bogus.status_code == 429


async def test_unverified_calls_share_one_global_bucket(sqlite_dsn: str) -> None:
    async with start_relay(
        sqlite_dsn, unauthenticated_rate_per_second=1.0, unauthenticated_burst=5
    ) as r:
        r.server.admission.unauthenticated._clock = lambda: 0.0
        codes = [(await r.call("relay.info")).status_code for _ in range(8)]
        assert codes == [200] * 5 + [429] * 3


async def _challenge_rows(r: RelayUnderTest) -> int:
    def op(tx: Any) -> int:
        return int(tx.one("SELECT count(*) FROM auth_challenges")[0])

    return await r.server.backend.read(op)


async def test_challenge_rows_are_bounded_per_address_and_per_account(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, challenges_per_address=10, challenges_per_account=3) as r:
        accepted = 0
        for _ in range(200):
            resp = await r.http.post(
                r.url + "/auth/challenge",
                json={"account": make_account().account},
                headers={"X-Meshline-Session": secrets.token_urlsafe(16)},
            )
            if resp.status_code == 200:
                accepted += 1
            else:
                assert resp.json()["code"] == "rate_limited", resp.text
                assert int(resp.headers["Retry-After"]) >= 1
        assert accepted == 10 and await _challenge_rows(r) == 10

    async with start_relay(sqlite_dsn, challenges_per_address=10, challenges_per_account=3) as r:
        alice = make_account()
        await r.publish(alice)  # one challenge, used
        statuses = [
            (await r.call("auth.challenge", {"account": alice.account})).status_code
            for _ in range(6)
        ]
        assert statuses == [200, 200, 200, 429, 429, 429]
        # Expired challenges give their room back.
        r.clock.advance(r.server.config.challenge_ttl + 1)
        assert (await r.call("auth.challenge", {"account": alice.account})).status_code == 200


async def test_a_used_challenge_gives_its_room_back(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, challenges_per_account=1) as r:
        alice = make_account()
        await r.publish(alice)
        for _ in range(3):  # each login uses its challenge before the next is asked for
            await r.login(alice)
        await r.ok("auth.challenge", {"account": alice.account})
        assert (await r.call("auth.challenge", {"account": alice.account})).status_code == 429
        async with WsClient.connect(r.ws_url) as ws:
            answer = await ws.request("auth.challenge", {"account": alice.account})
            assert answer["error"]["code"] == -32030


# -- finding 3: a client that disconnects mid-body --------------------------------------


@pytest.mark.parametrize("reset", [False, True])
async def test_disconnect_mid_body_is_one_debug_line(sqlite_dsn: str, reset: bool) -> None:
    with capture_logs() as logs:
        async with start_relay(sqlite_dsn) as r:
            for _ in range(3):
                sock = socket.create_connection(("127.0.0.1", r.server.port))
                sock.sendall(
                    b"POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                    b'{"account": "'
                )
                if reset:  # RST instead of FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            records = await asyncio.wait_for(
                logs.wait_for("client disconnected mid-body", 3), BOUND
            )
            assert await _metric(r, "meshline_relay_client_disconnects_total") == 3
            assert (await r.call("relay.info")).status_code == 200
    assert all(rec.levelname == "DEBUG" and not rec.exc_info for rec in records)
    assert logs.tracebacks() == []
    assert all("\n" not in line and json.loads(line) for line in logs.lines())


# -- finding 4: timeouts and connection caps --------------------------------------------


async def test_slow_clients_are_closed_within_the_timeouts(sqlite_dsn: str) -> None:
    short: dict[str, Any] = {
        "header_timeout": 0.5,
        "body_timeout": 0.5,
        "idle_timeout": 2.0,  # longer than the head timeout, so each timer shows
        "ws_auth_timeout": 0.5,
        "ws_heartbeat": 60.0,
    }
    with capture_logs() as logs:
        async with start_relay(sqlite_dsn, **short) as r:
            port = r.server.port
            alice = make_account()
            await r.publish(alice)
            bare = await asyncio.open_connection("127.0.0.1", port)
            head = await asyncio.open_connection("127.0.0.1", port)
            head[1].write(b"GET /meshline/v1/relay/info HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            body = await asyncio.open_connection("127.0.0.1", port)
            body[1].write(
                b"POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{"
            )
            kept = await asyncio.open_connection("127.0.0.1", port)
            kept[1].write(b"GET /meshline/v1/relay/info HTTP/1.1\r\nHost: x\r\n\r\n")
            async with (
                websockets.connect(r.ws_url) as idle_ws,
                WsClient.connect(r.ws_url) as authed,
            ):
                challenge = await authed.result("auth.challenge", {"account": alice.account})
                await authed.result(
                    "auth.device.verify",
                    r.device_verify_params(alice, alice.device(), challenge["nonce"]),
                )
                assert await _closed(bare[0]) == b""
                assert await _closed(head[0]) == b""
                status, error = _response(await _closed(body[0]))
                assert status == 400 and error["code"] == "bad_request"
                # A kept-alive connection gets its answer, then is closed when idle.
                assert (await _closed(kept[0])).startswith(b"HTTP/1.1 200 ")
                with pytest.raises(websockets.ConnectionClosed) as info:
                    async with asyncio.timeout(BOUND):
                        await idle_ws.recv()
                assert info.value.rcvd is not None and info.value.rcvd.code == 1008
                # The authenticated WebSocket, opened with the idle one, still works.
                assert (await authed.result("relay.info"))["relay_id"] == r.relay_id
            for phase in ("header", "body", "ws_auth"):
                assert await _metric(r, f'meshline_relay_timeouts_total{{phase="{phase}"}}') >= 1
            for writer in (bare[1], head[1], body[1], kept[1]):
                writer.close()
    assert logs.tracebacks() == []


async def test_connection_caps_per_address_and_total(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, max_connections_per_address=3, max_connections=100) as r:
        port = r.server.port
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        # Admission happens at accept; a request on an admitted connection proves it ran.
        held[0][1].write(b"GET /meshline/v1/relay/info HTTP/1.1\r\nHost: x\r\n\r\n")
        await held[0][0].readuntil(b"\r\n\r\n")
        extra = await asyncio.open_connection("127.0.0.1", port)
        status, error = _response(await _closed(extra[0]))
        assert status == 429 and error["code"] == "rate_limited"
        assert r.server.guard.by_address["127.0.0.1"] == 3
        # Another loopback address is another client.
        other = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        other[1].write(b"GET /meshline/v1/relay/info HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await other[0].readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        for _, writer in [*held, other]:
            writer.close()

    async with start_relay(sqlite_dsn, max_connections_per_address=50, max_connections=2) as r:
        port = r.server.port
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        held[1][1].write(b"GET /meshline/v1/relay/info HTTP/1.1\r\nHost: x\r\n\r\n")
        await held[1][0].readuntil(b"\r\n\r\n")
        extra = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
        status, error = _response(await _closed(extra[0]))
        assert status == 503 and error["code"] == "temporarily_unavailable"
        assert await _metric(r, 'meshline_relay_connections_refused_total{cap="total"}') == 1
        for _, writer in held:
            writer.close()


# -- unexpected exceptions --------------------------------------------------------------


async def test_an_unexpected_exception_is_internal_error_with_an_id(sqlite_dsn: str) -> None:
    async def boom(call: Any, params: Any) -> Any:
        raise RuntimeError("a bug")

    with capture_logs() as logs:
        async with start_relay(sqlite_dsn) as r:
            methods = r.server.relay.methods
            methods["relay.info"] = dataclasses.replace(methods["relay.info"], handler=boom)
            resp = await r.call("relay.info")
            assert resp.status_code == 503
            assert resp.headers["content-type"].startswith("application/json")
            body = resp.json()
            assert body["code"] == "internal_error" and "bug" not in body["message"]
            http_id = body["data"]["error_id"]
            async with WsClient.connect(r.ws_url) as ws:
                answer = await ws.request("relay.info")
            assert answer["error"]["code"] == -32603
            ws_id = answer["error"]["data"]["error_id"]
            assert http_id != ws_id
            for transport in ("http", "ws"):
                line = f'meshline_relay_internal_errors_total{{transport="{transport}"}}'
                assert await _metric(r, line) == 1
    errors = logs.matching("unexpected failure")
    assert [rec.__dict__["error_id"] for rec in errors] == [http_id, ws_id]
    for rec in errors:
        line = logs.lines()[logs.records.index(rec)]
        assert "\n" not in line and "RuntimeError: a bug" in json.loads(line)["exc"]


async def test_a_transport_failure_is_internal_error_too(
    sqlite_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gapline.relay._http as http_module

    def broken(*args: Any) -> Any:
        raise KeyError("transport bug")

    monkeypatch.setattr(http_module, "query_params", broken)
    async with start_relay(sqlite_dsn) as r:
        resp = await r.call("relay.info")
        assert resp.status_code == 503 and resp.json()["code"] == "internal_error"
        assert resp.json()["data"]["error_id"]


async def test_aiohttp_refusals_are_relay_errors(sqlite_dsn: str) -> None:
    with capture_logs() as logs:
        async with start_relay(sqlite_dsn) as r:
            port = r.server.port
            cases = [
                (b"GET /meshline/v1/relay/info HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 413),
                (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
                (b"GET /meshline/v1/relay/info HTTP/1.1\r\nBad Header\r\n\r\n", 400),
                (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
                # Found by the fuzz: unknown expectations (417 outside the middleware, a
                # 500 for a byte that did not encode back), and garbage after a request.
                (b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 0\r\nConnection: close\r\n\r\n", 404),
                (
                    b"GET /meshline/v1/auth/account/verify HTTP/1.1\r\nHost: x\r\n"
                    b"Expect: \x80\r\nConnection: close\r\n\r\n",
                    400,
                ),
                (b"\x00\r\n\r\n", 400),
                (b"GET /meshline/v1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 400),
                (
                    b"POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: x\r\n"
                    b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
                    b"zz\r\n{}\r\n0\r\n\r\n",
                    400,
                ),
                (
                    b"POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: x\r\nConnection: close"
                    b"\r\nContent-Encoding: gzip\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 4\r\n\r\n\x1f\x8b\x08\x00",
                    400,
                ),
            ]
            for raw, status in cases:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                got, error = _response(await _closed(reader))
                assert got == status and isinstance(error["code"], str), (raw[:40], error)
                writer.close()
    assert logs.tracebacks() == []


# -- the process: every stderr line is JSON -------------------------------------------------


async def test_the_process_logs_only_json_lines_under_abuse(tmp_path: Any) -> None:
    from gapline.meshline.testing import TEST_CONTEXT
    from gapline.relay.devserver import RelayProcess

    args = ["--network-context", str(TEST_CONTEXT), "--log-level", "debug"]
    proc = RelayProcess.start(str(tmp_path / "relay.db"), extra_args=args)
    try:
        port = int(proc.url.rsplit(":", 1)[1].split("/")[0])
        for raw in (
            b"GET /meshline/v1/message/timeline/sync?limit="
            + b"9" * 5000
            + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /meshline/v1/relay/info HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            status, error = _response(await _closed(reader))
            assert status in (400, 413) and error["code"] in ("bad_request", "request_too_large")
            writer.close()
        for _ in range(3):  # mid-body disconnects
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /meshline/v1/auth/challenge HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 9999\r\n\r\n{"
            )
            await writer.drain()
            writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await _closed(reader)).startswith(b"HTTP/1.1 200 ")
        writer.close()
    finally:
        assert proc.stop() == 0
    lines = proc.log_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line parses
    assert not [r for r in records if "exc" in r or r["level"] in ("error", "critical")], lines
    assert sum(r["msg"] == "client disconnected mid-body" for r in records) == 3


async def test_a_flood_that_ignores_retry_after_is_held(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, rate_per_second=1.0, rate_burst=1) as r:
        admission = r.server.admission
        admission.addresses._clock = admission.refusals._clock = lambda: 0.0
        admission.TARPIT_SECONDS = 0.01  # type: ignore[misc]
        codes = [(await r.call("relay.info")).status_code for _ in range(30)]
        assert codes == [200] + [429] * 29
        held = await _metric(r, "meshline_relay_refusals_held_total")
        assert held == 29 - Admission.REFUSALS[1]


async def test_failed_unverified_calls_cost_their_address_more(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, rate_per_second=1.0, rate_burst=50) as r:
        admission = r.server.admission
        admission.addresses._clock = admission.unauthenticated._clock = lambda: 0.0
        cost = Admission.FAILED_CALL_COST
        codes = [
            (await r.call("auth.challenge", {"account": "not an account"})).status_code
            for _ in range(50 // cost + 1)
        ]
        assert codes == [400] * (50 // cost) + [429]
        # The shared bucket paid one call per request, not ten.
        shared = admission.unauthenticated._buckets["*"][0]
        assert shared == r.server.config.unauthenticated_burst - 50 // cost


async def test_every_websocket_frame_is_charged_even_garbage(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, rate_per_second=1.0, rate_burst=3) as r:
        r.server.admission.addresses._clock = lambda: 0.0
        r.server.admission.TARPIT_SECONDS = 0.0  # type: ignore[misc]
        async with websockets.connect(r.ws_url) as ws:
            await ws.send("{garbage")
            assert json.loads(await ws.recv())["error"]["code"] == -32700
            # ... and cost ten: the next frame, however valid, is refused.
            await ws.send('{"jsonrpc":"2.0","id":1,"method":"relay.info"}')
            answer = json.loads(await ws.recv())
            assert answer["error"]["code"] == -32030 and answer["id"] == 1
