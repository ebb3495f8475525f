"""Pure request builders for the Matrix client-server API: no state, no I/O.

Each function returns a frozen `Request` describing one HTTP call (method,
percent-encoded path, query, JSON body). `MatrixClient` sends them; a test
compares them; a sans-I/O generator (the history engine's gap filler) can
yield them. Every path segment is quoted with *nothing* safe, so an ID that
contains ``/``, ``#`` or ``?`` can never split or truncate the path. The
access token never appears here: the client adds it as an ``Authorization``
header when `Request.authenticated` is true.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._request import CLIENT_V1, CLIENT_V3, MEDIA_V3, Direction, Request, _filter_param, _path, _q

__all__ = [
    "CLIENT_V1",
    "CLIENT_V3",
    "MEDIA_V3",
    "Direction",
    "Request",
    "account_data",
    "context",
    "create_room",
    "download_media",
    "get_event",
    "get_state",
    "invite",
    "join",
    "joined_members",
    "keys_changes",
    "keys_claim",
    "keys_query",
    "keys_upload",
    "kick",
    "leave",
    "login_password",
    "logout",
    "messages",
    "put_account_data",
    "put_state",
    "redact",
    "register",
    "relations",
    "room_state",
    "send_event",
    "send_receipt",
    "send_to_device",
    "set_displayname",
    "set_read_markers",
    "sync",
    "sync_filter",
    "typing",
    "upload_media",
    "versions",
    "whoami",
]


# -- session -------------------------------------------------------------------------------


def versions() -> Request:
    """``GET /_matrix/client/versions`` (unauthenticated; used as a readiness probe)."""
    return Request("GET", "/_matrix/client/versions", authenticated=False)


def login_password(
    user: str,
    password: str,
    *,
    device_id: str | None = None,
    initial_device_display_name: str | None = None,
) -> Request:
    """``POST /login`` with ``m.login.password``.

    Passing the ``device_id`` of an earlier session reuses that device (its
    sync position, keys and read markers) instead of creating a new one; only
    then is the call safe to retry, since a retry cannot mint a second device.
    """
    body: dict[str, Any] = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user},
        "password": password,
    }
    if device_id is not None:
        body["device_id"] = device_id
    if initial_device_display_name is not None:
        body["initial_device_display_name"] = initial_device_display_name
    return Request(
        "POST",
        _path(CLIENT_V3, "login"),
        json=body,
        authenticated=False,
        idempotent=device_id is not None,
    )


def register(
    username: str,
    password: str,
    *,
    device_id: str | None = None,
    initial_device_display_name: str | None = None,
    inhibit_login: bool = False,
) -> Request:
    """``POST /register`` completing the ``m.login.dummy`` flow in one step.

    For test and demo homeservers with open registration and no verification.
    """
    body: dict[str, Any] = {
        "auth": {"type": "m.login.dummy"},
        "username": username,
        "password": password,
        "inhibit_login": inhibit_login,
    }
    if device_id is not None:
        body["device_id"] = device_id
    if initial_device_display_name is not None:
        body["initial_device_display_name"] = initial_device_display_name
    return Request(
        "POST",
        _path(CLIENT_V3, "register"),
        query=(("kind", "user"),),
        json=body,
        authenticated=False,
        idempotent=False,
    )


def whoami() -> Request:
    """``GET /account/whoami``: who the token belongs to (user_id, device_id)."""
    return Request("GET", _path(CLIENT_V3, "account", "whoami"))


def logout() -> Request:
    """``POST /logout``: invalidate this token and delete its device."""
    return Request("POST", _path(CLIENT_V3, "logout"), json={})


# -- sync and history ---------------------------------------------------------------------


def sync_filter(
    *,
    timeline_limit: int | None = None,
    lazy_load_members: bool | None = None,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An inline sync filter; ``timeline_limit`` sets ``room.timeline.limit``."""
    out: dict[str, Any] = {k: v for k, v in (base or {}).items()}
    room = dict(out.get("room", {}))
    if timeline_limit is not None:
        room["timeline"] = {**room.get("timeline", {}), "limit": timeline_limit}
    if lazy_load_members is not None:
        room["state"] = {**room.get("state", {}), "lazy_load_members": lazy_load_members}
    if room:
        out["room"] = room
    return out


