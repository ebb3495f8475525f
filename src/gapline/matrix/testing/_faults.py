"""Fault injection: the `Fault` rules, the knobs that install them, and `inject`.

Every installed fault counts every request it applies to (so ``on_call``
means the same thing whatever else is installed); the first one due strikes.
An error kind answers instead of the handler, or, with ``after_processing``,
after it (the request took effect, only its answer is lost); a stall sleeps
first; the others rewrite a successful answer.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from ._routes import ENDPOINTS
from ._wire import Reply, respond

__all__ = ["Fault", "FaultKind", "FaultKnobs", "inject"]


class FaultKind(enum.Enum):
    """What a `Fault` does to the request it strikes."""

    FAIL = "fail"
    RATE_LIMIT = "rate_limit"
    TIMEOUT = "timeout"
    DISCONNECT = "disconnect"
    STALL = "stall"
    TRUNCATE = "truncate"
    MALFORMED = "malformed"
    REPEAT_CURSOR = "repeat_cursor"
    UNKNOWN_TOKEN = "unknown_token"


_ERROR_KINDS = frozenset(
    {
        FaultKind.FAIL,
        FaultKind.RATE_LIMIT,
        FaultKind.TIMEOUT,
        FaultKind.DISCONNECT,
        FaultKind.UNKNOWN_TOKEN,
    }
)


@dataclass
class Fault:
    """One installed fault rule (see `gapline.matrix.testing` for the kinds).

    ``seen`` counts matching requests since installation; ``fired`` how many
    of them the fault struck. ``struck`` is an `asyncio.Event` set when the
    fault first strikes, before the request is answered: for a `stall`, once
    the request has arrived and begun its sleep. A test awaits it instead of
    sleeping and hoping the request got there.
    """

    kind: FaultKind
    endpoint: str = "*"
    on_call: int = 1
    times: int | None = 1
    room_id: str | None = None
    status: int = 500
    errcode: str = "M_UNKNOWN"
    retry_after_ms: int | None = None
    seconds: float = 0.0
    error: str = "remote_protocol"
    after_processing: bool = False
    seen: int = 0
    fired: int = 0
    struck: asyncio.Event = field(
        default_factory=asyncio.Event, init=False, repr=False, compare=False
    )

    def _count(self, endpoint: str, room_id: str | None) -> bool:
        """Count a request this fault applies to; True when it is due to strike."""
        if self.endpoint not in ("*", endpoint):
            return False
        if self.room_id is not None and self.room_id != room_id:
            return False
        self.seen += 1
        return self.seen >= self.on_call and (self.times is None or self.fired < self.times)


async def inject(
    faults: list[Fault],
    endpoint: str,
    room_id: str | None,
    request: httpx.Request,
    query: dict[str, str],
    answer: Callable[[], Awaitable[Reply]],
) -> httpx.Response:
    """Answer ``request`` through ``answer`` (the routed handler), with the first fault due."""
    due = [f for f in list(faults) if f._count(endpoint, room_id)]
    fault = due[0] if due else None
    if fault is not None:
        fault.fired += 1
        fault.struck.set()
        if fault.kind is FaultKind.STALL:
            await asyncio.sleep(fault.seconds)
        elif fault.kind in _ERROR_KINDS and not fault.after_processing:
            return _injected_error(fault, request)
    reply = await answer()
    if fault is not None and fault.kind in _ERROR_KINDS:
        # after_processing: the request took effect, only its answer is lost.
        return _injected_error(fault, request)
    if fault is not None and reply.status == 200:
        reply = _rewritten(fault, endpoint, reply, query)
    return respond(reply)


def _injected_error(fault: Fault, request: httpx.Request) -> httpx.Response:
    match fault.kind:
        case FaultKind.RATE_LIMIT:
            body = {
                "errcode": "M_LIMIT_EXCEEDED",
                "error": "Too Many Requests",
                "retry_after_ms": fault.retry_after_ms,
            }
            return respond(Reply(429, body))
        case FaultKind.UNKNOWN_TOKEN:
            body = {
                "errcode": "M_UNKNOWN_TOKEN",
                "error": "Unrecognised access token",
                "soft_logout": False,
            }
            return respond(Reply(401, body))
        case FaultKind.TIMEOUT:
            raise httpx.ReadTimeout("injected read timeout", request=request)
        case FaultKind.DISCONNECT:
            if fault.error == "read":
                raise httpx.ReadError("injected connection reset", request=request)
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
    body = {"errcode": fault.errcode, "error": "injected failure"}
    return respond(Reply(fault.status, body))


def _rewritten(fault: Fault, endpoint: str, reply: Reply, query: dict[str, str]) -> Reply:
    """A successful answer as a truncate, malformed or repeat-cursor fault spoils it."""
    match fault.kind:
        case FaultKind.TRUNCATE:
            encoded = json.dumps(reply.body).encode()
            return Reply(200, raw=encoded[: max(1, len(encoded) // 2)])
        case FaultKind.MALFORMED:
            return Reply(
                200, {"chunk": "not-a-list", "next_batch": 7, "start": None, "event_id": 1}
            )
        case FaultKind.REPEAT_CURSOR if isinstance(reply.body, dict):
            out = dict(reply.body)
            if endpoint == "sync":
                out["next_batch"] = query.get("since", out["next_batch"])
            elif endpoint == "messages":
                out["end"] = query.get("from", out["start"])
            elif endpoint == "relations" and "from" in query:
                out["next_batch"] = query["from"]
            return Reply(200, out)
    return reply


class FaultKnobs:
    """The knobs `FakeHomeserver` offers; each installs a `Fault` in ``faults`` and returns it.

    ``endpoint`` is a name from `ENDPOINTS` or ``"*"``; ``on_call=N`` strikes on
    the N-th matching request counted from installation; ``times`` is how many
    consecutive matching requests it strikes (``None``: forever); ``room_id``
    narrows it to one room.
    """

    faults: list[Fault]

    def add_fault(self, fault: Fault) -> Fault:
        if fault.endpoint != "*" and fault.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {fault.endpoint!r}; one of {sorted(ENDPOINTS)}")
        self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        self.faults.clear()

    def fail(
        self,
        endpoint: str,
        status: int = 500,
        *,
        errcode: str = "M_UNKNOWN",
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
        after_processing: bool = False,
    ) -> Fault:
        """Answer ``status`` with ``errcode`` (a 5xx models a sick server).

        ``after_processing=True``: the request takes effect first (the event
        is sent) and only the answer is the error, as when a proxy times out.
        """
        return self.add_fault(
            Fault(
                FaultKind.FAIL,
                endpoint,
                on_call,
                times,
                room_id,
                status=status,
                errcode=errcode,
                after_processing=after_processing,
            )
        )

    def rate_limit(
        self,
        endpoint: str,
        retry_after_ms: int = 100,
        *,
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
    ) -> Fault:
        """Answer 429 ``M_LIMIT_EXCEEDED`` with ``retry_after_ms``."""
        return self.add_fault(
            Fault(
                FaultKind.RATE_LIMIT,
                endpoint,
                on_call,
                times,
                room_id,
                retry_after_ms=retry_after_ms,
            )
        )

    def timeout(
        self,
        endpoint: str,
        *,
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
        after_processing: bool = False,
    ) -> Fault:
        """Raise ``httpx.ReadTimeout`` instead of answering; with
        ``after_processing=True`` the request took effect before the timeout."""
        return self.add_fault(
            Fault(
                FaultKind.TIMEOUT,
                endpoint,
                on_call,
                times,
                room_id,
                after_processing=after_processing,
            )
        )

    def disconnect(
        self,
        endpoint: str,
        *,
        error: str = "remote_protocol",
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
        after_processing: bool = False,
    ) -> Fault:
        """Raise ``httpx.RemoteProtocolError`` (``error="remote_protocol"``) or
        ``httpx.ReadError`` (``error="read"``): the connection closed mid-answer.
        With ``after_processing=True`` the request took effect first."""
        if error not in ("remote_protocol", "read"):
            raise ValueError("error is 'remote_protocol' or 'read'")
        return self.add_fault(
            Fault(
                FaultKind.DISCONNECT,
                endpoint,
                on_call,
                times,
                room_id,
                error=error,
                after_processing=after_processing,
            )
        )

    def stall(
        self,
        endpoint: str,
        seconds: float,
        *,
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
    ) -> Fault:
        """Sleep ``seconds`` (really) before answering normally.

        Await the returned fault's ``struck`` event to know the stalled request
        has arrived (`FakeHomeserver.wait_requests` counts every arrival).
        """
        return self.add_fault(
            Fault(FaultKind.STALL, endpoint, on_call, times, room_id, seconds=seconds)
        )

    def truncate(
        self, endpoint: str, *, on_call: int = 1, times: int | None = 1, room_id: str | None = None
    ) -> Fault:
        """Answer 200 with the JSON body cut in half."""
        return self.add_fault(Fault(FaultKind.TRUNCATE, endpoint, on_call, times, room_id))

    def malformed(
        self, endpoint: str, *, on_call: int = 1, times: int | None = 1, room_id: str | None = None
    ) -> Fault:
        """Answer 200 with valid JSON of the wrong shape."""
        return self.add_fault(Fault(FaultKind.MALFORMED, endpoint, on_call, times, room_id))

    def repeat_cursor(
        self,
        endpoint: str = "messages",
        *,
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
    ) -> Fault:
        """Answer normally but hand back the request's own cursor as the next one."""
        return self.add_fault(Fault(FaultKind.REPEAT_CURSOR, endpoint, on_call, times, room_id))

    def unknown_token(
        self,
        endpoint: str = "*",
        *,
        on_call: int = 1,
        times: int | None = 1,
        room_id: str | None = None,
    ) -> Fault:
        """Answer 401 ``M_UNKNOWN_TOKEN`` (the token itself stays valid)."""
        return self.add_fault(Fault(FaultKind.UNKNOWN_TOKEN, endpoint, on_call, times, room_id))
