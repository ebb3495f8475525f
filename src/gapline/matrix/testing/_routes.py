"""The fake's one URL table: a path to an endpoint name, its room, and its handler.

`Router` owns one instance of every endpoint family and maps each request
to a `Route`. The endpoint name is what fault knobs and the request log use,
so every name a route returns is in `ENDPOINTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._account_data import AccountDataEndpoints
from ._login import LoginEndpoints
from ._media import MediaEndpoints
from ._membership import MembershipEndpoints
from ._messages import MessagesEndpoints
from ._model import HomeserverModel
from ._receipts import ReceiptEndpoints
from ._room_keys import RoomKeysEndpoints
from ._send import SendEndpoints
from ._sync import SyncEndpoints
from ._typing import TypingEndpoints
from ._wire import Handler

__all__ = ["ENDPOINTS", "Route", "Router"]

ENDPOINTS = frozenset(
    {
        # _login
        "versions",
        "login",
        "login_flows",
        "register",
        "whoami",
        "logout",
        # _sync
        "sync",
        # _messages
        "messages",
        "relations",
        "event",
        "context",
        # _send
        "send",
        "redact",
        "state",
        # _membership
        "create_room",
        "join",
        "leave",
        "invite",
        "kick",
        "joined_members",
        # _receipts
        "read_markers",
        "receipt",
        # _account_data
        "account_data",
        # _media
        "upload",
        "download",
        # _typing
        "typing",
        "profile",
        # _room_keys
        "room_keys_version",
        "room_keys",
    }
)


@dataclass(frozen=True)
class Route:
    """Where a request goes; ``handler`` is ``None`` for a path the fake does not serve."""

    endpoint: str
    room_id: str | None = None
    handler: Handler | None = None


_UNKNOWN = Route("unknown")


class Router:
    def __init__(self, model: HomeserverModel) -> None:
        self.login = LoginEndpoints(model)
        self.membership = MembershipEndpoints(model)
        self.sync = SyncEndpoints(model)
        self.messages = MessagesEndpoints(model)
        self.send = SendEndpoints(model)
        self.receipts = ReceiptEndpoints(model)
        self.account_data = AccountDataEndpoints(model)
        self.media = MediaEndpoints(model)
        self.typing = TypingEndpoints(model)
        self.room_keys = RoomKeysEndpoints(model)

    def route(self, method: str, seg: list[str]) -> Route:
        """Map a path (split into unquoted segments) to its `Route`."""
        if seg[:3] == ["_matrix", "client", "versions"]:
            return Route("versions", None, self.login.versions)
        if seg[:3] == ["_matrix", "media", "v3"] and seg[3:] == ["upload"] and method == "POST":
            return Route("upload", None, self.media.upload)
        if seg[:2] != ["_matrix", "client"] or len(seg) < 4:
            return _UNKNOWN
        version, rest = seg[2], seg[3:]
        if version == "v1" and rest[:2] == ["media", "download"] and len(rest) >= 4:
            server, media_id = rest[2], rest[3]
            return Route("download", None, lambda c: self.media.download(c, server, media_id))
        if version == "v1" and rest[0] == "rooms" and len(rest) >= 4 and rest[2] == "relations":
            room, tail = rest[1], rest[3:]
            return Route("relations", room, lambda c: self.messages.relations(c, room, tail))
        if version != "v3":
            return _UNKNOWN
        match rest:
            case ["login"] if method == "POST":
                return Route("login", None, self.login.login)
            case ["login"] if method == "GET":
                return Route("login_flows", None, self.login.flows)
            case ["register"] if method == "POST":
                return Route("register", None, self.login.register)
            case ["account", "whoami"]:
                return Route("whoami", None, self.login.whoami)
            case ["logout"] if method == "POST":
                return Route("logout", None, self.login.logout)
            case ["sync"]:
                return Route("sync", None, self.sync.sync)
            case ["createRoom"] if method == "POST":
                return Route("create_room", None, self.membership.create_room)
            case ["join", room]:
                return Route("join", room, lambda c: self.membership.join(c, room))
            case ["user", user, "account_data", data_type]:
                return Route(
                    "account_data",
                    None,
                    lambda c: self.account_data.account_data(c, user, None, data_type),
                )
            case ["user", user, "rooms", room, "account_data", data_type]:
                return Route(
                    "account_data",
                    room,
                    lambda c: self.account_data.account_data(c, user, room, data_type),
                )
            case ["room_keys", "version", *named] if len(named) <= 1:
                version = named[0] if named else None
                return Route(
                    "room_keys_version", None, lambda c: self.room_keys.version(c, version)
                )
            case ["room_keys", "keys", *ids] if len(ids) <= 2:
                room_id = ids[0] if ids else None
                session_id = ids[1] if len(ids) > 1 else None
                return Route(
                    "room_keys",
                    room_id,
                    lambda c: self.room_keys.keys_route(c, room_id, session_id),
                )
            case ["profile", user, "displayname"] if method == "PUT":
                return Route("profile", None, lambda c: self.typing.displayname(c, user))
            case ["rooms", room, *tail]:
                return self._room_route(method, room, tail)
        return _UNKNOWN

    def _room_route(self, method: str, room: str, tail: list[str]) -> Route:
        """``/_matrix/client/v3/rooms/{roomId}/...``"""
        match tail:
            case ["messages"]:
                return Route("messages", room, lambda c: self.messages.messages(c, room))
            case ["event", event_id]:
                return Route("event", room, lambda c: self.messages.event(c, room, event_id))
            case ["context", event_id]:
                return Route("context", room, lambda c: self.messages.context(c, room, event_id))
            case ["send", event_type, txn] if method == "PUT":
                return Route("send", room, lambda c: self.send.send(c, room, event_type, txn))
            case ["redact", event_id, txn] if method == "PUT":
                return Route("redact", room, lambda c: self.send.redact(c, room, event_id, txn))
            case ["state"]:
                return Route("state", room, lambda c: self.send.state(c, room, None, None))
            case ["state", event_type, *key] if len(key) <= 1:
                state_key = key[0] if key else ""
                return Route(
                    "state", room, lambda c: self.send.state(c, room, event_type, state_key)
                )
            case ["leave"] if method == "POST":
                return Route("leave", room, lambda c: self.membership.leave(c, room))
            case ["invite"] if method == "POST":
                return Route("invite", room, lambda c: self.membership.invite(c, room))
            case ["kick"] if method == "POST":
                return Route("kick", room, lambda c: self.membership.kick(c, room))
            case ["joined_members"]:
                return Route(
                    "joined_members", room, lambda c: self.membership.joined_members(c, room)
                )
            case ["typing", user] if method == "PUT":
                return Route("typing", room, lambda c: self.typing.typing(c, room, user))
            case ["read_markers"] if method == "POST":
                return Route("read_markers", room, lambda c: self.receipts.read_markers(c, room))
            case ["receipt", receipt_type, event_id] if method == "POST":
                return Route(
                    "receipt",
                    room,
                    lambda c: self.receipts.receipt(c, room, receipt_type, event_id),
                )
        return Route("unknown", room)