def sync(
    *,
    since: str | None = None,
    timeout_ms: int | None = None,
    filter: str | Mapping[str, Any] | None = None,
    timeline_limit: int | None = None,
    full_state: bool | None = None,
    set_presence: str | None = None,
) -> Request:
    """``GET /sync``.

    ``filter`` is a filter ID or an inline filter object; ``timeline_limit``
    is a shortcut that sets ``room.timeline.limit`` (merged into an inline
    filter if one is given). ``timeout_ms`` is the server's long-poll hold.
    """
    if timeline_limit is not None:
        if isinstance(filter, str):
            raise ValueError("timeline_limit cannot be combined with a stored filter ID")
        filter = sync_filter(timeline_limit=timeline_limit, base=filter)
    return Request(
        "GET",
        _path(CLIENT_V3, "sync"),
        query=_q(
            since=since,
            timeout=timeout_ms,
            filter=_filter_param(filter),
            full_state=full_state,
            set_presence=set_presence,
        ),
        long_poll_ms=timeout_ms,
    )


def messages(
    room_id: str,
    *,
    from_: str | None = None,
    to: str | None = None,
    dir: Direction | str = Direction.BACKWARD,
    limit: int | None = None,
    filter: str | Mapping[str, Any] | None = None,
) -> Request:
    """``GET /rooms/{roomId}/messages``: one page of a room's history.

    Without ``from_`` the server starts at the room's newest (``dir=b``) or
    oldest (``dir=f``) accessible event.
    """
    return Request(
        "GET",
        _path(CLIENT_V3, "rooms", room_id, "messages"),
        query=_q(
            from_=from_,
            to=to,
            dir=Direction(dir).value,
            limit=limit,
            filter=_filter_param(filter),
        ),
    )


def relations(
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
) -> Request:
    """``GET /_matrix/client/v1/rooms/{roomId}/relations/{eventId}[/{relType}[/{eventType}]]``."""
    if event_type is not None and rel_type is None:
        raise ValueError("event_type needs rel_type: the spec has no path for it alone")
    segments = ["rooms", room_id, "relations", event_id]
    if rel_type is not None:
        segments.append(rel_type)
        if event_type is not None:
            segments.append(event_type)
    return Request(
        "GET",
        _path(CLIENT_V1, *segments),
        query=_q(dir=Direction(dir).value, from_=from_, to=to, limit=limit, recurse=recurse),
    )


def get_event(room_id: str, event_id: str) -> Request:
    """``GET /rooms/{roomId}/event/{eventId}``."""
    return Request("GET", _path(CLIENT_V3, "rooms", room_id, "event", event_id))


def context(
    room_id: str,
    event_id: str,
    *,
    limit: int | None = None,
    filter: str | Mapping[str, Any] | None = None,
) -> Request:
    """``GET /rooms/{roomId}/context/{eventId}``: an event with its neighbours."""
    return Request(
        "GET",
        _path(CLIENT_V3, "rooms", room_id, "context", event_id),
        query=_q(limit=limit, filter=_filter_param(filter)),
    )


# -- sending -------------------------------------------------------------------------------


def send_event(room_id: str, event_type: str, content: Mapping[str, Any], txn_id: str) -> Request:
    """``PUT /rooms/{roomId}/send/{eventType}/{txnId}``.

    Idempotent by the spec: a repeated ``txn_id`` from the same device returns
    the first event's ID instead of sending again, so the client may retry.
    """
    return Request(
        "PUT",
        _path(CLIENT_V3, "rooms", room_id, "send", event_type, txn_id),
        json=dict(content),
    )


def redact(room_id: str, event_id: str, txn_id: str, *, reason: str | None = None) -> Request:
    """``PUT /rooms/{roomId}/redact/{eventId}/{txnId}`` (idempotent like send)."""
    body: dict[str, Any] = {} if reason is None else {"reason": reason}
    return Request("PUT", _path(CLIENT_V3, "rooms", room_id, "redact", event_id, txn_id), json=body)


def room_state(room_id: str) -> Request:
    """``GET /rooms/{roomId}/state``: the room's whole current state."""
    return Request("GET", _path(CLIENT_V3, "rooms", room_id, "state"))


def get_state(room_id: str, event_type: str, state_key: str = "") -> Request:
    """``GET /rooms/{roomId}/state/{eventType}/{stateKey}``: one state event's content."""
    return Request("GET", _path(CLIENT_V3, "rooms", room_id, "state", event_type, state_key))


def put_state(
    room_id: str, event_type: str, content: Mapping[str, Any], state_key: str = ""
) -> Request:
    """``PUT /rooms/{roomId}/state/{eventType}/{stateKey}``."""
    return Request(
        "PUT",
        _path(CLIENT_V3, "rooms", room_id, "state", event_type, state_key),
        json=dict(content),
    )


