"""`FakeHomeserver`: the model, the router and the fault knobs behind one ``httpx.MockTransport``.

`FakeHomeserver.handle` is the only way in for a client: it decodes the
request, routes it, records it, and answers through `inject` so every
installed fault sees every request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

import httpx

from .._client import MatrixClient, Session
from ._faults import Fault, FaultKnobs, inject
from ._model import HomeserverModel
from ._room_keys import RoomKeysEndpoints
from ._routes import ENDPOINTS, Route, Router
from ._wire import Call, HTTPError, Reply, respond

__all__ = ["FakeHomeserver", "RecordedRequest"]


@dataclass(frozen=True)
class RecordedRequest:
    """What the fake saw of one request (for assertions on traffic)."""

    endpoint: str
    method: str
    path: str
    query: dict[str, str]
    room_id: str | None
    authorized: bool
    body: Any = None


class FakeHomeserver(HomeserverModel, FaultKnobs):
    """An in-memory homeserver behind ``httpx.MockTransport`` (see `gapline.matrix.testing`).

    ``server_name`` is the part after ``:`` in IDs; ``base_url`` is the URL
    clients are given (nothing listens there: requests go to `handle`).
    ``clock`` returns ``origin_server_ts`` values in ms; the default is
    deterministic (one second per event from 2023-11-14).
    """

    def __init__(
        self,
        server_name: str = "example.org",
        *,
        base_url: str = "https://matrix.example.org",
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(server_name, base_url=base_url, clock=clock)
        self._router = Router(self)
        self._arrived = asyncio.Event()
        self.faults: list[Fault] = []
        self.requests: list[RecordedRequest] = []
        self.transport = httpx.MockTransport(self.handle)

    @property
    def room_keys(self) -> RoomKeysEndpoints:
        """The server-side key backup (seed versions and keys, read what was stored)."""
        return self._router.room_keys

    def client(self, session: Session | None = None, **kwargs: Any) -> MatrixClient:
        """A `MatrixClient` wired to this fake (and logged in as ``session``)."""
        kwargs.setdefault("transport", self.transport)
        return MatrixClient(self.base_url, session=session, **kwargs)

    async def wait_requests(
        self, endpoint: str, count: int = 1, *, room_id: str | None = None
    ) -> None:
        """Return once ``count`` requests to ``endpoint`` (a name from `ENDPOINTS`, or
        ``"*"``), narrowed to ``room_id`` if given, are in `requests`.

        It counts from the fake's creation. When it returns, the last of them
        has been matched against every fault and has begun to be served: a
        stalled one is in its sleep, a long-polling ``/sync`` is waiting.
        """
        if endpoint != "*" and endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; one of {sorted(ENDPOINTS)}")
        while True:
            seen = sum(
                1
                for r in self.requests
                if endpoint in ("*", r.endpoint) and room_id in (None, r.room_id)
            )
            if seen >= count:
                return
            await self._arrived.wait()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        """The ``httpx.MockTransport`` handler: route, apply faults, answer."""
        raw_path = request.url.raw_path.decode("ascii").split("?", 1)[0]
        # Split BEFORE unquoting: an encoded "/" inside an ID stays inside its segment.
        segments = [unquote(s) for s in raw_path.split("/")[1:]]
        query = dict(parse_qsl(request.url.query.decode(), keep_blank_values=True))
        body: Any = None
        if request.content and request.headers.get("content-type", "").startswith(
            "application/json"
        ):
            try:
                body = json.loads(request.content)
            except ValueError:
                return respond(Reply(400, {"errcode": "M_NOT_JSON", "error": "Content not JSON."}))
        route = self._router.route(request.method, segments)
        self.requests.append(
            RecordedRequest(
                endpoint=route.endpoint,
                method=request.method,
                path=raw_path,
                query=query,
                room_id=route.room_id,
                authorized="authorization" in request.headers,
                body=body,
            )
        )
        self._arrived.set()
        self._arrived = asyncio.Event()
        call = Call(request, query, body)
        return await inject(
            self.faults,
            route.endpoint,
            route.room_id,
            request,
            query,
            lambda: _answer(route, call),
        )


async def _answer(route: Route, call: Call) -> Reply:
    """The handler's reply, or the Matrix error it raised."""
    try:
        if route.handler is None:
            raise HTTPError(404, "M_UNRECOGNIZED", "Unrecognized request")
        if "access_token" in call.query:
            raise HTTPError(
                400, "M_UNRECOGNIZED", "gapline fake: access_token must not be in the URL"
            )
        return await route.handler(call)
    except HTTPError as exc:
        return exc.reply
