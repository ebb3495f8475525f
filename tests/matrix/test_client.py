"""`MatrixClient._send` policy, driven through ``httpx.MockTransport``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gapline.matrix import (
    MatrixClient,
    MatrixError,
    MatrixHTTPError,
    MatrixProtocolError,
    MatrixUnavailable,
    RateLimited,
    RetryPolicy,
    Session,
    UnknownToken,
    api,
)

SESSION = Session("https://hs.example", "@me:example", "DEV", "secret-token")
OK_SYNC = {"next_batch": "s1"}


class Recorder:
    """A scripted server: answers come from a list; every request is kept."""

    def __init__(self, *answers: httpx.Response | Exception | Callable[[], httpx.Response]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return answer()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def client(self, **kwargs: Any) -> MatrixClient:
        return MatrixClient(
            "https://hs.example/",
            session=SESSION,
            transport=httpx.MockTransport(self.handler),
            sleep=self.sleep,
            **kwargs,
        )


def j(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


async def test_token_rides_in_header_never_in_url_or_repr() -> None:
    rec = Recorder(j(200, OK_SYNC))
    async with rec.client() as client:
        await client.sync(since="s0", timeout_ms=0)
        assert "secret-token" not in repr(client)
        assert "secret-token" not in repr(client.session)
    (request,) = rec.requests
    assert request.headers["authorization"] == "Bearer secret-token"
    assert "secret-token" not in str(request.url)
    assert "access_token" not in str(request.url)
    assert request.url.path == "/_matrix/client/v3/sync"


async def test_percent_encoded_path_reaches_the_wire_intact() -> None:
    rec = Recorder(j(200, {"chunk": [], "start": "t1"}))
    async with rec.client() as client:
        await client.messages("!a/b#c:x", from_="t 1", limit=5)
    raw = rec.requests[0].url.raw_path.decode()
    assert raw.startswith("/_matrix/client/v3/rooms/%21a%2Fb%23c%3Ax/messages?")
    assert rec.requests[0].url.params["from"] == "t 1"


async def test_429_waits_retry_after_ms_then_succeeds() -> None:
    limited = j(429, {"errcode": "M_LIMIT_EXCEEDED", "error": "slow", "retry_after_ms": 1234})
    rec = Recorder(limited, limited, j(200, OK_SYNC))
    async with rec.client() as client:
        answer = await client.sync()
    assert answer.next_batch == "s1"
    assert rec.sleeps == [1.234, 1.234]
    assert len(rec.requests) == 3


async def test_429_retried_even_for_non_idempotent_requests() -> None:
    rec = Recorder(
        j(429, {"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 10}), j(200, {"room_id": "!r:x"})
    )
    async with rec.client() as client:
        assert await client.create_room(name="x") == "!r:x"
    assert rec.sleeps == [0.01]


async def test_429_asking_too_long_is_raised_at_once() -> None:
    rec = Recorder(j(429, {"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 600_000}))
    async with rec.client() as client:
        with pytest.raises(RateLimited) as info:
            await client.whoami()
    assert info.value.retry_after_ms == 600_000
    assert rec.sleeps == []


async def test_429_bounded_attempts() -> None:
    rec = Recorder(j(429, {"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 5}))
    async with rec.client(retry=RetryPolicy(rate_limit_attempts=3)) as client:
        with pytest.raises(RateLimited):
            await client.whoami()
    assert len(rec.requests) == 3 and rec.sleeps == [0.005, 0.005]


async def test_5xx_retried_with_growing_backoff_then_unavailable() -> None:
    rec = Recorder(j(502, {"errcode": "M_UNKNOWN", "error": "bad gateway"}))
    policy = RetryPolicy(attempts=4, backoff_initial=1.0, backoff_max=3.0)
    async with rec.client(retry=policy) as client:
        with pytest.raises(MatrixUnavailable) as info:
            await client.messages("!r:x", limit=1)
    assert info.value.status == 502
    assert len(rec.requests) == 4
    assert len(rec.sleeps) == 3
    # jitter keeps each delay within [50%, 100%] of min(max, initial * 2**n)
    for delay, ceiling in zip(rec.sleeps, [1.0, 2.0, 3.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling


async def test_5xx_then_success() -> None:
    rec = Recorder(j(503, {}), j(200, {"chunk": [], "start": "t1"}))
    async with rec.client() as client:
        page = await client.messages("!r:x")
    assert page.start == "t1" and len(rec.requests) == 2


async def test_5xx_not_retried_for_non_idempotent() -> None:
    rec = Recorder(j(500, {"errcode": "M_UNKNOWN"}), j(200, {"room_id": "!r:x"}))
    async with rec.client() as client:
        with pytest.raises(MatrixUnavailable):
            await client.create_room()
    assert len(rec.requests) == 1 and rec.sleeps == []


async def test_send_retries_reuse_the_same_txn_id() -> None:
    rec = Recorder(httpx.ReadTimeout("slow"), j(500, {}), j(200, {"event_id": "$e"}))
    async with rec.client() as client:
        assert await client.send_text("!r:x", "hi") == "$e"
    paths = {r.url.raw_path for r in rec.requests}
    assert len(rec.requests) == 3 and len(paths) == 1
    assert all(r.method == "PUT" for r in rec.requests)


@pytest.mark.parametrize(
    "error",
    [
        httpx.ReadTimeout("read timed out"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("connection reset"),
    ],
)
async def test_transport_errors_map_to_unavailable_after_retries(error: Exception) -> None:
    rec = Recorder(error)
    async with rec.client(retry=RetryPolicy(attempts=3)) as client:
        with pytest.raises(MatrixUnavailable) as info:
            await client.sync()
    assert info.value.status is None
    assert isinstance(info.value.__cause__, httpx.TransportError)
    assert len(rec.requests) == 3


async def test_timeout_not_retried_for_non_idempotent_post() -> None:
    rec = Recorder(httpx.ReadTimeout("slow"))
    async with rec.client() as client:
        with pytest.raises(MatrixUnavailable):
            await client.upload(b"x")
    assert len(rec.requests) == 1


async def test_connect_error_retried_for_any_method() -> None:
    rec = Recorder(httpx.ConnectError("refused"), j(200, {"room_id": "!r:x"}))
    async with rec.client() as client:
        assert await client.create_room() == "!r:x"
    assert len(rec.requests) == 2


async def test_malformed_success_body_is_protocol_error_not_retried() -> None:
    rec = Recorder(
        httpx.Response(200, content=b'{"chunk": [', headers={"content-type": "application/json"})
    )
    async with rec.client() as client:
        with pytest.raises(MatrixProtocolError):
            await client.messages("!r:x")
    assert len(rec.requests) == 1


async def test_client_errors_are_typed_and_not_retried() -> None:
    rec = Recorder(j(401, {"errcode": "M_UNKNOWN_TOKEN", "error": "Unrecognised access token"}))
    async with rec.client() as client:
        with pytest.raises(UnknownToken):
            await client.whoami()
    rec2 = Recorder(j(400, {"errcode": "M_INVALID_PARAM", "error": "bad"}))
    async with rec2.client() as client:
        with pytest.raises(MatrixHTTPError) as info:
            await client.messages("!r:x", from_="junk")
    assert info.value.errcode == "M_INVALID_PARAM"
    assert len(rec.requests) == len(rec2.requests) == 1


async def test_sync_read_timeout_covers_the_long_poll() -> None:
    rec = Recorder(j(200, OK_SYNC))
    async with rec.client(timeout=20.0, long_poll_margin=5.0) as client:
        await client.sync(since="s0", timeout_ms=30_000)
    timeout = rec.requests[0].extensions["timeout"]
    assert timeout["read"] == pytest.approx(20.0 + 30.0 + 5.0)
    assert timeout["connect"] == pytest.approx(20.0)


async def test_authenticated_call_without_login_fails_before_io() -> None:
    rec = Recorder(j(200, {}))
    async with MatrixClient(
        "https://hs.example", transport=httpx.MockTransport(rec.handler)
    ) as client:
        with pytest.raises(MatrixError, match="login"):
            await client.whoami()
    assert rec.requests == []


async def test_login_stores_and_reuses_device() -> None:
    def answer() -> httpx.Response:
        body = json.loads(rec.requests[-1].content)
        return j(
            200,
            {"user_id": "@me:x", "access_token": "tok2", "device_id": body.get("device_id", "NEW")},
        )

    rec = Recorder(answer)
    async with MatrixClient(
        "https://hs.example", transport=httpx.MockTransport(rec.handler)
    ) as client:
        session = await client.login("me", "pw", device_id="DEV")
        assert session == Session("https://hs.example", "@me:x", "DEV", "tok2")
        assert client.session == session and client.logged_in
    sent = json.loads(rec.requests[0].content)
    assert sent["device_id"] == "DEV"
    assert sent["identifier"] == {"type": "m.id.user", "user": "me"}
    assert "authorization" not in rec.requests[0].headers
    assert Session.from_dict(session.to_dict()) == session
    with pytest.raises(ValueError):
        Session.from_dict({"homeserver": "x"})


async def test_logout_forgets_token() -> None:
    rec = Recorder(j(200, {}))
    async with rec.client() as client:
        await client.logout()
        assert client.session is None and not client.logged_in


async def test_cancellation_propagates() -> None:
    started = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        started.set()
        await asyncio.sleep(3600)
        return j(200, OK_SYNC)

    async with MatrixClient(
        "https://hs.example", session=SESSION, transport=httpx.MockTransport(hang)
    ) as client:
        task = asyncio.create_task(client.sync())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_download_requires_mxc() -> None:
    rec = Recorder(httpx.Response(200, content=b"bytes"))
    async with rec.client() as client:
        assert await client.download("mxc://x.org/abc") == b"bytes"
        with pytest.raises(ValueError):
            await client.download("https://x.org/abc")
    assert rec.requests[0].url.path == "/_matrix/client/v1/media/download/x.org/abc"


async def test_request_hook_for_sans_io_callers() -> None:
    rec = Recorder(j(200, {"chunk": [], "start": "t1", "end": "t0"}))
    async with rec.client() as client:
        from gapline.matrix import MessagesResponse

        page = await client.request(api.messages("!r:x", limit=1), MessagesResponse)
    assert page.end == "t0"


@pytest.mark.parametrize(
    ("error", "mapped"),
    [
        (httpx.ConnectError("x"), MatrixUnavailable),
        (httpx.ConnectTimeout("x"), MatrixUnavailable),
        (httpx.ReadTimeout("x"), MatrixUnavailable),
        (httpx.WriteTimeout("x"), MatrixUnavailable),
        (httpx.PoolTimeout("x"), MatrixUnavailable),
        (httpx.ReadError("x"), MatrixUnavailable),
        (httpx.WriteError("x"), MatrixUnavailable),
        (httpx.CloseError("x"), MatrixUnavailable),
        (httpx.RemoteProtocolError("x"), MatrixUnavailable),
        (httpx.LocalProtocolError("x"), MatrixUnavailable),
        (httpx.ProxyError("x"), MatrixUnavailable),
        (httpx.DecodingError("x"), MatrixProtocolError),
        (httpx.UnsupportedProtocol("x"), MatrixError),
    ],
)
async def test_every_httpx_error_is_mapped(error: Exception, mapped: type[Exception]) -> None:
    rec = Recorder(error)
    async with rec.client(retry=RetryPolicy(attempts=1)) as client:
        with pytest.raises(MatrixError) as info:
            await client.whoami()
    assert type(info.value) is mapped
    assert info.value.__cause__ is error
