"""`MatrixClient`: the async I/O shell around the pure builders in `_api`.

Every public method is glue (build a `Request`, `await self.request(...)`);
one private `_send` owns all policy, so it is written and tested once:

- the ``Authorization: Bearer`` header (the token never enters a URL);
- 429 / ``M_LIMIT_EXCEEDED``: wait ``retry_after_ms`` and try again, up to a
  bound, for any method (a refused request had no effect);
- timeouts, connection errors and 5xx: bounded retries with exponential
  backoff, but only for requests marked idempotent (``PUT .../send/{txnId}``
  is: the server dedupes on the transaction ID). A connection that was never
  established is retried for every method;
- per-request timeouts: the ``/sync`` long-poll hold plus a margin;
- a bound on what one answer may make us hold: a body over ``max_response_bytes``
  (default :data:`MAX_RESPONSE_BYTES`, counted after content decoding, so a
  compressed bomb stops there too) is a `MatrixProtocolError`, read no further;
- mapping of httpx failures into `gapline.matrix` errors in one context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import msgspec

from . import _api, _session_api
from ._client_backup import BackupEndpoints
from ._client_keys import KeysEndpoints
from ._client_rooms import RoomEndpoints
from ._client_user import UserEndpoints
from ._errors import MatrixError, MatrixProtocolError, MatrixUnavailable, RateLimited
from ._request import Direction, Request
from ._responses import (
    ClientEvent,
    ContextResponse,
    EmptyResponse,
    LoginResponse,
    MessagesResponse,
    RegisterResponse,
    RelationsResponse,
    SendResponse,
    SyncResponse,
    WhoAmIResponse,
    parse,
    parse_error,
)
from ._session_api import DevicesResponse, LoginFlowsResponse

__all__ = ["MAX_RESPONSE_BYTES", "MatrixClient", "RetryPolicy", "Session"]

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""Largest response body a client reads (an initial /sync of a big account fits)."""

