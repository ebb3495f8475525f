"""Hypothesis fuzz of every relay method on both transports: JSON bodies, query strings,
session headers, raw HTTP framing and WebSocket frames. No input makes the relay answer
5xx (or JSON-RPC -32603), every refusal is a RelayError object with a spec code, nothing
it logs carries a traceback, and it is healthy afterwards.

One relay serves the whole module (on its own event-loop thread, so the synchronous
Hypothesis tests can drive it); its log records are captured from the start. The
methods come from the relay's own table, so a method added later is fuzzed too. Example
counts are fixed and small: the module runs in about a minute on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from gapline.meshline import HTTP_STATUS_BY_CODE, issue_grant
from gapline.meshline.testing import make_account, make_send_params
from tests.relay.harness import VERBS, start_relay
from tests.relay.logcapture import Captured, capture_logs

FIELDS = [
    "account",
    "nonce",
    "timestamp",
    "signer_certificate",
    "device_signature",
    "account_public_key",
    "account_signature",
    "envelope",
    "recipient_boxes",
    "sender_boxes",
    "authorization",
    "message_id",
    "after",
    "limit",
    "$type",
    "revision",
    "certificates",
    "$context",
    "public_discovery",
    "updated_at",
    "expires_at",
    "relay_id",
    "created_at",
    "nickname",
]
CODES = set(HTTP_STATUS_BY_CODE) | {"method_not_found"}

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.text(max_size=40),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), children, max_size=5),
    ),
    max_leaves=20,
)
params_strategy = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)


# Limits the fuzz would otherwise hit by its own volume, not by what it sends.
RELAY_SETTINGS: dict[str, Any] = {
    "rate_per_second": 1e6,
    "rate_burst": 10**6,
    "account_rate_per_second": 1e6,
    "account_burst": 10**6,
    "unauthenticated_rate_per_second": 1e6,
    "unauthenticated_burst": 10**6,
    "challenges_per_address": 10**6,
    "ws_auth_timeout": 3600.0,
    # Short enough that an example whose body never completes costs little.
    "body_timeout": 3.0,
}


class Live:
    def __init__(
        self,
        url: str,
        ws_url: str,
        port: int,
        token: str,
        valid_send: dict[str, Any],
        methods: dict[str, tuple[str, tuple[str, ...]]],
        verify_params: Any,
        logs: Captured,
        server: Any,
    ) -> None:
        self.url = url
        self.ws_url = ws_url
        self.port = port
        self.token = token
        self.valid_send = valid_send
        self.methods = methods  # name -> (HTTP verb, query field names)
        self.verify_params = verify_params  # nonce -> auth.device.verify params for alice
        self.logs = logs
        self.server = server
        self._ws: dict[bool, ClientConnection] = {}
        self._opened = contextlib.ExitStack()
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def ws(self, authed: bool) -> ClientConnection:
        """A WebSocket to the relay (device session bound when ``authed``), reopened if closed."""
        conn = self._ws.get(authed)
        if conn is not None and conn.protocol.close_code is None:
            return conn
        conn = self._opened.enter_context(ws_connect(self.ws_url, max_size=None, open_timeout=30))
        if authed:
            nonce = self.rpc(conn, "auth.challenge", {"account": self.verify_params.account})
            self.rpc(conn, "auth.device.verify", self.verify_params(nonce["result"]["nonce"]))
        self._ws[authed] = conn
        return conn

    def rpc(self, conn: ClientConnection, method: str, params: Any) -> dict[str, Any]:
        id_ = self.next_id()
        conn.send(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}))
        return read_answer(conn, id_)

    def close(self) -> None:
        self._opened.close()


def read_answer(conn: ClientConnection, id_: Any) -> dict[str, Any]:
    """The next message that is not a notification (a response carries ``id``)."""
    while True:
        msg = json.loads(conn.recv(timeout=30))
        if "method" in msg and "id" not in msg:
            continue  # a notification hint
        if id_ is not None and msg.get("id") not in (id_, None):
            continue  # a late answer to an earlier frame
        return msg


class _AliceVerify:
    def __init__(self, relay: Any, alice: Any) -> None:
        self.relay, self.alice, self.account = relay, alice, alice.account

    def __call__(self, nonce: str) -> dict[str, Any]:
        return self.relay.device_verify_params(self.alice, self.alice.device(), nonce)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A relay on its own event-loop thread, so sync Hypothesis tests can drive it."""
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def serve(logs: Captured) -> None:
        nonlocal stop
        stop = asyncio.Event()
        dsn = str(Path(tmp_path_factory.mktemp("fuzz")) / "relay.db")
        async with start_relay(dsn, **RELAY_SETTINGS) as r:
            alice, bob = make_account(), make_account()
            await r.publish(alice)
            await r.publish(bob)
            token = await r.login(alice)
            methods = {
                name: (m.http_verb, tuple(m.query)) for name, m in r.server.relay.methods.items()
            }
            send = make_send_params(alice, bob, created_at=r.clock()).to_wire()
            dev = bob.device()
            grant = issue_grant(
                dev.keys, dev.device_id, r.context, grantor=bob.account, grantee=alice.account
            )
            send["authorization"] = grant.to_wire()  # evaluated even though bob is public
            ready["live"] = Live(
                r.url,
                r.ws_url,
                r.server.port,
                token,
                send,
                methods,
                _AliceVerify(r, alice),
                logs,
                r.server,
            )
            started.set()
            await stop.wait()

    with capture_logs() as logs:
        thread = threading.Thread(target=lambda: loop.run_until_complete(serve(logs)), daemon=True)
        thread.start()
        assert started.wait(60), "relay did not start"
        try:
            yield ready["live"]
        finally:
            ready["live"].close()
            assert stop is not None
            loop.call_soon_threadsafe(stop.set)
            thread.join(30)
            loop.close()