# -- rooms and membership ------------------------------------------------------------------


def create_room(
    *,
    name: str | None = None,
    topic: str | None = None,
    preset: str | None = None,
    visibility: str | None = None,
    invite: Iterable[str] = (),
    is_direct: bool | None = None,
    room_version: str | None = None,
    initial_state: Iterable[Mapping[str, Any]] = (),
    extra: Mapping[str, Any] | None = None,
) -> Request:
    """``POST /createRoom`` (not idempotent: a retry would make a second room)."""
    body: dict[str, Any] = dict(extra or {})
    for key, value in (
        ("name", name),
        ("topic", topic),
        ("preset", preset),
        ("visibility", visibility),
        ("is_direct", is_direct),
        ("room_version", room_version),
    ):
        if value is not None:
            body[key] = value
    if invites := list(invite):
        body["invite"] = invites
    if states := [dict(s) for s in initial_state]:
        body["initial_state"] = states
    return Request("POST", _path(CLIENT_V3, "createRoom"), json=body, idempotent=False)


def join(room_id_or_alias: str, *, via: Iterable[str] = ()) -> Request:
    """``POST /join/{roomIdOrAlias}`` (joining twice is harmless, so retryable)."""
    return Request(
        "POST",
        _path(CLIENT_V3, "join", room_id_or_alias),
        query=tuple(("via", server) for server in via),
        json={},
    )


def leave(room_id: str, *, reason: str | None = None) -> Request:
    """``POST /rooms/{roomId}/leave``."""
    body: dict[str, Any] = {} if reason is None else {"reason": reason}
    return Request("POST", _path(CLIENT_V3, "rooms", room_id, "leave"), json=body)


def invite(room_id: str, user_id: str, *, reason: str | None = None) -> Request:
    """``POST /rooms/{roomId}/invite`` (not retried: a second invite can be refused)."""
    body: dict[str, Any] = {"user_id": user_id}
    if reason is not None:
        body["reason"] = reason
    return Request(
        "POST", _path(CLIENT_V3, "rooms", room_id, "invite"), json=body, idempotent=False
    )


def kick(room_id: str, user_id: str, *, reason: str | None = None) -> Request:
    """``POST /rooms/{roomId}/kick`` (not retried: a second kick of a departed member fails)."""
    body: dict[str, Any] = {"user_id": user_id}
    if reason is not None:
        body["reason"] = reason
    return Request("POST", _path(CLIENT_V3, "rooms", room_id, "kick"), json=body, idempotent=False)


def joined_members(room_id: str) -> Request:
    """``GET /rooms/{roomId}/joined_members``."""
    return Request("GET", _path(CLIENT_V3, "rooms", room_id, "joined_members"))


# -- markers and account data --------------------------------------------------------------


def set_read_markers(
    room_id: str,
    *,
    fully_read: str | None = None,
    read: str | None = None,
    read_private: str | None = None,
) -> Request:
    """``POST /rooms/{roomId}/read_markers``: the fully-read marker and receipts at once."""
    body: dict[str, str] = {}
    if fully_read is not None:
        body["m.fully_read"] = fully_read
    if read is not None:
        body["m.read"] = read
    if read_private is not None:
        body["m.read.private"] = read_private
    return Request("POST", _path(CLIENT_V3, "rooms", room_id, "read_markers"), json=body)


def send_receipt(
    room_id: str,
    event_id: str,
    *,
    receipt_type: str = "m.read",
    thread_id: str | None = None,
) -> Request:
    """``POST /rooms/{roomId}/receipt/{receiptType}/{eventId}``."""
    body: dict[str, str] = {} if thread_id is None else {"thread_id": thread_id}
    return Request(
        "POST",
        _path(CLIENT_V3, "rooms", room_id, "receipt", receipt_type, event_id),
        json=body,
    )


def account_data(user_id: str, data_type: str, *, room_id: str | None = None) -> Request:
    """``GET /user/{userId}[/rooms/{roomId}]/account_data/{type}``."""
    if room_id is None:
        path = _path(CLIENT_V3, "user", user_id, "account_data", data_type)
    else:
        path = _path(CLIENT_V3, "user", user_id, "rooms", room_id, "account_data", data_type)
    return Request("GET", path)


