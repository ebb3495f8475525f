"""Hypothesis fuzz of every HTTP method: no input makes the relay answer 5xx, and every
refusal is a RelayError object with a spec code."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gapline.meshline import HTTP_STATUS_BY_CODE, issue_grant
from gapline.meshline.testing import make_account, make_send_params
from tests.relay.harness import VERBS, start_relay

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


class Live:
    def __init__(self, url: str, token: str, valid_send: dict[str, Any]) -> None:
        self.url = url
        self.token = token
        self.valid_send = valid_send


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A relay on its own event-loop thread, so sync Hypothesis tests can drive it."""
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        dsn = str(Path(tmp_path_factory.mktemp("fuzz")) / "relay.db")
        async with start_relay(dsn) as r:
            alice, bob = make_account(), make_account()
            await r.publish(alice)
            await r.publish(bob)
            token = await r.login(alice)
            send = make_send_params(alice, bob, created_at=r.clock()).to_wire()
            dev = bob.device()
            grant = issue_grant(
                dev.keys, dev.device_id, r.context, grantor=bob.account, grantee=alice.account
            )
            send["authorization"] = grant.to_wire()  # evaluated even though bob is public
            ready["live"] = Live(r.url, token, send)
            started.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert started.wait(60), "relay did not start"
    try:
        yield ready["live"]
    finally:
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
