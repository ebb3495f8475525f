"""An in-memory Matrix homeserver for unit tests and fault injection.

`FakeHomeserver` models the parts of Synapse's client-server API that gapline
uses, and serves them through ``httpx.MockTransport``, so a real
`MatrixClient` (and everything above it) talks to it unchanged::

    fake = FakeHomeserver()
    alice = fake.register("alice")                   # -> Session
    room = fake.create_room(alice.user_id, name="demo")
    ids = fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(120)])
    fake.fail("messages", status=502, on_call=2)     # the 2nd /messages page fails once

    async with fake.client(alice) as client:         # a MatrixClient on the fake
        page = await client.messages(room, dir="b", limit=50)

Seeding methods (``register``, ``create_room``, ``send_*``, ``redact``,
``invite``/``join``/``leave``/``kick``, ``hide_history_before``, ``revoke``) act directly on the model, with no HTTP and
no faults, and take plain user IDs. Everything a client does goes through HTTP.

The model (faithful to Synapse 1.163 where it matters; tests/matrix/test_fake_parity.py
runs the same scenarios against the fake and a real Synapse; see docs/matrix.md):

- One global stream ordering; every event, receipt and account-data change
  advances it. Each room holds its events in stream order (no DAG forks).
- ``/messages`` tokens look like Synapse's (``t42-42_0_0_0_0_0_0_0_0``) and
  mean "between stream positions 42 and 43"; ``/sync`` tokens look like
  ``s42_0_0_0_0_0_0_0_0`` and are accepted by ``/messages`` too. A token that
  does not parse answers 400 ``M_INVALID_PARAM``.
- ``/messages?dir=b`` returns ``end`` on the page holding ``m.room.create``;
  only the next, empty page omits it. A page whose events are all invisible
  to the caller (see `hide_history_before`) comes back *empty but with* an
  ``end``, exactly like Synapse's post-fetch visibility filter, so a client
  must keep paging until ``end`` is absent.
- ``/sync``: default timeline limit 10, or ``filter.room.timeline.limit``;
  ``limited: true`` when more events arrived than fit, and always a
  ``prev_batch`` that paginates back from the first timeline event; the
  ``state`` block holds state between ``since`` and the timeline; receipts
  as ephemeral ``m.receipt``; ``m.fully_read`` as room account data; invites
  under ``rooms.invite``; departures under ``rooms.leave``. With ``since``
  and ``timeout`` and nothing new, it long-polls (really waits) until a
  change or the timeout.
- ``/relations``: children by ``m.relates_to.event_id``, optional rel_type /
  event_type, ``dir``, ``limit`` (default 5), ``from`` / ``next_batch``;
  ``recurse=true`` follows up to 3 levels and reports ``recursion_depth: 3``
  whatever the depth reached (as Synapse does).
- Redaction empties ``content`` (keeping ``membership`` of member events) and
  puts the redaction event under ``unsigned.redacted_because``.
- ``PUT .../send/{type}/{txnId}`` is idempotent per device and transaction ID,
  and the sending device's echo carries ``unsigned.transaction_id``.
- A member who left or was kicked may still page ``/messages``, clamped at its
  leave event; a user who never joined gets 403 ``M_FORBIDDEN``.
- A request carrying ``access_token`` in its query string is refused (400),
  so a client that leaks its token into URLs fails loudly.

Fault knobs, each returning the `Fault` it installed (``fault.fired`` counts
how often it struck). ``endpoint`` is a name from `ENDPOINTS` or ``"*"``;
``on_call=N`` strikes on the N-th matching request counted from when the
fault was installed; ``times`` is how many consecutive matching requests it
strikes (``None``: forever); ``room_id`` narrows it to one room:

- `fail`: answer an HTTP error (default 500 ``M_UNKNOWN``);
  ``fail``, ``timeout`` and ``disconnect`` take ``after_processing=True``: the
  request takes effect (the event is sent) and only the answer is lost, which
  is what makes a transaction-ID retry observable;
- `rate_limit`: 429 ``M_LIMIT_EXCEEDED`` with ``retry_after_ms``;
- `timeout`: raise ``httpx.ReadTimeout`` (MockTransport enforces no timeouts,
  so this is how a timeout is simulated);
- `disconnect`: raise ``httpx.RemoteProtocolError`` or ``httpx.ReadError``
  (the server closed the connection mid-answer);
- `stall`: sleep ``seconds`` before answering normally (to test cancellation);
- `truncate`: a 200 whose JSON body is cut short;
- `malformed`: a 200 whose body is valid JSON of the wrong shape;
- `repeat_cursor`: answer normally but with the pagination cursor equal to the
  one the request came with (``end == from`` for ``/messages``,
  ``next_batch == from`` for ``/relations``, ``next_batch == since`` for ``/sync``);
- `unknown_token`: 401 ``M_UNKNOWN_TOKEN`` (or `revoke` a real token).

Every request is recorded in `FakeHomeserver.requests` (endpoint, method,
path, query, room ID, whether it carried an Authorization header).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import itertools
import json
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import httpx
import msgspec

from ._client import MatrixClient, Session
from ._responses import ClientEvent

__all__ = [
    "ENDPOINTS",
    "FakeHomeserver",
    "Fault",
    "FaultKind",
    "RecordedRequest",
]

ENDPOINTS = frozenset(
    {
        "versions",
        "login",
        "register",
        "whoami",
        "logout",
        "sync",
        "messages",
        "relations",
        "event",
        "context",
        "send",
        "redact",
        "state",
        "create_room",
        "join",
        "leave",
        "invite",
        "kick",
        "joined_members",
        "read_markers",
        "receipt",
        "account_data",
        "upload",
        "download",
    }
)

_TOKEN_SUFFIX = "_0_0_0_0_0_0_0_0"
_TOKEN_RE = re.compile(r"^(?:t(\d+)-(\d+)|s(\d+))(?:_\d+)*$")
_RELATIONS_TOKEN_RE = re.compile(r"^r(\d+)$")
DEFAULT_TIMELINE_LIMIT = 10


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
    """One installed fault rule (see the module docstring for the kinds).

    ``seen`` counts matching requests since installation; ``fired`` how many
    of them the fault struck.
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

    def _count(self, endpoint: str, room_id: str | None) -> bool:
        """Count a request this fault applies to; True when it is due to strike."""
        if self.endpoint not in ("*", endpoint):
            return False
        if self.room_id is not None and self.room_id != room_id:
            return False
        self.seen += 1
        return self.seen >= self.on_call and (self.times is None or self.fired < self.times)


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


