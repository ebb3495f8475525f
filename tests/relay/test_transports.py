"""HTTP and WebSocket framing as conventions.md sets it: malformed and oversized
requests get the spec's error objects, codes and close codes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import websockets

from gapline.meshline import issue_invite, sign_state_query
from gapline.meshline.testing import make_account, make_send_params
from tests.relay.harness import WsClient, start_relay

BASE_HEADERS = {"Content-Type": "application/json"}


async def test_unknown_method_and_wrong_verb(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        resp = await r.http.get(r.url + "/no/such/method")
        assert resp.status_code == 404 and resp.json()["code"] == "method_not_found"
        resp = await r.http.post(r.url + "/relay/info")
        assert resp.status_code == 400 and resp.json()["code"] == "bad_request"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"[1, 2]", "application/json"),
        (b'{"account": "a", "account": "b"}', "application/json"),
        (b'{"account": 1.5}', "application/json"),
        (b'{"account": "x"}', "text/plain"),
        (b'{"account": "x"}', "application/json; charset=latin-1"),
        (b"\xff\xfe", "application/json"),
    ],
)
async def test_malformed_http_bodies_are_bad_request(
    sqlite_dsn: str, body: bytes, content_type: str
) -> None:
    async with start_relay(sqlite_dsn) as r:
        resp = await r.http.post(
            r.url + "/auth/challenge", content=body, headers={"Content-Type": content_type}
        )
        assert resp.status_code == 400
        error = resp.json()
        assert error["code"] == "bad_request" and isinstance(error["message"], str)


async def test_charset_parameter_is_parsed_not_compared(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        account = make_account().account
        resp = await r.http.post(
            r.url + "/auth/challenge",
            content=json.dumps({"account": account}).encode(),
            headers={"Content-Type": 'Application/JSON; Charset="UTF-8"'},
        )
        assert resp.status_code == 200, resp.text


async def test_oversized_http_body_is_request_too_large(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, max_request_bytes=64 * 1024) as r:
        resp = await r.http.post(
            r.url + "/auth/challenge",
            content=b'{"pad":"' + b"x" * 70_000 + b'"}',
            headers=BASE_HEADERS,
        )
        assert resp.status_code == 413 and resp.json()["code"] == "request_too_large"


@pytest.mark.parametrize(
    "query",
    ["after=01", "after=-0", "after=1.0", "after=x", "after=1&after=2", "limit=9007199254740992"],
)
async def test_get_query_integers_are_strict(sqlite_dsn: str, query: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account()
        await r.publish(alice)
        token = await r.login(alice)
        resp = await r.http.get(
            r.url + "/message/timeline/sync?" + query, headers={"X-Meshline-Session": token}
        )
        assert resp.status_code == 400 and resp.json()["code"] == "bad_request"


async def test_unknown_query_fields_are_ignored(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account()
        await r.publish(alice)
        token = await r.login(alice)
        resp = await r.http.get(
            r.url + "/message/timeline/sync?after=-1&colour=blue",
            headers={"X-Meshline-Session": token},
        )
        assert resp.status_code == 200


async def test_sessions_are_required_and_checked(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        assert await r.error("message.timeline.sync", {}) == (401, "unauthorized")
        assert await r.error("message.timeline.sync", {}, token="not-a-token") == (
            401,
            "unauthorized",
        )
        alice = make_account()
        await r.publish(alice)
        # An account session cannot call device methods.
        challenge = await r.ok("auth.challenge", {"account": alice.account})
        from gapline.meshline import account_auth_input

        payload = account_auth_input(
            relay_id=r.server.relay.relay_id,
            origin=r.server.relay.origin,
            account=alice.account,
            account_public_key=alice.key.public_key_b64,
            nonce=challenge["nonce"],
        )
        creds = await r.ok(
            "auth.account.verify",
            {
                "nonce": challenge["nonce"],
                "account_public_key": alice.key.public_key_b64,
                "account_signature": alice.key.sign_object(payload, r.context, exclude=()),
            },
        )
        assert await r.error("message.timeline.sync", {}, token=creds["token"]) == (
            403,
            "forbidden",
        )


async def test_challenge_is_consumed_on_first_attempt_and_bad_signatures_refused(
    sqlite_dsn: str,
) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account()
        await r.publish(alice)
        challenge = await r.ok("auth.challenge", {"account": alice.account})
        params = r.device_verify_params(alice, alice.device(), challenge["nonce"])
        forged = dict(params, device_signature=params["device_signature"][:-4] + "AAAA")
        assert await r.error("auth.device.verify", forged) == (400, "invalid_signature")
        assert await r.error("auth.device.verify", params) == (401, "unauthorized")
        challenge = await r.ok("auth.challenge", {"account": alice.account})
        r.clock.advance(-1000)  # the client's clock runs 1000 s behind the relay's
        skewed = r.device_verify_params(alice, alice.device(), challenge["nonce"])
        r.clock.advance(1000)
        assert await r.error("auth.device.verify", skewed) == (400, "clock_skew")


async def test_tampered_envelope_is_invalid_signature(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice, bob = make_account(), make_account()
        await r.publish(alice)
        await r.publish(bob)
        token = await r.login(alice)
        wire = make_send_params(alice, bob, created_at=r.clock()).to_wire()
        wire["envelope"]["created_at"] -= 1
        assert await r.error("message.send", wire, token=token) == (400, "invalid_signature")


async def test_device_state_revision_rules(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account(2)
        await r.publish(alice)
        token = await r.login(alice)
        same = await r.ok("device.state.publish", alice.state.to_wire(), token=token)
        assert same == {"status": "accepted"}
        other = alice.new_state([alice.device(0)], revision=alice.state.revision)
        assert await r.error("device.state.publish", other.to_wire(), token=token) == (
            409,
            "state_conflict",
        )
        older = alice.new_state(list(alice.devices), revision=alice.state.revision - 1)
        assert await r.error("device.state.publish", older.to_wire(), token=token) == (
            400,
            "stale_state",
        )
        resolved = await r.ok("device.state.resolve", {"account": alice.account}, token=token)
        assert resolved == alice.state.to_wire()
        stranger = make_account()
        assert await r.error(
            "device.state.resolve", {"account": stranger.account}, token=token
        ) == (404, "not_found")


async def test_rate_limited_has_retry_after(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, rate_per_second=1.0, rate_burst=2) as r:
        codes = [(await r.call("relay.info")).status_code for _ in range(3)]
        assert codes[:2] == [200, 200] and codes[2] == 429
        resp = await r.call("relay.info")
        body = resp.json()
        assert body["code"] == "rate_limited"
        assert int(resp.headers["Retry-After"]) == body["data"]["retry_after"] >= 1


async def _raw(ws: websockets.ClientConnection, frame: str) -> dict:
    await ws.send(frame)
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def test_ws_jsonrpc_protocol_errors(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r, websockets.connect(r.ws_url) as ws:
        assert (await _raw(ws, "{oops"))["error"]["code"] == -32700
        batch = await _raw(ws, json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "relay.info"}]))
        assert batch["error"]["code"] == -32600 and batch["id"] is None
        no_id = await _raw(
            ws, json.dumps({"jsonrpc": "2.0", "method": "relay.info", "id": "x" * 129})
        )
        assert no_id["error"]["code"] == -32600 and no_id["id"] is None
        wrong = await _raw(ws, json.dumps({"jsonrpc": "1.0", "id": 7, "method": "relay.info"}))
        assert (
            wrong == {"jsonrpc": "2.0", "id": 7, "error": wrong["error"]}
            and wrong["error"]["code"] == -32600
        )
        missing = await _raw(ws, json.dumps({"jsonrpc": "2.0", "id": "m", "method": "no.such"}))
        assert missing["error"]["code"] == -32601
        for params in (None, [1]):
            bad = await _raw(
                ws,
                json.dumps({"jsonrpc": "2.0", "id": 3, "method": "relay.info", "params": params}),
            )
            assert bad["error"]["code"] == -32602
        unauth = await _raw(
            ws, json.dumps({"jsonrpc": "2.0", "id": 4, "method": "message.timeline.sync"})
        )
        assert unauth["error"]["code"] == -32001
        ok = await _raw(
            ws, json.dumps({"jsonrpc": "2.0", "id": 5, "method": "relay.info", "extra": True})
        )
        assert ok["result"]["limits"]["message_retention"] == 3600 and "error" not in ok


async def test_ws_binary_frame_closes_1003(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r, websockets.connect(r.ws_url) as ws:
        await ws.send(b'{"jsonrpc":"2.0"}')
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1003


async def test_ws_oversized_frame_closes_1009(sqlite_dsn: str) -> None:
    async with (
        start_relay(sqlite_dsn, max_request_bytes=32 * 1024) as r,
        websockets.connect(r.ws_url, max_size=None) as ws,
    ):
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "relay.info", "pad": "x" * 40_000})
        )
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_ws_send_sync_and_rebind_forbidden(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice, bob = make_account(), make_account()
        await r.publish(alice)
        await r.publish(bob)
        async with WsClient.connect(r.ws_url) as ws:
            challenge = await ws.result("auth.challenge", {"account": alice.account})
            creds = await ws.result(
                "auth.device.verify",
                r.device_verify_params(alice, alice.device(), challenge["nonce"]),
            )
            assert creds["mode"] == "device"
            params = make_send_params(alice, alice, created_at=r.clock()).to_wire()
            assert (await ws.result("message.send", params))["status"] == "target_accepted"
            page = await ws.result("message.timeline.sync", {})
            assert [i["sequence"] for i in page["items"]] == [0]
            challenge = await ws.result("auth.challenge", {"account": bob.account})
            rebind = await ws.request(
                "auth.device.verify", r.device_verify_params(bob, bob.device(), challenge["nonce"])
            )
            assert rebind["error"]["code"] == -32003
            # The HTTP token of a WebSocket session is a bearer credential over HTTP too.
            assert (await r.ok("message.timeline.sync", {}, token=creds["token"]))["items"]


async def test_metrics_and_health(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account()
        await r.publish(alice)
        token = await r.login(alice)
        await r.ok(
            "message.send",
            make_send_params(alice, alice, created_at=r.clock()).to_wire(),
            token=token,
        )
        await r.server.cleanup_once()
        health = await r.http.get(r.url.split("/meshline")[0] + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        text = (await r.http.get(r.url.split("/meshline")[0] + "/metrics")).text
        assert 'meshline_relay_requests_total{method="message.send",transport="http"} 1.0' in text
        assert "meshline_relay_timeline_appends_total 1.0" in text
        assert "meshline_relay_cleanup_runs_total" in text
        assert "meshline_relay_errors_total" in text


async def test_device_state_resolve_signed_fields(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice = make_account()
        await r.publish(alice)
        token = await r.login(alice)
        resp = await r.http.get(
            r.url + "/device/state/resolve",
            params={"account": alice.account, "created_at": "1"},
            headers={"X-Meshline-Session": token},
        )
        assert resp.status_code == 400 and resp.json()["code"] == "bad_request"
        # Signed queries are evaluated now: an incomplete one is malformed (never a fallback
        # to a read by account), a complete one for one's own account is forbidden.
        signed = {"$type": "meshline.device.state.resolve", "account": alice.account}
        status = await r.call("device.state.resolve", signed, token=token, verb="POST")
        assert status.status_code == 400 and status.json()["code"] == "bad_request"
        dev = alice.device()
        invite = issue_invite(
            dev.keys, dev.device_id, r.context, inviter=alice.account, expires_at=r.clock() + 60
        )
        own = sign_state_query(
            dev.keys,
            dev.certificate,
            r.context,
            account=alice.account,
            authorization=invite,
            created_at=r.clock(),
        )
        status = await r.call("device.state.resolve", own.to_wire(), token=token, verb="POST")
        assert status.status_code == 403 and status.json()["code"] == "forbidden"


async def test_session_expiry_is_capped_by_the_device_certificate(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn, session_ttl=10**9) as r:
        alice = make_account()
        await r.publish(alice)
        challenge = await r.ok("auth.challenge", {"account": alice.account})
        creds = await r.ok(
            "auth.device.verify", r.device_verify_params(alice, alice.device(), challenge["nonce"])
        )
        assert creds["expires_at"] == alice.device().certificate.expires_at


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_serves_https_and_binds_the_https_origin(sqlite_dsn: str, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    async with start_relay(sqlite_dsn, tls_cert=cert, tls_key=key) as r:
        assert r.url.startswith("https://") and r.ws_url.startswith("wss://")
        assert r.server.relay.origin == r.url.split("/meshline")[0]
        async with httpx.AsyncClient(verify=False) as http:  # self-signed test certificate
            resp = await http.get(r.url + "/relay/info")
        assert resp.status_code == 200 and resp.json()["relay_id"] == r.relay_id


async def test_oversized_envelope_is_request_too_large_on_both_transports(sqlite_dsn: str) -> None:
    async with start_relay(sqlite_dsn) as r:
        alice, bob = make_account(), make_account()
        await r.publish(alice)
        await r.publish(bob)
        token = await r.login(alice)
        wire = make_send_params(alice, bob, created_at=r.clock()).to_wire()
        wire["envelope"]["x_padding"] = "p" * 300_000  # the envelope limit is 256 KiB
        assert await r.error("message.send", wire, token=token) == (413, "request_too_large")
        async with WsClient.connect(r.ws_url) as ws:
            challenge = await ws.result("auth.challenge", {"account": alice.account})
            await ws.result(
                "auth.device.verify",
                r.device_verify_params(alice, alice.device(), challenge["nonce"]),
            )
            answer = await ws.request("message.send", wire)
            assert answer["error"]["code"] == -32015