def put_account_data(
    user_id: str, data_type: str, content: Mapping[str, Any], *, room_id: str | None = None
) -> Request:
    """``PUT /user/{userId}[/rooms/{roomId}]/account_data/{type}``."""
    get = account_data(user_id, data_type, room_id=room_id)
    return Request("PUT", get.path, json=dict(content))


# -- media ---------------------------------------------------------------------------------


def upload_media(
    data: bytes, *, content_type: str = "application/octet-stream", filename: str | None = None
) -> Request:
    """``POST /_matrix/media/v3/upload`` (not idempotent: a retry stores a second copy)."""
    return Request(
        "POST",
        _path(MEDIA_V3, "upload"),
        query=_q(filename=filename),
        content=data,
        content_type=content_type,
        idempotent=False,
    )


def download_media(server_name: str, media_id: str, *, filename: str | None = None) -> Request:
    """``GET /_matrix/client/v1/media/download/{serverName}/{mediaId}[/{fileName}]`` (authenticated media)."""
    segments = ["media", "download", server_name, media_id]
    if filename is not None:
        segments.append(filename)
    return Request("GET", _path(CLIENT_V1, *segments))


# -- end-to-end encryption keys -------------------------------------------------------------


def keys_upload(
    *,
    device_keys: Mapping[str, Any] | None = None,
    one_time_keys: Mapping[str, Any] | None = None,
    fallback_keys: Mapping[str, Any] | None = None,
) -> Request:
    """``POST /keys/upload``: this device's signed identity keys, one-time keys, fallback key.

    Retryable: the server stores a key ID once and accepts the same key again.
    """
    body: dict[str, Any] = {}
    for name, value in (
        ("device_keys", device_keys),
        ("one_time_keys", one_time_keys),
        ("fallback_keys", fallback_keys),
    ):
        if value is not None:
            body[name] = dict(value)
    return Request("POST", _path(CLIENT_V3, "keys", "upload"), json=body)


def keys_query(
    device_keys: Mapping[str, Iterable[str]], *, timeout_ms: int | None = None
) -> Request:
    """``POST /keys/query``: the device and cross-signing keys of users (an empty device
    list asks for all of a user's devices)."""
    body: dict[str, Any] = {"device_keys": {u: list(d) for u, d in device_keys.items()}}
    if timeout_ms is not None:
        body["timeout"] = timeout_ms
    return Request("POST", _path(CLIENT_V3, "keys", "query"), json=body)


def keys_claim(
    one_time_keys: Mapping[str, Mapping[str, str]], *, timeout_ms: int | None = None
) -> Request:
    """``POST /keys/claim``: one one-time key per ``{user: {device: algorithm}}``.

    Not retried: every successful claim consumes a key on the other device.
    """
    body: dict[str, Any] = {"one_time_keys": {u: dict(d) for u, d in one_time_keys.items()}}
    if timeout_ms is not None:
        body["timeout"] = timeout_ms
    return Request("POST", _path(CLIENT_V3, "keys", "claim"), json=body, idempotent=False)


def keys_changes(from_: str, to: str) -> Request:
    """``GET /keys/changes``: users whose device lists changed between two sync tokens."""
    return Request("GET", _path(CLIENT_V3, "keys", "changes"), query=_q(from_=from_, to=to))


def send_to_device(
    event_type: str, messages: Mapping[str, Mapping[str, Mapping[str, Any]]], txn_id: str
) -> Request:
    """``PUT /sendToDevice/{eventType}/{txnId}`` with ``{user: {device: content}}``.

    Idempotent by the spec, like room sends: a repeated ``txn_id`` is delivered once.
    """
    body = {"messages": {u: {d: dict(c) for d, c in by.items()} for u, by in messages.items()}}
    return Request("PUT", _path(CLIENT_V3, "sendToDevice", event_type, txn_id), json=body)


# -- timeline: typing and profile ---------------------------------------------------------


def typing(room_id: str, user_id: str, *, typing: bool, timeout_ms: int = 30_000) -> Request:
    """``PUT /rooms/{roomId}/typing/{userId}``: start (for ``timeout_ms``) or stop typing."""
    body: dict[str, Any] = {"typing": typing}
    if typing:
        body["timeout"] = timeout_ms
    return Request("PUT", _path(CLIENT_V3, "rooms", room_id, "typing", user_id), json=body)


def set_displayname(user_id: str, displayname: str) -> Request:
    """``PUT /profile/{userId}/displayname`` (the server updates every joined room's member
    event)."""
    return Request(
        "PUT",
        _path(CLIENT_V3, "profile", user_id, "displayname"),
        json={"displayname": displayname},
    )