def _check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, resp.text
    if resp.status_code not in (200, 204):
        body = resp.json()
        assert body["code"] in CODES and isinstance(body["message"], str), body


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=st.sampled_from(sorted(VERBS)),
    params=params_strategy,
    with_session=st.booleans(),
)
def test_json_bodies_and_queries_never_5xx(
    live: Live, method: str, params: dict[str, Any], with_session: bool
) -> None:
    headers = {"X-Meshline-Session": live.token} if with_session else {}
    url = live.url + "/" + method.replace(".", "/")
    with httpx.Client(timeout=30) as client:
        if VERBS[method] == "GET":
            query = {k: str(v) for k, v in params.items() if not isinstance(v, dict | list)}
            resp = client.get(url, params=query, headers=headers)
        else:
            resp = client.request(VERBS[method], url, json=params, headers=headers)
    _check(resp)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.lists(
        st.sampled_from(["envelope", "recipient_boxes", "sender_boxes", "authorization"]),
        min_size=1,
        max_size=1,
    ),
    value=json_values,
    key=st.text(max_size=12),
)
def test_mutated_valid_sends_never_5xx(live: Live, path: list[str], value: Any, key: str) -> None:
    params = dict(live.valid_send)
    target = params[path[0]]
    if isinstance(target, dict):
        params[path[0]] = {**target, key: value}
    elif isinstance(target, list) and target:
        params[path[0]] = [{**target[0], key: value}, *target[1:]]
    with httpx.Client(timeout=30) as client:
        resp = client.post(
            live.url + "/message/send", json=params, headers={"X-Meshline-Session": live.token}
        )
    _check(resp)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.binary(max_size=200),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/json; charset=utf-16", ""]
    ),
)
def test_raw_bodies_never_5xx(live: Live, body: bytes, content_type: str) -> None:
    with httpx.Client(timeout=30) as client:
        for method in ("auth.challenge", "message.send", "device.state.publish"):
            headers = {"X-Meshline-Session": live.token}
            if content_type:
                headers["Content-Type"] = content_type
            resp = client.request(
                VERBS[method],
                live.url + "/" + method.replace(".", "/"),
                content=body,
                headers=headers,
            )
            _check(resp)


# -- query strings, session headers and verbs, over every method --------------------------

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
VISIBLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
query_values = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(1, 6000).map(lambda n: "9" * n),
    st.integers(1, 30).map(lambda n: "0" * n + "7"),
    st.sampled_from(["", "-0", "-1", "1.0", "1e3", "0x10", "true", "null", "١٢", "%zz", "+5"]),
    st.text(max_size=60),
)
session_values = st.one_of(
    st.none(),
    st.just("<valid>"),
    st.text(VISIBLE, min_size=1, max_size=300),
    st.integers(257, 9000).map(lambda n: "t" * n),
    st.sampled_from(["", "Bearer x", "a b"]),
)


