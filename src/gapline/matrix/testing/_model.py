"""The fake's state: rooms and their events, membership, visibility, accounts.

`HomeserverModel` is what every endpoint family reads and changes, and it
carries the seeding API (``register``, ``create_room``, ``send_*``, ...) that
`FakeHomeserver` inherits: seeding acts on the model directly, with no HTTP
and no faults. Its ``_underscored`` members are the interface the endpoint
families (sibling modules) use; tests keep to the public ones.

One global stream ordering: every event, receipt and account-data change
takes the next position (`HomeserverModel._tick`), which also wakes any
long-polling ``/sync``. Each room holds its events in stream order.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from .._client import Session
from .._responses import ClientEvent
from ._wire import HTTPError

__all__ = ["EndpointFamily", "HomeserverModel", "Room", "StoredEvent"]

# (stream, value) per account-data type
AccountData = dict[str, tuple[int, dict[str, Any]]]


@dataclass
class StoredEvent:
    """One event as the fake stores it (``to_json`` is how a client receives it)."""

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
    # A state event's predecessor's content (served as unsigned.prev_content, as Synapse).
    prev_content: dict[str, Any] | None = None

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
        if self.prev_content is not None:
            out["unsigned"] = {"prev_content": self.prev_content}
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
class Room:
    room_id: str
    events: list[StoredEvent] = field(default_factory=list)
    state: dict[tuple[str, str], StoredEvent] = field(default_factory=dict)
    by_id: dict[str, StoredEvent] = field(default_factory=dict)
    # (stream, event_id, receipt_type, user_id, ts)
    receipts: list[tuple[int, str, str, str, int]] = field(default_factory=list)
    hidden_before: int | None = None
    # event ID -> the events relating to it (m.relates_to.event_id), in stream order
    children: dict[str, list[StoredEvent]] = field(default_factory=dict)
    # who types now, and the stream position of the last change (m.typing in /sync)
    typing: set[str] = field(default_factory=set)
    typing_stream: int = 0

    def membership(self, user_id: str) -> str | None:
        member = self.state.get(("m.room.member", user_id))
        if member is None:
            return None
        value = member.content.get("membership")
        return value if isinstance(value, str) else None

    def visible(self, event: StoredEvent) -> bool:
        return self.hidden_before is None or event.stream >= self.hidden_before


class HomeserverModel:
    """Rooms, accounts and account data, and the seeding API over them."""

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
        self._rooms: dict[str, Room] = {}
        self._passwords: dict[str, str] = {}
        self._tokens: dict[str, tuple[str, str]] = {}
        self._expired: set[str] = set()  # tokens soft-logged-out: the device stays
        self.login_types: list[str] = ["m.login.password"]
        """What ``GET /login`` offers; ``["m.login.sso"]`` makes an SSO-only server."""
        self._global_data: dict[str, AccountData] = {}
        self._room_data: dict[tuple[str, str], AccountData] = {}
        self._profiles: dict[str, str] = {}  # user ID -> display name
        self._wake = asyncio.Event()

    # -- seeding: accounts -----------------------------------------------------------------

    def user_id(self, localpart: str) -> str:
        return localpart if localpart.startswith("@") else f"@{localpart}:{self.server_name}"

    def register(
        self, localpart: str, password: str = "password", *, device_id: str | None = None
    ) -> Session:
        """Create a user (if new) and a logged-in device; returns its session."""
        user_id = self.user_id(localpart)
        self._passwords.setdefault(user_id, password)
        return self._new_login(user_id, device_id)

    def revoke(self, session: Session | str) -> None:
        """Invalidate an access token (its next use answers ``M_UNKNOWN_TOKEN``)."""
        token = session.access_token if isinstance(session, Session) else session
        self._tokens.pop(token, None)

    def expire(self, session: Session) -> None:
        """Soft-log-out ``session``: its token answers ``M_UNKNOWN_TOKEN`` with
        ``soft_logout: true``, and a password login with its device ID resumes it."""
        self._tokens.pop(session.access_token, None)
        self._expired.add(session.access_token)

    # -- seeding: rooms and events ---------------------------------------------------------

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
        self._rooms[rid] = Room(rid)
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
        content: dict[str, Any] = {"membership": "join"}
        if user in self._profiles:
            content["displayname"] = self._profiles[user]
        return self._append(room_id, user, "m.room.member", content, user).event_id

    def set_displayname(self, user: str, name: str) -> list[str]:
        """Set ``user``'s display name: a new member event in every room it has joined
        (as Synapse does); returns their event IDs."""
        user = self.user_id(user)
        self._profiles[user] = name
        return [
            self._append(
                rid, user, "m.room.member", {"membership": "join", "displayname": name}, user
            ).event_id
            for rid, room in self._rooms.items()
            if room.membership(user) == "join"
        ]

    def set_typing(self, user: str, room_id: str, typing: bool) -> None:
        """``user`` starts or stops typing in the room (seen as ``m.typing`` in ``/sync``)."""
        room = self._room(room_id)
        user = self.user_id(user)
        (room.typing.add if typing else room.typing.discard)(user)
        room.typing_stream = self._tick()

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

    # -- for the endpoint families ---------------------------------------------------------

    def _new_login(self, user_id: str, device_id: str | None) -> Session:
        device = device_id or secrets.token_hex(5).upper()
        token = f"syt_{secrets.token_urlsafe(24)}"
        self._tokens[token] = (user_id, device)
        return Session(self.base_url, user_id, device, token)

    def _auth(self, request: httpx.Request) -> tuple[str, str, str]:
        """(user ID, device ID, access token) of the request's bearer token (401 if none)."""
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            raise HTTPError(401, "M_MISSING_TOKEN", "Missing access token")
        token = header.removeprefix("Bearer ")
        found = self._tokens.get(token)
        if found is None:
            raise HTTPError(
                401,
                "M_UNKNOWN_TOKEN",
                "Unrecognised access token",
                soft_logout=token in self._expired,
            )
        return found[0], found[1], token

    def _room(self, room_id: str) -> Room:
        room = self._rooms.get(room_id)
        if room is None:
            raise HTTPError(404, "M_NOT_FOUND", f"Unknown room {room_id}")
        return room

    def _reader_room(self, user_id: str, room_id: str) -> tuple[Room, int | None]:
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
        raise HTTPError(403, "M_FORBIDDEN", f"User {user_id} not in room {room_id}")

    def _member_room(self, user_id: str, room_id: str) -> Room:
        room = self._room(room_id)
        if room.membership(user_id) != "join":
            raise HTTPError(403, "M_FORBIDDEN", f"User {user_id} not in room {room_id}")
        return room

    def _tick(self) -> int:
        """Take the next stream position and wake every long-polling ``/sync``."""
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
    ) -> StoredEvent:
        room = self._room(room_id)
        stream = self._tick()
        event = StoredEvent(
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
            before = room.state.get((event_type, state_key))
            if before is not None:
                event.prev_content = dict(before.content)
            room.state[(event_type, state_key)] = event
        target, _ = event.relates_to()
        if target is not None:
            room.children.setdefault(target, []).append(event)
        return event

    def _serve(
        self,
        room: Room,
        event: StoredEvent,
        *,
        viewer: tuple[str, str] | None = None,
        with_room_id: bool = True,
    ) -> dict[str, Any]:
        """An event as a client receives it, with the aggregations Synapse bundles under
        ``unsigned.m.relations``: the newest valid edit (same sender and type, not
        redacted) as a whole event, and a thread root's summary."""
        out = event.to_json(with_room_id=with_room_id, viewer=viewer)
        if event.redacted_because is not None:
            return out
        relations: dict[str, Any] = {}
        children = [c for c in room.children.get(event.event_id, ()) if c.redacted_because is None]
        edits = [
            c
            for c in children
            if c.relates_to()[1] == "m.replace"
            and c.sender == event.sender
            and c.type == event.type
            and isinstance(c.content.get("m.new_content"), dict)
        ]
        if edits and event.state_key is None:
            latest = max(edits, key=lambda c: (c.origin_server_ts, c.event_id))
            relations["m.replace"] = latest.to_json()
        replies = [c for c in children if c.relates_to()[1] == "m.thread"]
        if replies:
            user = viewer[0] if viewer is not None else None
            relations["m.thread"] = {
                "latest_event": self._serve(room, replies[-1], viewer=viewer),
                "count": len(replies),
                "current_user_participated": user is not None
                and (user == event.sender or any(r.sender == user for r in replies)),
            }
        if relations:
            out["unsigned"] = {**out["unsigned"], "m.relations": relations}
        return out

    def _redact(self, room_id: str, sender: str, event_id: str, reason: str | None) -> StoredEvent:
        """Empty ``content`` (keeping a member event's ``membership``) and record the
        redaction under ``unsigned.redacted_because``."""
        room = self._room(room_id)
        target = room.by_id.get(event_id)
        if target is None:
            raise HTTPError(404, "M_NOT_FOUND", "Event not found")
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

    def _set_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> None:
        """Set global (``room_id=None``) or per-room account data at the next stream position."""
        stream = self._tick()
        if room_id is None:
            self._global_data.setdefault(user_id, {})[data_type] = (stream, content)
        else:
            self._room_data.setdefault((user_id, room_id), {})[data_type] = (stream, content)


class EndpointFamily:
    """Base of an endpoint family: one sibling module's HTTP handlers over ``model``.

    A family keeps its own state (the send family's transaction IDs, the media
    store) and reaches rooms and accounts only through the shared model.
    """

    def __init__(self, model: HomeserverModel) -> None:
        self.model = model