@dataclass
class _Event:
    stream: int
    room_id: str
    event_id: str
    type: str
    sender: str
    origin_server_ts: int
    content: dict[str, Any]
    state_key: str | None = None
    redacts: str | None = None
    redacted_because: dict[str, Any] | None = None
    # (user_id, device_id, txn_id) of a client send: echoed as unsigned.transaction_id
    # to that same device only, as Synapse does.
    sent_with: tuple[str, str, str] | None = None

    def to_json(
        self, *, with_room_id: bool = True, viewer: tuple[str, str] | None = None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event_id": self.event_id,
            "type": self.type,
            "sender": self.sender,
            "origin_server_ts": self.origin_server_ts,
            "content": self.content,
            "unsigned": {},
        }
        if with_room_id:
            out["room_id"] = self.room_id
        if self.state_key is not None:
            out["state_key"] = self.state_key
        if self.redacts is not None:
            out["redacts"] = self.redacts
        if self.redacted_because is not None:
            out["unsigned"] = {"redacted_because": self.redacted_because}
        if self.sent_with is not None and viewer == self.sent_with[:2]:
            out["unsigned"] = {**out["unsigned"], "transaction_id": self.sent_with[2]}
        return out

    def relates_to(self) -> tuple[str | None, str | None]:
        rel = self.content.get("m.relates_to")
        if not isinstance(rel, dict):
            return None, None
        target = rel.get("event_id")
        rel_type = rel.get("rel_type")
        return (
            target if isinstance(target, str) else None,
            rel_type if isinstance(rel_type, str) else None,
        )


@dataclass
class _Room:
    room_id: str
    events: list[_Event] = field(default_factory=list)
    state: dict[tuple[str, str], _Event] = field(default_factory=dict)
    by_id: dict[str, _Event] = field(default_factory=dict)
    # (stream, event_id, receipt_type, user_id, ts)
    receipts: list[tuple[int, str, str, str, int]] = field(default_factory=list)
    hidden_before: int | None = None

    def membership(self, user_id: str) -> str | None:
        member = self.state.get(("m.room.member", user_id))
        if member is None:
            return None
        value = member.content.get("membership")
        return value if isinstance(value, str) else None

    def visible(self, event: _Event) -> bool:
        return self.hidden_before is None or event.stream >= self.hidden_before


@dataclass
class _Reply:
    status: int = 200
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