def _no_tracebacks(live: Live) -> None:
    assert live.logs.tracebacks() == []


def _session(live: Live, value: str | None) -> dict[str, str]:
    if value is None:
        return {}
    return {"X-Meshline-Session": live.token if value == "<valid>" else value}


@FUZZ
@given(data=st.data(), session=session_values)
def test_query_strings_and_headers_never_5xx(
    live: Live, data: st.DataObject, session: str | None
) -> None:
    name = data.draw(st.sampled_from(sorted(live.methods)), label="method")
    verb, fields = live.methods[name]
    keys = st.sampled_from([*fields, "after", "limit", "account"]) | st.text(max_size=10)
    pairs = data.draw(st.lists(st.tuples(keys, query_values), max_size=6), label="pairs")
    raw = "&".join(
        f"{httpx.URL('', params={k: v}).query.decode()}" if k or v else "&" for k, v in pairs
    )
    raw += data.draw(st.sampled_from(["", "&", "&&=", "=", "%", "&a", "#x"]), label="tail")
    verb = data.draw(st.sampled_from([verb, verb, "GET", "POST", "PUT", "DELETE"]), label="verb")
    headers = _session(live, session)
    headers.update(data.draw(st.sampled_from([{}, {"Content-Type": "text/plain"}]), label="ct"))
    url = live.url + "/" + name.replace(".", "/") + ("?" + raw if raw else "")
    with httpx.Client(timeout=30) as client:
        resp = client.request(verb, url, headers=headers)
    _check(resp)
    _no_tracebacks(live)


@FUZZ
@given(data=st.data(), session=session_values, params=params_strategy)
def test_bodies_over_every_method_never_5xx(
    live: Live, data: st.DataObject, session: str | None, params: dict[str, Any]
) -> None:
    name = data.draw(st.sampled_from(sorted(live.methods)), label="method")
    verb = live.methods[name][0]
    url = live.url + "/" + name.replace(".", "/")
    with httpx.Client(timeout=30) as client:
        if verb == "GET":
            query = {
                k: json.dumps(v) if isinstance(v, dict | list) else str(v)
                for k, v in params.items()
            }
            resp = client.get(url, params=query, headers=_session(live, session))
        else:
            resp = client.request(verb, url, json=params, headers=_session(live, session))
    _check(resp)
    _no_tracebacks(live)


# -- WebSocket frames, unauthenticated and on a bound device session ------------------------

ids = st.one_of(
    st.integers(-(2**60), 2**60),
    st.text(max_size=140),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.floats(allow_nan=False, allow_infinity=False),
)


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= 2**53 - 1
    return isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) <= 128


@settings(FUZZ, max_examples=500)
@given(data=st.data(), authed=st.booleans())
def test_websocket_frames_never_internal_error(
    live: Live, data: st.DataObject, authed: bool
) -> None:
    names = sorted(live.methods)
    request = st.fixed_dictionaries(
        {
            "jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2]),
            "id": ids,
            "method": st.sampled_from(names) | st.text(max_size=20),
        },
        optional={"params": params_strategy | json_values, "extra": json_values},
    )
    kind = data.draw(st.sampled_from(["request", "request", "garbage", "value", "deep", "big"]))
    id_: Any = None
    if kind == "request":
        msg = data.draw(request, label="request")
        id_ = msg["id"] if _valid_id(msg["id"]) else None
        frame = json.dumps(msg)
    elif kind == "garbage":
        frame = data.draw(st.text(max_size=200), label="garbage")
    elif kind == "value":
        frame = json.dumps(data.draw(json_values, label="value"))
    elif kind == "deep":
        depth = data.draw(st.integers(10, 3000), label="depth")
        frame = '{"jsonrpc":"2.0","id":1,"method":"relay.info","params":{"a":' + "[" * depth
        frame += "]" * depth + "}}"
    else:
        digits = data.draw(st.integers(17, 6000), label="digits")
        method = data.draw(st.sampled_from(names), label="method")
        frame = (
            f'{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{{"limit":{"9" * digits}}}}}'
        )
    conn = live.ws(authed)
    conn.send(frame)
    answer = read_answer(conn, id_)
    assert answer.get("jsonrpc") == "2.0", answer
    assert ("result" in answer) != ("error" in answer), answer
    if "error" in answer:
        assert isinstance(answer["error"]["code"], int) and answer["error"]["code"] != -32603
        assert isinstance(answer["error"]["message"], str)
    if id_ is not None:
        assert answer["id"] in (id_, None)
    _no_tracebacks(live)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.binary(max_size=64))
