"""What a homeserver's answer can make a client hold: bodies are capped (also after
decompression) and read no further, deep or oversized JSON is a `MatrixProtocolError`,
and hostile headers or shapes never escape as anything else."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from gapline.matrix import MatrixClient, MatrixProtocolError, RateLimited, RetryPolicy, Session
from gapline.matrix._client import MAX_RESPONSE_BYTES

SESSION = Session("https://hs.example", "@me:example", "DEV", "secret-token")
LIMIT = 64 * 1024


def client(
    handler: httpx.MockTransport, *, limit: int = LIMIT, retry: RetryPolicy | None = None
) -> MatrixClient:
    async def no_sleep(_: float) -> None:
        return None

    return MatrixClient(
        "https://hs.example",
        session=SESSION,
        transport=handler,
        sleep=no_sleep,
        max_response_bytes=limit,
        retry=retry or RetryPolicy(),
    )


def test_the_default_cap_is_documented_and_generous() -> None:
    assert MatrixClient("https://hs.example").max_response_bytes == MAX_RESPONSE_BYTES
    assert MAX_RESPONSE_BYTES >= 32 * 1024 * 1024


async def test_an_endless_body_is_refused_and_read_no_further() -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"next_batch": "s1", "pad": "'
        while True:
            sent += 1
            yield b"x" * 4096

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=endless()))
    async with client(transport) as c:
        with pytest.raises(MatrixProtocolError, match="larger than"):
            await c.sync(timeout_ms=0)
    assert sent <= LIMIT // 4096 + 2  # stopped at the cap, not at the end of the stream


async def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    body = json.dumps({"next_batch": "s1", "pad": "x" * (2 * LIMIT)}).encode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    async with client(transport) as c:
        with pytest.raises(MatrixProtocolError, match="larger than"):
            await c.sync(timeout_ms=0)


async def test_a_compressed_bomb_is_capped_after_decompression() -> None:
    bomb = gzip.compress(b'{"next_batch": "s1", "pad": "' + b"0" * (50 * LIMIT) + b'"}')
    assert len(bomb) < LIMIT
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=bomb, headers={"Content-Encoding": "gzip"})
    )
    async with client(transport) as c:
        with pytest.raises(MatrixProtocolError, match="larger than"):
            await c.sync(timeout_ms=0)


@pytest.mark.parametrize(
    "body",
    [
        b'{"next_batch": "s1", "account_data": {"events": ['
        + b"[" * 50_000
        + b"]" * 50_000
        + b"]}}",
        b'{"next_batch": "s1", "account_data": {"events": [{"type": "t", "content": {"n": '
        + b"9" * 5000
        + b"}}]}}",
        b'{"next_batch": "s1", "rooms": {"join": {"!r:x": {"timeline": {"events": [{"type": 1}]}}}}}',
    ],
)
async def test_deep_huge_or_misshapen_json_is_a_protocol_error(body: bytes) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    async with client(transport, limit=MAX_RESPONSE_BYTES) as c:
        with pytest.raises(MatrixProtocolError):
            await c.sync(timeout_ms=0)


async def test_error_bodies_are_capped_and_hostile_retry_after_is_ignored() -> None:
    answers = [
        httpx.Response(429, content=b"x" * (2 * LIMIT)),
        httpx.Response(429, json={"errcode": "M_LIMIT_EXCEEDED"}, headers={"Retry-After": "1e400"}),
    ]
    transport = httpx.MockTransport(lambda request: answers.pop(0))
    async with client(transport) as c:
        with pytest.raises(MatrixProtocolError, match="larger than"):
            await c.sync(timeout_ms=0)
    transport = httpx.MockTransport(lambda request: answers[0])
    retry = RetryPolicy(rate_limit_attempts=2)
    async with client(transport, retry=retry) as c:
        with pytest.raises(RateLimited) as info:
            await c.sync(timeout_ms=0)
    assert info.value.retry_after_ms is None


async def test_a_flood_of_events_with_relations_pointing_anywhere_parses() -> None:
    events = [
        {
            "type": "m.room.message",
            "event_id": f"$e{i}",
            "sender": "@a:x",
            "origin_server_ts": i,
            "content": {
                "body": "hi",
                "m.relates_to": {"rel_type": "m.thread", "event_id": target},
            },
        }
        for i, target in enumerate(["$nowhere", "", "not an id", "$e0", "🙃" * 50] * 400)
    ]
    body = {"next_batch": "s1", "rooms": {"join": {"!r:x": {"timeline": {"events": events}}}}}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    async with client(transport, limit=MAX_RESPONSE_BYTES) as c:
        sync = await c.sync(timeout_ms=0)
    assert len(sync.rooms.join["!r:x"].timeline.events) == 2000