class _HTTPError(Exception):
    def __init__(self, status: int, errcode: str, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.reply = _Reply(status, {"errcode": errcode, "error": error, **extra})


def _token(stream: int) -> str:
    return f"t{stream}-{stream}{_TOKEN_SUFFIX}"


def _sync_token(stream: int) -> str:
    return f"s{stream}{_TOKEN_SUFFIX}"


def _parse_token(token: str) -> int:
    match = _TOKEN_RE.match(token)
    if match is None:
        raise _HTTPError(400, "M_INVALID_PARAM", f"Invalid token: {token!r}")
    return int(match.group(2) or match.group(3))


class FakeHomeserver:
    """An in-memory homeserver behind ``httpx.MockTransport`` (see module docstring).

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
        self.server_name = server_name
        self.base_url = base_url
        self._stream = 0
        self._ticks = itertools.count()
        self._clock = clock or (lambda: 1_700_000_000_000 + 1000 * next(self._ticks))
        self._rooms: dict[str, _Room] = {}
        self._passwords: dict[str, str] = {}
        self._tokens: dict[str, tuple[str, str]] = {}
        self._txns: dict[tuple[str, str, str], str] = {}
        self._global_data: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {}
        self._room_data: dict[tuple[str, str], dict[str, tuple[int, dict[str, Any]]]] = {}
        self._media: dict[str, tuple[bytes, str]] = {}
        self._wake = asyncio.Event()
        self.faults: list[Fault] = []
        self.requests: list[RecordedRequest] = []
        self.transport = httpx.MockTransport(self.handle)

    # -- seeding (no HTTP, no faults) ------------------------------------------------------

    def user_id(self, localpart: str) -> str:
        return localpart if localpart.startswith("@") else f"@{localpart}:{self.server_name}"

    def register(
        self, localpart: str, password: str = "password", *, device_id: str | None = None
    ) -> Session:
        """Create a user (if new) and a logged-in device; returns its session."""
        user_id = self.user_id(localpart)
        self._passwords.setdefault(user_id, password)
        return self._new_login(user_id, device_id)

    def _new_login(self, user_id: str, device_id: str | None) -> Session:
        device = device_id or secrets.token_hex(5).upper()
        token = f"syt_{secrets.token_urlsafe(24)}"
        self._tokens[token] = (user_id, device)
        return Session(self.base_url, user_id, device, token)

    def revoke(self, session: Session | str) -> None:
        """Invalidate an access token (its next use answers ``M_UNKNOWN_TOKEN``)."""
        token = session.access_token if isinstance(session, Session) else session
        self._tokens.pop(token, None)

    def create_room(
        self,
        creator: str,
        *,
        name: str | None = None,
        room_id: str | None = None,
        members: Iterable[str] = (),
        history_visibility: str = "shared",
    ) -> str:
        """Create a room as the first events a real server writes; ``members`` join it.

        ``room_id`` may be forced (to test IDs with ``/``, ``#`` or ``?``).
        """
        creator = self.user_id(creator)
        rid = (
            room_id
            or f"!{secrets.token_urlsafe(12).replace('-', 'a').replace('_', 'b')}:{self.server_name}"
        )
        if rid in self._rooms:
            raise ValueError(f"room {rid} exists")
        self._rooms[rid] = _Room(rid)
        self._append(rid, creator, "m.room.create", {"creator": creator, "room_version": "10"}, "")
        self._append(rid, creator, "m.room.member", {"membership": "join"}, creator)
        self._append(
            rid,
            creator,
            "m.room.power_levels",
            {"users": {creator: 100}, "users_default": 0, "events_default": 0},
            "",
        )
        self._append(
            rid,
            creator,
            "m.room.history_visibility",
            {"history_visibility": history_visibility},
            "",
        )
        if name is not None:
            self._append(rid, creator, "m.room.name", {"name": name}, "")
        for member in members:
            self.invite(creator, rid, member)
            self.join(member, rid)
        return rid

    def invite(self, inviter: str, room_id: str, invitee: str) -> str:
        invitee = self.user_id(invitee)
        return self._append(
            room_id, self.user_id(inviter), "m.room.member", {"membership": "invite"}, invitee
        ).event_id

    def join(self, user: str, room_id: str) -> str:
        user = self.user_id(user)
        return self._append(room_id, user, "m.room.member", {"membership": "join"}, user).event_id

    def leave(self, user: str, room_id: str) -> str:
        user = self.user_id(user)
        return self._append(room_id, user, "m.room.member", {"membership": "leave"}, user).event_id

    def kick(self, by: str, room_id: str, user: str, *, reason: str | None = None) -> str:
        """Remove ``user`` as ``by`` (a leave event whose sender is not the member)."""
        content: dict[str, Any] = {"membership": "leave"}
        if reason is not None:
            content["reason"] = reason
        return self._append(
            room_id, self.user_id(by), "m.room.member", content, self.user_id(user)
        ).event_id

    def send_event(
        self,
        sender: str,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        *,
        state_key: str | None = None,
    ) -> str:
        """Append an event as ``sender``; returns its event ID."""
        return self._append(
            room_id, self.user_id(sender), event_type, dict(content), state_key
        ).event_id

    def send_text(self, sender: str, room_id: str, body: str) -> str:
        return self.send_event(
            sender, room_id, "m.room.message", {"msgtype": "m.text", "body": body}
        )

    def send_messages(self, sender: str, room_id: str, bodies: Iterable[str]) -> list[str]:
        return [self.send_text(sender, room_id, body) for body in bodies]

    def redact(self, sender: str, room_id: str, event_id: str, *, reason: str | None = None) -> str:
        """Redact ``event_id`` as ``sender``; returns the redaction's event ID."""
        return self._redact(room_id, self.user_id(sender), event_id, reason).event_id

    def hide_history_before(self, room_id: str, event_id: str) -> None:
        """Make every event older than ``event_id`` invisible to everyone, as a
        restrictive ``history_visibility`` does: ``/messages`` then returns
        empty pages *with* ``end`` over the hidden span, and finally a page
        without ``end``, never those events."""
        room = self._room(room_id)
        room.hidden_before = room.by_id[event_id].stream

    def events(self, room_id: str) -> list[ClientEvent]:
        """The room's events in stream order, as clients would parse them."""
        room = self._room(room_id)
        return [msgspec.convert(e.to_json(), ClientEvent) for e in room.events]

    def event_ids(self, room_id: str) -> list[str]:
        return [e.event_id for e in self._room(room_id).events]

    def client(self, session: Session | None = None, **kwargs: Any) -> MatrixClient:
        """A `MatrixClient` wired to this fake (and logged in as ``session``)."""
        kwargs.setdefault("transport", self.transport)
        return MatrixClient(self.base_url, session=session, **kwargs)

    # -- fault knobs -----------------------------------------------------------------------

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
        """Sleep ``seconds`` (really) before answering normally."""
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

    # -- model internals -------------------------------------------------------------------

    def _room(self, room_id: str) -> _Room:
        room = self._rooms.get(room_id)
        if room is None:
            raise _HTTPError(404, "M_NOT_FOUND", f"Unknown room {room_id}")
        return room

    def _tick(self) -> int:
        self._stream += 1
        self._wake.set()
        self._wake = asyncio.Event()
        return self._stream

    def _event_id(self, room_id: str, stream: int) -> str:
        digest = hashlib.sha256(f"{room_id}\0{stream}\0{self.server_name}".encode()).digest()
        return "$" + base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def _append(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        state_key: str | None = None,
        redacts: str | None = None,
    ) -> _Event:
        room = self._room(room_id)
        stream = self._tick()
        event = _Event(
            stream=stream,
            room_id=room_id,
            event_id=self._event_id(room_id, stream),
            type=event_type,
            sender=sender,
            origin_server_ts=self._clock(),
            content=content,
            state_key=state_key,
            redacts=redacts,
        )
        room.events.append(event)
        room.by_id[event.event_id] = event
        if state_key is not None:
            room.state[(event_type, state_key)] = event
        return event

    def _redact(self, room_id: str, sender: str, event_id: str, reason: str | None) -> _Event:
        room = self._room(room_id)
        target = room.by_id.get(event_id)
        if target is None:
            raise _HTTPError(404, "M_NOT_FOUND", "Event not found")
        content: dict[str, Any] = {"redacts": event_id}
        if reason is not None:
            content["reason"] = reason
        redaction = self._append(room_id, sender, "m.room.redaction", content, None, event_id)
        kept = (
            {"membership": target.content["membership"]} if "membership" in target.content else {}
        )
        target.content = kept
        target.redacted_because = redaction.to_json(with_room_id=False)
        return redaction

    # -- HTTP ------------------------------------------------------------------------------

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
                return self._respond(
                    _Reply(400, {"errcode": "M_NOT_JSON", "error": "Content not JSON."})
                )
        endpoint, room_id, route = self._route(request.method, segments)
        self.requests.append(
            RecordedRequest(
                endpoint=endpoint,
                method=request.method,
                path=raw_path,
                query=query,
                room_id=room_id,
                authorized="authorization" in request.headers,
                body=body,
            )
        )
        # Every fault counts every request it applies to (so on_call means the same
        # thing whatever else is installed); the first one due strikes.
        due = [f for f in list(self.faults) if f._count(endpoint, room_id)]
        fault = due[0] if due else None
        if fault is not None:
            fault.fired += 1
            if fault.kind is FaultKind.STALL:
                await asyncio.sleep(fault.seconds)
            elif fault.kind in _ERROR_KINDS and not fault.after_processing:
                return self._injected_error(fault, request)
        try:
            if route is None:
                raise _HTTPError(404, "M_UNRECOGNIZED", "Unrecognized request")
            if "access_token" in query:
                raise _HTTPError(
                    400, "M_UNRECOGNIZED", "gapline fake: access_token must not be in the URL"
                )
            reply = await route(request, query, body)
        except _HTTPError as exc:
            reply = exc.reply
        if fault is not None and fault.kind in _ERROR_KINDS:
            # after_processing: the request took effect, only its answer is lost.
            return self._injected_error(fault, request)
        if fault is not None and reply.status == 200:
            reply = self._post_fault(fault, endpoint, reply, query)
        return self._respond(reply)

    def _injected_error(self, fault: Fault, request: httpx.Request) -> httpx.Response:
        match fault.kind:
            case FaultKind.RATE_LIMIT:
                body = {
                    "errcode": "M_LIMIT_EXCEEDED",
                    "error": "Too Many Requests",
                    "retry_after_ms": fault.retry_after_ms,
                }
                return self._respond(_Reply(429, body))
            case FaultKind.UNKNOWN_TOKEN:
                body = {
                    "errcode": "M_UNKNOWN_TOKEN",
                    "error": "Unrecognised access token",
                    "soft_logout": False,
                }
                return self._respond(_Reply(401, body))
            case FaultKind.TIMEOUT:
                raise httpx.ReadTimeout("injected read timeout", request=request)
            case FaultKind.DISCONNECT:
                if fault.error == "read":
                    raise httpx.ReadError("injected connection reset", request=request)
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
        body = {"errcode": fault.errcode, "error": "injected failure"}
        return self._respond(_Reply(fault.status, body))

    def _post_fault(
        self, fault: Fault, endpoint: str, reply: _Reply, query: dict[str, str]
    ) -> _Reply:
        match fault.kind:
            case FaultKind.TRUNCATE:
                encoded = json.dumps(reply.body).encode()
                return _Reply(200, raw=encoded[: max(1, len(encoded) // 2)])
            case FaultKind.MALFORMED:
                return _Reply(
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
                return _Reply(200, out)
        return reply

    @staticmethod
    def _respond(reply: _Reply) -> httpx.Response:
        if reply.raw is not None:
            content = reply.raw
            headers = {
                "content-type": reply.headers.get("content-type", "application/json"),
                **reply.headers,
            }
        else:
            content = json.dumps(reply.body if reply.body is not None else {}).encode()
            headers = {"content-type": "application/json", **reply.headers}
        return httpx.Response(reply.status, content=content, headers=headers)

    def _route(self, method: str, seg: list[str]) -> tuple[str, str | None, Any]:
        """Map a path to (endpoint name, room ID, coroutine handler)."""
        if seg[:3] == ["_matrix", "client", "versions"]:
            return "versions", None, self._versions
        if seg[:3] == ["_matrix", "media", "v3"] and seg[3:] == ["upload"] and method == "POST":
            return "upload", None, self._upload
        if seg[:2] != ["_matrix", "client"] or len(seg) < 4:
            return "unknown", None, None
        version, rest = seg[2], seg[3:]
        if version == "v1" and rest[:2] == ["media", "download"] and len(rest) >= 4:
            return "download", None, lambda r, q, b: self._download(r, rest[2], rest[3])
        if version == "v1" and rest[0] == "rooms" and len(rest) >= 4 and rest[2] == "relations":
            room_id = rest[1]
            return "relations", room_id, lambda r, q, b: self._relations(r, q, room_id, rest[3:])
        if version != "v3":
            return "unknown", None, None
        match rest:
            case ["login"] if method == "POST":
                return "login", None, self._login
            case ["register"] if method == "POST":
                return "register", None, self._register
            case ["account", "whoami"]:
                return "whoami", None, self._whoami
            case ["logout"] if method == "POST":
                return "logout", None, self._logout
            case ["sync"]:
                return "sync", None, self._sync
            case ["createRoom"] if method == "POST":
                return "create_room", None, self._create_room
            case ["join", room]:
                return "join", room, lambda r, q, b: self._join(r, room)
            case ["user", user, "account_data", data_type]:
                return (
                    "account_data",
                    None,
                    lambda r, q, b: self._account_data(r, b, user, None, data_type),
                )
            case ["user", user, "rooms", room, "account_data", data_type]:
                return (
                    "account_data",
                    room,
                    lambda r, q, b: self._account_data(r, b, user, room, data_type),
                )
            case ["rooms", room, *tail]:
                return self._room_route(method, room, tail)
        return "unknown", None, None

    def _room_route(self, method: str, room: str, tail: list[str]) -> tuple[str, str | None, Any]:
        match tail:
            case ["messages"]:
                return "messages", room, lambda r, q, b: self._messages(r, q, room)
            case ["event", event_id]:
                return "event", room, lambda r, q, b: self._get_event(r, room, event_id)
            case ["context", event_id]:
                return "context", room, lambda r, q, b: self._context(r, q, room, event_id)
            case ["send", event_type, txn] if method == "PUT":
                return "send", room, lambda r, q, b: self._send(r, b, room, event_type, txn)
            case ["redact", event_id, txn] if method == "PUT":
                return "redact", room, lambda r, q, b: self._redact_http(r, b, room, event_id, txn)
            case ["state"]:
                return "state", room, lambda r, q, b: self._state(r, b, room, None, None)
            case ["state", event_type, *key] if len(key) <= 1:
                state_key = key[0] if key else ""
                return "state", room, lambda r, q, b: self._state(r, b, room, event_type, state_key)
            case ["leave"] if method == "POST":
                return "leave", room, lambda r, q, b: self._leave(r, room)
            case ["invite"] if method == "POST":
                return "invite", room, lambda r, q, b: self._invite(r, b, room)
            case ["kick"] if method == "POST":
                return "kick", room, lambda r, q, b: self._kick(r, b, room)
            case ["joined_members"]:
                return "joined_members", room, lambda r, q, b: self._joined_members(r, room)
            case ["read_markers"] if method == "POST":
                return "read_markers", room, lambda r, q, b: self._read_markers(r, b, room)
            case ["receipt", receipt_type, event_id] if method == "POST":
                return (
                    "receipt",
                    room,
                    lambda r, q, b: self._receipt(r, room, receipt_type, event_id),
                )
        return "unknown", room, None

    # -- auth ------------------------------------------------------------------------------

    def _auth(self, request: httpx.Request) -> tuple[str, str, str]:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            raise _HTTPError(401, "M_MISSING_TOKEN", "Missing access token")
        token = header.removeprefix("Bearer ")
        found = self._tokens.get(token)
        if found is None:
            raise _HTTPError(401, "M_UNKNOWN_TOKEN", "Unrecognised access token", soft_logout=False)
        return found[0], found[1], token

    def _reader_room(self, user_id: str, room_id: str) -> tuple[_Room, int | None]:
        """A room the user may read, and the stream position its reading is clamped
        at: ``None`` for a member; its departure for a user who left or was removed
        (Synapse lets a former member read history up to its leave event)."""
        room = self._room(room_id)
        membership = room.membership(user_id)
        if membership == "join":
            return room, None
        member = room.state.get(("m.room.member", user_id))
        was_member = any(
            e.type == "m.room.member"
            and e.state_key == user_id
            and e.content.get("membership") == "join"
            for e in room.events
        )
        if member is not None and membership in ("leave", "ban") and was_member:
            return room, member.stream
        raise _HTTPError(403, "M_FORBIDDEN", f"User {user_id} not in room {room_id}")

    def _member_room(self, user_id: str, room_id: str) -> _Room:
        room = self._room(room_id)
        if room.membership(user_id) != "join":
            raise _HTTPError(403, "M_FORBIDDEN", f"User {user_id} not in room {room_id}")
        return room

    # -- endpoints -------------------------------------------------------------------------

    async def _versions(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        return _Reply(200, {"versions": ["v1.11", "v1.12"], "unstable_features": {}})

    async def _login(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        if not isinstance(body, dict) or body.get("type") != "m.login.password":
            raise _HTTPError(400, "M_UNKNOWN", "Unknown login type")
        ident = body.get("identifier") or {}
        user = ident.get("user") if isinstance(ident, dict) else None
        if not isinstance(user, str):
            raise _HTTPError(400, "M_INVALID_PARAM", "Bad identifier")
        user_id = self.user_id(user)
        if self._passwords.get(user_id) != body.get("password"):
            raise _HTTPError(403, "M_FORBIDDEN", "Invalid username or password")
        session = self._new_login(user_id, body.get("device_id"))
        return _Reply(
            200,
            {
                "user_id": user_id,
                "access_token": session.access_token,
                "device_id": session.device_id,
            },
        )

    async def _register(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        if not isinstance(body, dict):
            raise _HTTPError(400, "M_BAD_JSON", "Body must be an object")
        auth = body.get("auth")
        if not isinstance(auth, dict) or auth.get("type") != "m.login.dummy":
            return _Reply(
                401, {"flows": [{"stages": ["m.login.dummy"]}], "params": {}, "session": "s"}
            )
        username = body.get("username") or secrets.token_hex(4)
        user_id = self.user_id(str(username))
        if user_id in self._passwords:
            raise _HTTPError(400, "M_USER_IN_USE", "User ID already taken.")
        self._passwords[user_id] = str(body.get("password", ""))
        if body.get("inhibit_login"):
            return _Reply(200, {"user_id": user_id})
        session = self._new_login(user_id, body.get("device_id"))
        return _Reply(
            200,
            {
                "user_id": user_id,
                "access_token": session.access_token,
                "device_id": session.device_id,
            },
        )

    async def _whoami(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        user_id, device_id, _ = self._auth(request)
        return _Reply(200, {"user_id": user_id, "device_id": device_id, "is_guest": False})

    async def _logout(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        _, _, token = self._auth(request)
        self._tokens.pop(token, None)
        return _Reply(200, {})

    async def _create_room(
        self, request: httpx.Request, query: dict[str, str], body: Any
    ) -> _Reply:
        user_id, _, _ = self._auth(request)
        body = body if isinstance(body, dict) else {}
        room_id = self.create_room(user_id, name=body.get("name"))
        for invitee in body.get("invite", []):
            self.invite(user_id, room_id, invitee)
        for state in body.get("initial_state", []):
            self._append(
                room_id,
                user_id,
                state["type"],
                state.get("content", {}),
                state.get("state_key", ""),
            )
        return _Reply(200, {"room_id": room_id})

    async def _join(self, request: httpx.Request, room_id: str) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._room(room_id)
        if room.membership(user_id) not in ("invite", "join"):
            raise _HTTPError(403, "M_FORBIDDEN", "You are not invited to this room.")
        if room.membership(user_id) != "join":
            self.join(user_id, room_id)
        return _Reply(200, {"room_id": room_id})

    async def _leave(self, request: httpx.Request, room_id: str) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._room(room_id)
        if room.membership(user_id) in ("join", "invite"):
            self.leave(user_id, room_id)
        return _Reply(200, {})

    async def _invite(self, request: httpx.Request, body: Any, room_id: str) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        invitee = body.get("user_id") if isinstance(body, dict) else None
        if not isinstance(invitee, str):
            raise _HTTPError(400, "M_MISSING_PARAM", "Missing user_id")
        if room.membership(invitee) == "join":
            raise _HTTPError(403, "M_FORBIDDEN", f"{invitee} is already in the room.")
        self.invite(user_id, room_id, invitee)
        return _Reply(200, {})

    async def _kick(self, request: httpx.Request, body: Any, room_id: str) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        target = body.get("user_id") if isinstance(body, dict) else None
        if not isinstance(target, str):
            raise _HTTPError(400, "M_MISSING_PARAM", "Missing user_id")
        if room.membership(target) not in ("join", "invite"):
            raise _HTTPError(403, "M_FORBIDDEN", f"{target} is not in the room.")
        reason = body.get("reason") if isinstance(body, dict) else None
        self.kick(user_id, room_id, target, reason=reason if isinstance(reason, str) else None)
        return _Reply(200, {})

    async def _joined_members(self, request: httpx.Request, room_id: str) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        joined = {
            key: {"display_name": None, "avatar_url": None}
            for (etype, key), ev in room.state.items()
            if etype == "m.room.member" and ev.content.get("membership") == "join"
        }
        return _Reply(200, {"joined": joined})

    async def _send(
        self, request: httpx.Request, body: Any, room_id: str, event_type: str, txn: str
    ) -> _Reply:
        user_id, device_id, _ = self._auth(request)
        self._member_room(user_id, room_id)
        key = (device_id, room_id, txn)
        if key in self._txns:
            return _Reply(200, {"event_id": self._txns[key]})
        event = self._append(room_id, user_id, event_type, body if isinstance(body, dict) else {})
        event.sent_with = (user_id, device_id, txn)
        self._txns[key] = event.event_id
        return _Reply(200, {"event_id": event.event_id})

    async def _redact_http(
        self, request: httpx.Request, body: Any, room_id: str, event_id: str, txn: str
    ) -> _Reply:
        user_id, device_id, _ = self._auth(request)
        self._member_room(user_id, room_id)
        key = (device_id, room_id, "redact:" + txn)
        if key in self._txns:
            return _Reply(200, {"event_id": self._txns[key]})
        reason = body.get("reason") if isinstance(body, dict) else None
        event = self._redact(room_id, user_id, event_id, reason)
        self._txns[key] = event.event_id
        return _Reply(200, {"event_id": event.event_id})

    async def _state(
        self,
        request: httpx.Request,
        body: Any,
        room_id: str,
        event_type: str | None,
        state_key: str | None,
    ) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        if event_type is None:
            return _Reply(200, [ev.to_json() for ev in room.state.values()])
        assert state_key is not None
        if request.method == "PUT":
            event = self._append(
                room_id, user_id, event_type, body if isinstance(body, dict) else {}, state_key
            )
            return _Reply(200, {"event_id": event.event_id})
        found = room.state.get((event_type, state_key))
        if found is None:
            raise _HTTPError(404, "M_NOT_FOUND", "Event not found.")
        return _Reply(200, found.content)

    async def _get_event(self, request: httpx.Request, room_id: str, event_id: str) -> _Reply:
        user_id, device_id, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        event = room.by_id.get(event_id)
        if event is None or not room.visible(event):
            raise _HTTPError(404, "M_NOT_FOUND", "Could not find event " + event_id)
        return _Reply(200, event.to_json(viewer=(user_id, device_id)))

    async def _context(
        self, request: httpx.Request, query: dict[str, str], room_id: str, event_id: str
    ) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        event = room.by_id.get(event_id)
        if event is None or not room.visible(event):
            raise _HTTPError(404, "M_NOT_FOUND", "Event not found.")
        limit = _int(query, "limit", 10)
        index = room.events.index(event)
        before_n, after_n = limit // 2, limit - limit // 2
        before = [e for e in room.events[:index] if room.visible(e)][::-1][:before_n]
        after = room.events[index + 1 : index + 1 + after_n]
        start = _token((before[-1].stream if before else event.stream) - 1)
        end = _token(after[-1].stream if after else event.stream)
        return _Reply(
            200,
            {
                "event": event.to_json(),
                "events_before": [e.to_json() for e in before],
                "events_after": [e.to_json() for e in after],
                "start": start,
                "end": end,
                "state": [e.to_json() for e in room.state.values()],
            },
        )

    async def _messages(
        self, request: httpx.Request, query: dict[str, str], room_id: str
    ) -> _Reply:
        user_id, device_id, _ = self._auth(request)
        room, clamp = self._reader_room(user_id, room_id)
        direction = query.get("dir", "b")
        if direction not in ("b", "f"):
            raise _HTTPError(400, "M_INVALID_PARAM", "dir must be b or f")
        limit = min(_int(query, "limit", 10), 1000)
        if "from" in query:
            start_token = query["from"]
            position = _parse_token(start_token)
        else:
            position = self._stream if direction == "b" else 0
            start_token = _token(position)
        to_position = _parse_token(query["to"]) if "to" in query else None
        if clamp is not None:
            if direction == "b":
                position = min(position, clamp)
            else:
                to_position = clamp if to_position is None else min(to_position, clamp)
        types = _filter_types(query.get("filter"))
        if direction == "b":
            candidates = [e for e in reversed(room.events) if e.stream <= position]
            if to_position is not None:
                candidates = [e for e in candidates if e.stream > to_position]
        else:
            candidates = [e for e in room.events if e.stream > position]
            if to_position is not None:
                candidates = [e for e in candidates if e.stream <= to_position]
        fetched = candidates[:limit]
        limited = len(candidates) > limit
        if not fetched and not limited:
            # The end of history in this direction: Synapse omits `end` only here.
            return _Reply(200, {"chunk": [], "start": start_token})
        next_position = fetched[-1].stream - 1 if direction == "b" else fetched[-1].stream
        chunk = [e for e in fetched if room.visible(e) and (types is None or e.type in types)]
        return _Reply(
            200,
            {
                "chunk": [e.to_json(viewer=(user_id, device_id)) for e in chunk],
                "start": start_token,
                "end": _token(next_position),
            },
        )

    async def _relations(
        self, request: httpx.Request, query: dict[str, str], room_id: str, tail: list[str]
    ) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        if not tail or len(tail) > 3:
            raise _HTTPError(404, "M_UNRECOGNIZED", "Unrecognized request")
        target, rel_filter, type_filter = (
            tail[0],
            (tail[1] if len(tail) > 1 else None),
            (tail[2] if len(tail) > 2 else None),
        )
        root = room.by_id.get(target)
        if root is None or not room.visible(root):
            raise _HTTPError(404, "M_NOT_FOUND", "Event not found")
        recurse = query.get("recurse", "false") == "true"
        found: list[_Event] = []
        frontier = {target}
        for _depth in range(3 if recurse else 1):
            level = []
            for event in room.events:
                parent, rel_type = event.relates_to()
                if parent not in frontier or not room.visible(event):
                    continue
                if rel_filter is not None and rel_type != rel_filter:
                    continue
                if type_filter is not None and event.type != type_filter:
                    continue
                level.append(event)
            found.extend(level)
            frontier = {e.event_id for e in level}
            if not frontier:
                break
        found.sort(key=lambda e: e.stream, reverse=query.get("dir", "b") == "b")
        if "from" in query:
            match = _RELATIONS_TOKEN_RE.match(query["from"])
            if match is None:
                raise _HTTPError(400, "M_INVALID_PARAM", "Invalid from token")
            bound = int(match.group(1))
            if query.get("dir", "b") == "b":
                found = [e for e in found if e.stream < bound]
            else:
                found = [e for e in found if e.stream > bound]
        limit = min(_int(query, "limit", 5), 1000)
        page = found[:limit]
        out: dict[str, Any] = {"chunk": [e.to_json() for e in page]}
        if len(found) > limit:
            out["next_batch"] = f"r{page[-1].stream}"
        if "from" in query:
            out["prev_batch"] = query["from"]
        if recurse:
            out["recursion_depth"] = 3  # what Synapse reports, whatever depth was reached
        return _Reply(200, out)

    async def _read_markers(self, request: httpx.Request, body: Any, room_id: str) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        body = body if isinstance(body, dict) else {}
        fully_read = body.get("m.fully_read")
        if isinstance(fully_read, str):
            self._set_data(user_id, room_id, "m.fully_read", {"event_id": fully_read})
        for receipt_type in ("m.read", "m.read.private"):
            event_id = body.get(receipt_type)
            if isinstance(event_id, str):
                room.receipts.append((self._tick(), event_id, receipt_type, user_id, self._clock()))
        return _Reply(200, {})

    async def _receipt(
        self, request: httpx.Request, room_id: str, receipt_type: str, event_id: str
    ) -> _Reply:
        user_id, _, _ = self._auth(request)
        room = self._member_room(user_id, room_id)
        if event_id not in room.by_id:
            raise _HTTPError(404, "M_NOT_FOUND", "Event not found")
        room.receipts.append((self._tick(), event_id, receipt_type, user_id, self._clock()))
        return _Reply(200, {})

    def _set_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> None:
        stream = self._tick()
        if room_id is None:
            self._global_data.setdefault(user_id, {})[data_type] = (stream, content)
        else:
            self._room_data.setdefault((user_id, room_id), {})[data_type] = (stream, content)

    async def _account_data(
        self, request: httpx.Request, body: Any, user: str, room_id: str | None, data_type: str
    ) -> _Reply:
        user_id, _, _ = self._auth(request)
        if user != user_id:
            raise _HTTPError(403, "M_FORBIDDEN", "Cannot access another user's account data")
        if request.method == "PUT":
            self._set_data(user_id, room_id, data_type, body if isinstance(body, dict) else {})
            return _Reply(200, {})
        store = (
            self._global_data.get(user_id, {})
            if room_id is None
            else self._room_data.get((user_id, room_id), {})
        )
        if data_type not in store:
            raise _HTTPError(404, "M_NOT_FOUND", "Account data not found")
        return _Reply(200, store[data_type][1])

    async def _upload(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        self._auth(request)
        media_id = secrets.token_urlsafe(12)
        self._media[media_id] = (
            request.content,
            request.headers.get("content-type", "application/octet-stream"),
        )
        return _Reply(200, {"content_uri": f"mxc://{self.server_name}/{media_id}"})

    async def _download(self, request: httpx.Request, server_name: str, media_id: str) -> _Reply:
        self._auth(request)
        found = self._media.get(media_id) if server_name == self.server_name else None
        if found is None:
            raise _HTTPError(404, "M_NOT_FOUND", "Not found")
        return _Reply(200, raw=found[0], headers={"content-type": found[1]})

    # -- sync ------------------------------------------------------------------------------

    async def _sync(self, request: httpx.Request, query: dict[str, str], body: Any) -> _Reply:
        user_id, device_id, _ = self._auth(request)
        viewer = (user_id, device_id)
        since = _parse_token(query["since"]) if "since" in query else None
        limit = _timeline_limit(query.get("filter"))
        timeout_ms = _int(query, "timeout", 0)
        full_state = query.get("full_state") == "true"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            wake = self._wake
            answer = self._sync_answer(viewer, since, limit, full_state)
            empty = (
                not any(answer["rooms"][k] for k in ("join", "invite", "leave"))
                and not answer["account_data"]["events"]
            )
            remaining = deadline - loop.time()
            if since is None or not empty or remaining <= 0:
                return _Reply(200, answer)
            try:
                async with asyncio.timeout(remaining):
                    await wake.wait()
            except TimeoutError:
                return _Reply(200, self._sync_answer(viewer, since, limit, full_state))

    def _sync_answer(
        self, viewer: tuple[str, str], since: int | None, limit: int, full_state: bool
    ) -> dict[str, Any]:
        user_id = viewer[0]
        after = since or 0
        rooms: dict[str, dict[str, Any]] = {"join": {}, "invite": {}, "leave": {}}
        for room_id, room in self._rooms.items():
            membership = room.membership(user_id)
            member_event = room.state.get(("m.room.member", user_id))
            if membership == "join":
                joined = self._joined_room(room, viewer, since, limit, full_state)
                if joined is not None:
                    rooms["join"][room_id] = joined
            elif (
                membership == "invite" and member_event is not None and member_event.stream > after
            ):
                stripped = [
                    {
                        "type": e.type,
                        "state_key": e.state_key,
                        "sender": e.sender,
                        "content": e.content,
                    }
                    for e in room.state.values()
                    if e.type in ("m.room.create", "m.room.name", "m.room.join_rules")
                    or e is member_event
                ]
                rooms["invite"][room_id] = {"invite_state": {"events": stripped}}
            elif (
                membership in ("leave", "ban")
                and since is not None
                and member_event is not None
                and member_event.stream > after
            ):
                events = [
                    e
                    for e in room.events
                    if after < e.stream <= member_event.stream and room.visible(e)
                ]
                tail = events[-limit:] if limit else []
                rooms["leave"][room_id] = {
                    "timeline": {
                        "events": [e.to_json(with_room_id=False, viewer=viewer) for e in tail],
                        "limited": len(events) > len(tail),
                        "prev_batch": _token((tail[0].stream if tail else member_event.stream) - 1),
                    },
                    "state": {"events": []},
                    "account_data": {"events": []},
                }
        account = [
            {"type": t, "content": c}
            for t, (stream, c) in self._global_data.get(user_id, {}).items()
            if stream > after
        ]
        return {
            "next_batch": _sync_token(self._stream),
            "rooms": rooms,
            "account_data": {"events": account},
        }

    def _joined_room(
        self, room: _Room, viewer: tuple[str, str], since: int | None, limit: int, full_state: bool
    ) -> dict[str, Any] | None:
        user_id = viewer[0]
        after = since or 0
        new = [e for e in room.events if e.stream > after and room.visible(e)]
        timeline = new[-limit:] if limit else []
        receipts: dict[str, dict[str, dict[str, Any]]] = {}
        for stream, event_id, receipt_type, reader, ts in room.receipts:
            if stream > after:
                receipts.setdefault(event_id, {}).setdefault(receipt_type, {})[reader] = {"ts": ts}
        room_data = [
            {"type": t, "content": c}
            for t, (stream, c) in self._room_data.get((user_id, room.room_id), {}).items()
            if stream > after
        ]
        if since is not None and not new and not receipts and not room_data and not full_state:
            return None
        timeline_start = timeline[0].stream if timeline else self._stream + 1
        if since is None or full_state:
            state = [e for e in room.state.values() if e.stream < timeline_start]
        else:
            # State that changed in the gap a limited timeline left out.
            latest: dict[tuple[str, str], _Event] = {}
            for e in room.events:
                if e.state_key is not None and after < e.stream < timeline_start:
                    latest[(e.type, e.state_key)] = e
            state = list(latest.values())
        return {
            "timeline": {
                "events": [e.to_json(with_room_id=False, viewer=viewer) for e in timeline],
                "limited": len(new) > len(timeline),
                "prev_batch": _token(timeline_start - 1),
            },
            "state": {"events": [e.to_json(with_room_id=False) for e in state]},
            "ephemeral": {
                "events": [{"type": "m.receipt", "content": receipts}] if receipts else []
            },
            "account_data": {"events": room_data},
            "unread_notifications": {"highlight_count": 0, "notification_count": 0},
        }


def _int(query: dict[str, str], key: str, default: int) -> int:
    if key not in query:
        return default
    try:
        value = int(query[key])
    except ValueError:
        raise _HTTPError(400, "M_INVALID_PARAM", f"{key} must be an integer") from None
    if value < 0:
        raise _HTTPError(400, "M_INVALID_PARAM", f"{key} must be >= 0")
    return value


def _filter_json(raw: str | None) -> dict[str, Any]:
    if raw is None or not raw.startswith("{"):
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise _HTTPError(400, "M_NOT_JSON", "filter is not JSON") from None
    return value if isinstance(value, dict) else {}


def _timeline_limit(raw: str | None) -> int:
    timeline = _filter_json(raw).get("room", {}).get("timeline", {})
    limit = (
        timeline.get("limit", DEFAULT_TIMELINE_LIMIT)
        if isinstance(timeline, dict)
        else DEFAULT_TIMELINE_LIMIT
    )
    return int(limit)


def _filter_types(raw: str | None) -> set[str] | None:
    types = _filter_json(raw).get("types")
    return set(types) if isinstance(types, list) else None