log = logging.getLogger("gapline.matrix")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Session:
    """What a caller persists to come back as the same device.

    Restoring a session (``MatrixClient(..., session=s)``) or logging in with
    ``device_id=s.device_id`` keeps the device, so read markers, to-device
    state and the server's view of the sync position stay continuous.
    The token is excluded from ``repr``.
    """

    homeserver: str
    user_id: str
    device_id: str
    access_token: str = field(repr=False)

    def to_dict(self) -> dict[str, str]:
        return {
            "homeserver": self.homeserver,
            "user_id": self.user_id,
            "device_id": self.device_id,
            "access_token": self.access_token,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Session:
        try:
            return cls(
                homeserver=str(data["homeserver"]),
                user_id=str(data["user_id"]),
                device_id=str(data["device_id"]),
                access_token=str(data["access_token"]),
            )
        except KeyError as exc:
            raise ValueError(f"stored session lacks {exc.args[0]!r}") from exc


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds of `MatrixClient`'s retries. ``attempts`` counts the first try.

    ``rate_limit_max_wait`` caps how long one 429 may make us wait: a server
    asking for more is surfaced as `RateLimited` instead of stalling the caller.
    """

    attempts: int = 4
    backoff_initial: float = 0.25
    backoff_max: float = 8.0
    rate_limit_attempts: int = 8
    rate_limit_max_wait: float = 30.0

    def backoff(self, retry: int) -> float:
        """Delay before retry number ``retry`` (1-based), with jitter in [50%, 100%]."""
        base = min(self.backoff_max, self.backoff_initial * (2 ** (retry - 1)))
        return base * random.uniform(0.5, 1.0)


NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=1)


@contextlib.contextmanager
def _map_httpx_errors(request: Request) -> Generator[None]:
    """The one place httpx failures become `gapline.matrix` errors.

    Timeouts and transport failures are `MatrixUnavailable` (retryable); a
    body that cannot be decoded (bad gzip) is `MatrixProtocolError`; an URL
    scheme httpx cannot speak is a configuration error, never retried.
    """
    what = f"{request.method} {request.path}"
    try:
        yield
    except httpx.TimeoutException as exc:
        raise MatrixUnavailable(f"{what}: timed out ({type(exc).__name__})") from exc
    except httpx.UnsupportedProtocol as exc:
        raise MatrixError(f"{what}: unusable homeserver URL ({exc})") from exc
    except httpx.TransportError as exc:
        raise MatrixUnavailable(f"{what}: connection failed ({type(exc).__name__}: {exc})") from exc
    except httpx.DecodingError as exc:
        raise MatrixProtocolError(f"{what}: undecodable body ({exc})") from exc
    except httpx.RequestError as exc:
        raise MatrixUnavailable(f"{what}: request failed ({type(exc).__name__}: {exc})") from exc


def _never_sent(exc: MatrixUnavailable) -> bool:
    """True when the request certainly never reached the server (safe to retry any method)."""
    return isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


class MatrixClient(KeysEndpoints, BackupEndpoints, UserEndpoints, RoomEndpoints):
    """Async Matrix client-server access over ``httpx.AsyncClient``.

    The end-to-end key endpoints (``keys_upload``, ``keys_query``, ``keys_claim``,
    ``keys_changes``, ``send_to_device``) come from `KeysEndpoints` (``_client_keys``), key
    backup and cross-signing (``backup_version``, ``room_keys_put``, ``device_signing_upload``,
    ...) from `BackupEndpoints` (``_client_backup``).

    ::

        async with MatrixClient("http://127.0.0.1:8008") as client:
            session = await client.login("@bot:localhost", "pw", device_id=saved_device)
            page = await client.messages(room_id, from_=token, dir="b", limit=50)

    ``transport`` is any httpx transport; tests pass ``httpx.MockTransport``
    (see `gapline.matrix.testing.FakeHomeserver`). ``sleep`` is the coroutine
    used for backoff and rate-limit waits (tests inject a recorder).
    ``trust_env=False`` ignores proxy variables from the environment.
    """

    def __init__(
        self,
        homeserver: str,
        *,
        session: Session | None = None,
        access_token: str | None = None,
        user_id: str | None = None,
        device_id: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy = RetryPolicy(),
        timeout: float = 30.0,
        long_poll_margin: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        user_agent: str = "gapline",
        trust_env: bool = True,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.homeserver = homeserver.rstrip("/")
        self.user_id = user_id
        self.device_id = device_id
        self._access_token = access_token
        if session is not None:
            self.user_id = session.user_id
            self.device_id = session.device_id
            self._access_token = session.access_token
        self.retry = retry
        self.timeout = timeout
        self.long_poll_margin = long_poll_margin
        self.max_response_bytes = max_response_bytes
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.homeserver,
            transport=transport,
            headers={"User-Agent": user_agent},
            follow_redirects=False,
            trust_env=trust_env,  # False: ignore *_PROXY variables (loopback test servers)
        )

    def __repr__(self) -> str:
        return (
            f"MatrixClient(homeserver={self.homeserver!r}, user_id={self.user_id!r}, "
            f"device_id={self.device_id!r})"
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- session ---------------------------------------------------------------------------

    @property
    def access_token(self) -> str | None:
        return self._access_token

    @property
    def logged_in(self) -> bool:
        return self._access_token is not None

    @property
    def session(self) -> Session | None:
        """The current login as a value to persist, or ``None`` before login."""
        if self._access_token is None or self.user_id is None or self.device_id is None:
            return None
        return Session(self.homeserver, self.user_id, self.device_id, self._access_token)

    def restore(self, session: Session) -> None:
        """Adopt a persisted session (no request is made; `whoami` checks it)."""
        self.user_id = session.user_id
        self.device_id = session.device_id
        self._access_token = session.access_token

    # -- the single send path --------------------------------------------------------------

    def _timeout_for(self, request: Request) -> httpx.Timeout:
        read = self.timeout
        if request.long_poll_ms:
            read += request.long_poll_ms / 1000 + self.long_poll_margin
        return httpx.Timeout(self.timeout, read=read)

    def _build(self, request: Request) -> httpx.Request:
        headers: dict[str, str] = {}
        if request.authenticated:
            if self._access_token is None:
                raise MatrixError(f"{request.method} {request.path} needs a login first")
            headers["Authorization"] = f"Bearer {self._access_token}"
        content: bytes | None = request.content
        if request.json is not None:
            content = msgspec.json.encode(request.json)
            headers["Content-Type"] = "application/json"
        elif request.content_type is not None:
            headers["Content-Type"] = request.content_type
        return self._http.build_request(
            request.method,
            request.path,
            params=list(request.query),
            content=content,
            headers=headers,
            timeout=self._timeout_for(request),
        )

    async def _receive(self, response: httpx.Response, request: Request) -> bytes:
        """The body of a streamed response, refused past ``max_response_bytes``."""
        limit = self.max_response_bytes
        declared = response.headers.get("Content-Length", "")
        too_large = MatrixProtocolError(
            f"{request.method} {request.path}: response body larger than {limit} bytes"
        )
        if declared.isdigit() and (len(declared) > 19 or int(declared) > limit):
            raise too_large
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    async def _send(self, request: Request) -> bytes:
        """Send with the client's policy; the body of a 2xx answer, or a `MatrixError`."""
        failures = 0
        rate_limited = 0
        while True:
            http_request = self._build(request)
            try:
                with _map_httpx_errors(request):
                    response = await self._http.send(http_request, stream=True)
                    try:
                        body = await self._receive(response, request)
                    finally:
                        await response.aclose()
            except MatrixUnavailable as exc:
                failures += 1
                if failures >= self.retry.attempts or not (request.idempotent or _never_sent(exc)):
                    raise
                delay = self.retry.backoff(failures)
                log.info("%s; retry %d in %.2fs", exc, failures, delay)
                await self._sleep(delay)
                continue

            status = response.status_code
            if 200 <= status < 300:
                return body
            error = parse_error(status, body, response.headers.get("Retry-After"))
            if isinstance(error, RateLimited):
                rate_limited += 1
                wait = (
                    error.retry_after_ms / 1000
                    if error.retry_after_ms is not None
                    else self.retry.backoff(rate_limited)
                )
                if rate_limited >= self.retry.rate_limit_attempts or (
                    wait > self.retry.rate_limit_max_wait
                ):
                    raise error
                log.info("%s %s rate limited; waiting %.2fs", request.method, request.path, wait)
                await self._sleep(wait)
                continue
            if status >= 500:
                failures += 1
                if failures >= self.retry.attempts or not request.idempotent:
                    raise MatrixUnavailable(
                        f"{request.method} {request.path}: server error {error}", status=status
                    ) from error
                delay = self.retry.backoff(failures)
                log.info("%s %s: %s; retry %d in %.2fs", request.method, request.path,
                         error, failures, delay)  # fmt: skip
                await self._sleep(delay)
                continue
            raise error

    async def request(self, request: Request, response_type: type[T]) -> T:
        """Send any `Request` and parse its body as ``response_type``.

        The hook for sans-I/O callers (a generator that yields `Request`
        values): ``page = await client.request(req, MessagesResponse)``.
        """
        body = await self._send(request)
        return parse(body, response_type, what=f"{request.method} {request.path}")

    async def request_bytes(self, request: Request) -> bytes:
        """Send a `Request` whose answer is not JSON (media download)."""
        return await self._send(request)

    # -- account ---------------------------------------------------------------------------

    async def versions(self) -> dict[str, Any]:
        return await self.request(_api.versions(), dict)

    async def login(
        self,
        user: str,
        password: str,
        *,
        device_id: str | None = None,
        initial_device_display_name: str | None = None,
    ) -> Session:
        """Log in with a password; pass a stored ``device_id`` to reuse that device."""
        answer = await self.request(
            _api.login_password(
                user,
                password,
                device_id=device_id,
                initial_device_display_name=initial_device_display_name,
            ),
            LoginResponse,
        )
        self.user_id, self.device_id = answer.user_id, answer.device_id
        self._access_token = answer.access_token
        return Session(self.homeserver, answer.user_id, answer.device_id, answer.access_token)

    async def register(
        self,
        username: str,
        password: str,
        *,
        device_id: str | None = None,
        initial_device_display_name: str | None = None,
    ) -> Session:
        """Register (open registration, ``m.login.dummy``) and adopt the new login."""
        answer = await self.request(
            _api.register(
                username,
                password,
                device_id=device_id,
                initial_device_display_name=initial_device_display_name,
            ),
            RegisterResponse,
        )
        if answer.access_token is None or answer.device_id is None:
            raise MatrixProtocolError("register: the server returned no login")
        self.user_id, self.device_id = answer.user_id, answer.device_id
        self._access_token = answer.access_token
        return Session(self.homeserver, answer.user_id, answer.device_id, answer.access_token)

    async def whoami(self) -> WhoAmIResponse:
        return await self.request(_api.whoami(), WhoAmIResponse)

    async def login_flows(self) -> LoginFlowsResponse:
        """The login types the homeserver offers (``GET /login``, no login needed)."""
        return await self.request(_session_api.login_flows(), LoginFlowsResponse)

    async def devices(self) -> DevicesResponse:
        """The account's devices (``GET /devices``)."""
        return await self.request(_session_api.devices(), DevicesResponse)

    async def logout(self) -> None:
        """Invalidate the token server-side and forget it here."""
        await self.request(_api.logout(), EmptyResponse)
        self._access_token = None

    # -- sync and history ------------------------------------------------------------------

    async def sync(
        self,
        *,
        since: str | None = None,
        timeout_ms: int | None = None,
        filter: str | Mapping[str, Any] | None = None,
        timeline_limit: int | None = None,
        full_state: bool | None = None,
        set_presence: str | None = None,
    ) -> SyncResponse:
        return await self.request(
            _api.sync(
                since=since,
                timeout_ms=timeout_ms,
                filter=filter,
                timeline_limit=timeline_limit,
                full_state=full_state,
                set_presence=set_presence,
            ),
            SyncResponse,
        )

    async def messages(
        self,
        room_id: str,
        *,
        from_: str | None = None,
        to: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        limit: int | None = None,
        filter: str | Mapping[str, Any] | None = None,
    ) -> MessagesResponse:
        return await self.request(
            _api.messages(room_id, from_=from_, to=to, dir=dir, limit=limit, filter=filter),
            MessagesResponse,
        )

    async def relations(
        self,
        room_id: str,
        event_id: str,
        *,
        rel_type: str | None = None,
        event_type: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        from_: str | None = None,
        to: str | None = None,
        limit: int | None = None,
        recurse: bool | None = None,
    ) -> RelationsResponse:
        return await self.request(
            _api.relations(
                room_id,
                event_id,
                rel_type=rel_type,
                event_type=event_type,
                dir=dir,
                from_=from_,
                to=to,
                limit=limit,
                recurse=recurse,
            ),
            RelationsResponse,
        )

    async def get_event(self, room_id: str, event_id: str) -> ClientEvent:
        return await self.request(_api.get_event(room_id, event_id), ClientEvent)

    async def context(
        self, room_id: str, event_id: str, *, limit: int | None = None
    ) -> ContextResponse:
        return await self.request(_api.context(room_id, event_id, limit=limit), ContextResponse)

    # -- sending ---------------------------------------------------------------------------

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str | None = None,
    ) -> str:
        """Send a room event; returns its event ID. Pass a stable ``txn_id`` to make a
        resend after a crash idempotent (a fresh one is generated otherwise)."""
        txn = txn_id if txn_id is not None else uuid.uuid4().hex
        answer = await self.request(
            _api.send_event(room_id, event_type, content, txn), SendResponse
        )
        return answer.event_id

    async def send_message(
        self, room_id: str, content: Mapping[str, Any], txn_id: str | None = None
    ) -> str:
        """Send an ``m.room.message`` with the given content; returns the event ID."""
        return await self.send_event(room_id, "m.room.message", content, txn_id)

    async def send_text(self, room_id: str, body: str, txn_id: str | None = None) -> str:
        return await self.send_message(room_id, {"msgtype": "m.text", "body": body}, txn_id)

    async def redact(
        self,
        room_id: str,
        event_id: str,
        *,
        reason: str | None = None,
        txn_id: str | None = None,
    ) -> str:
        """Redact an event; returns the redaction's event ID."""
        txn = txn_id if txn_id is not None else uuid.uuid4().hex
        answer = await self.request(
            _api.redact(room_id, event_id, txn, reason=reason), SendResponse
        )
        return answer.event_id

    async def room_state(self, room_id: str) -> list[ClientEvent]:
        return await self.request(_api.room_state(room_id), list[ClientEvent])

    async def get_state(self, room_id: str, event_type: str, state_key: str = "") -> dict[str, Any]:
        return await self.request(_api.get_state(room_id, event_type, state_key), dict)

    async def put_state(
        self, room_id: str, event_type: str, content: Mapping[str, Any], state_key: str = ""
    ) -> str:
        answer = await self.request(
            _api.put_state(room_id, event_type, content, state_key), SendResponse
        )
        return answer.event_id