def test_binary_frames_close_1003_and_the_next_connection_works(live: Live, payload: bytes) -> None:
    conn = live.ws(False)
    conn.send(payload)
    with pytest.raises(websockets.ConnectionClosed) as info:
        while True:
            conn.recv(timeout=30)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1003
    assert "result" in live.rpc(live.ws(False), "relay.info", {})
    _no_tracebacks(live)


# -- raw HTTP framing ------------------------------------------------------------------

HEADER_NAMES = [
    "Host",
    "Content-Length",
    "Content-Type",
    "Transfer-Encoding",
    "X-Meshline-Session",
    "Connection",
    "Upgrade",
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Content-Encoding",
    "Expect",
]
header_values = st.one_of(
    st.sampled_from(
        [
            "0",
            "5",
            "-1",
            "18446744073709551616",
            "9" * 40,
            "chunked",
            "gzip",
            "websocket",
            "Upgrade",
            "13",
            "dGhlIHNhbXBsZSBub25jZQ==",
            "application/json",
            "100-continue",
            "application/json; charset=latin-1",
            "close",
            "keep-alive",
            "",
        ]
    ),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40),
)


def _first_response(sock: socket.socket, verb: str) -> tuple[int, bytes, bytes]:
    """(status, head, body) of the first non-1xx response, or (0, b"", b"") on a close."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0, b"", b""
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 200 or status == 101:
            break
    length = 0
    for line in head.split(b"\r\n")[1:] if verb != "HEAD" else ():
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            length = int(value)
    while len(data) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return status, head, data[:length]


@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_raw_http_framing_never_5xx(live: Live, data: st.DataObject) -> None:
    paths = ["/meshline/v1/" + n.replace(".", "/") for n in sorted(live.methods)]
    verb = data.draw(st.sampled_from(["GET", "POST", "PUT", "HEAD", "OPTIONS", "G\x00T", "BREW"]))
    path = data.draw(
        st.sampled_from([*paths, "/meshline/v1", "/health", "/", "*"])
        | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30).map(
            lambda t: "/" + t
        )
    )
    version = data.draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/x"]))
    headers = data.draw(
        st.lists(st.tuples(st.sampled_from(HEADER_NAMES), header_values), max_size=6)
    )
    body = data.draw(st.binary(max_size=200))
    lines = [f"{verb} {path} {version}", "Host: fuzz", *(f"{k}: {v}" for k, v in headers)]
    chunked = any(k == "Transfer-Encoding" and "chunked" in v for k, v in headers)
    declared = [v for k, v in headers if k == "Content-Length"]
    if chunked:
        body += b"\r\n0\r\n\r\n"  # most chunk streams end here; a broken one is refused
    elif declared and declared[0].isdigit() and int(declared[0]) <= 4096:
        body = body.ljust(int(declared[0]), b" ")  # never leave the relay waiting for a body
    raw = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", live.port), timeout=30) as sock:
        sock.sendall(raw)
        status, head, payload = _first_response(sock, verb)
    assert status < 500, (raw[:200], head, payload)
    if status >= 400 and verb != "HEAD":
        assert b"application/json" in head.lower(), head
        error = json.loads(payload)
        assert error["code"] in CODES or error["code"] == "not_found", error
    _no_tracebacks(live)


def test_relay_is_healthy_after_the_fuzz(live: Live) -> None:
    """Runs last in this module: the relay still answers, and no error was unexpected."""
    with httpx.Client(timeout=30) as client:
        base = live.url.split("/meshline")[0]
        health = client.get(base + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        sync = client.get(
            live.url + "/message/timeline/sync", headers={"X-Meshline-Session": live.token}
        )
        assert sync.status_code == 200, sync.text
        metrics = client.get(base + "/metrics").text
    assert "meshline_relay_internal_errors_total{" not in metrics
    assert 'code="internal_error"' not in metrics
    assert "result" in live.rpc(live.ws(True), "message.timeline.sync", {})
    _no_tracebacks(live)
