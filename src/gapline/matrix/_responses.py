"""Typed, frozen shapes of the homeserver's answers, parsed at the boundary.

Bodies are decoded by msgspec straight into these structs; anything that is
not JSON or not the promised shape becomes `MatrixProtocolError` here, so no
``KeyError`` or ``TypeError`` from a bad server leaks into the engines above.
Unknown fields are ignored (servers add them freely). Event ``content`` stays
a raw ``dict`` at this boundary only: its shape depends on the event type and
the engines above interpret it.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from ._errors import MatrixHTTPError, MatrixProtocolError, error_for_status

__all__ = [
    "BasicEvent",
    "ClientEvent",
    "ContextResponse",
    "CreateRoomResponse",
    "DeviceLists",
    "EmptyResponse",
    "ErrorBody",
    "EventBlock",
    "InviteState",
    "InvitedRoom",
    "JoinResponse",
    "JoinedMembersResponse",
    "JoinedRoom",
    "KeysChangesResponse",
    "KeysClaimResponse",
    "KeysQueryResponse",
    "KeysUploadResponse",
    "LeftRoom",
    "LoginResponse",
    "MessagesResponse",
    "RegisterResponse",
    "RelationsResponse",
    "RoomMember",
    "Rooms",
    "SendResponse",
    "StateBlock",
    "StrippedStateEvent",
    "SyncResponse",
    "Timeline",
    "ToDevice",
    "ToDeviceEvent",
    "UnreadNotifications",
    "UploadResponse",
    "WhoAmIResponse",
    "parse",
    "parse_error",
]


class ClientEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A room event as the client-server API serves it (``ClientEvent`` in the spec).

    ``room_id`` is absent inside ``/sync`` (the room is the map key).
    ``redacts`` is top-level before room version 11 and inside ``content``
    from v11 on; `redacted_event_id` reads either.
    """

    event_id: str
    type: str
    sender: str
    origin_server_ts: int
    content: dict[str, Any]
    room_id: str | None = None
    state_key: str | None = None
    redacts: str | None = None
    unsigned: dict[str, Any] = {}

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    @property
    def redacted_event_id(self) -> str | None:
        """The event this redaction removes, whatever the room version."""
        if self.type != "m.room.redaction":
            return None
        inner = self.content.get("redacts")
        return self.redacts or (inner if isinstance(inner, str) else None)

    @property
    def transaction_id(self) -> str | None:
        """Set on the sender's own device's echo of an event it sent with that txn ID."""
        txn = self.unsigned.get("transaction_id")
        return txn if isinstance(txn, str) else None

    @property
    def redacted_because(self) -> dict[str, Any] | None:
        """Set when the server redacted this event (its content is then ``{}``)."""
        because = self.unsigned.get("redacted_because")
        return because if isinstance(because, dict) else None


class StrippedStateEvent(msgspec.Struct, frozen=True, kw_only=True):
    """State shown to an invited user (no event_id, no timestamp)."""

    type: str
    state_key: str
    sender: str
    content: dict[str, Any]


class BasicEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Ephemeral and account-data events: only ``type`` and ``content``."""

    type: str
    content: dict[str, Any]


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """A room's timeline slice in a sync. ``limited`` means events were left out
    between the previous sync and these; ``prev_batch`` paginates back into them."""

    events: list[ClientEvent] = []
    limited: bool = False
    prev_batch: str | None = None


class StateBlock(msgspec.Struct, frozen=True, kw_only=True):
    events: list[ClientEvent] = []


class EventBlock(msgspec.Struct, frozen=True, kw_only=True):
    events: list[BasicEvent] = []

    def of_type(self, event_type: str) -> list[BasicEvent]:
        return [e for e in self.events if e.type == event_type]


class UnreadNotifications(msgspec.Struct, frozen=True, kw_only=True):
    highlight_count: int = 0
    notification_count: int = 0


class JoinedRoom(msgspec.Struct, frozen=True, kw_only=True):
    timeline: Timeline = msgspec.field(default_factory=Timeline)
    state: StateBlock = msgspec.field(default_factory=StateBlock)
    ephemeral: EventBlock = msgspec.field(default_factory=EventBlock)
    account_data: EventBlock = msgspec.field(default_factory=EventBlock)
    unread_notifications: UnreadNotifications = msgspec.field(default_factory=UnreadNotifications)

    @property
    def fully_read(self) -> str | None:
        """The ``m.fully_read`` marker's event ID, when this sync carried it."""
        for event in self.account_data.of_type("m.fully_read"):
            event_id = event.content.get("event_id")
            if isinstance(event_id, str):
                return event_id
        return None

    @property
    def receipts(self) -> dict[str, dict[str, Any]]:
        """``m.receipt`` content merged across this sync's ephemeral events:
        ``{event_id: {receipt_type: {user_id: {"ts": ...}}}}``."""
        merged: dict[str, dict[str, Any]] = {}
        for event in self.ephemeral.of_type("m.receipt"):
            for event_id, by_type in event.content.items():
                if isinstance(by_type, dict):
                    merged.setdefault(event_id, {}).update(by_type)
        return merged


class InviteState(msgspec.Struct, frozen=True, kw_only=True):
    events: list[StrippedStateEvent] = []


class InvitedRoom(msgspec.Struct, frozen=True, kw_only=True):
    invite_state: InviteState = msgspec.field(default_factory=InviteState)


class LeftRoom(msgspec.Struct, frozen=True, kw_only=True):
    timeline: Timeline = msgspec.field(default_factory=Timeline)
    state: StateBlock = msgspec.field(default_factory=StateBlock)
    account_data: EventBlock = msgspec.field(default_factory=EventBlock)


class Rooms(msgspec.Struct, frozen=True, kw_only=True):
    join: dict[str, JoinedRoom] = {}
    invite: dict[str, InvitedRoom] = {}
    leave: dict[str, LeftRoom] = {}


class ToDeviceEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A message sent straight to this device (``m.room.encrypted`` Olm, withheld notices...).

    ``sender`` is set by the homeserver, so it is the one field here a client can rely on
    before decrypting."""

    sender: str
    type: str
    content: dict[str, Any]


class ToDevice(msgspec.Struct, frozen=True, kw_only=True):
    events: list[ToDeviceEvent] = []


class DeviceLists(msgspec.Struct, frozen=True, kw_only=True):
    """Users whose devices changed since the last sync (``changed``), or with whom this
    user no longer shares an encrypted room (``left``)."""

    changed: list[str] = []
    left: list[str] = []


class SyncResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /sync``. Pass ``next_batch`` as the next call's ``since``.

    The end-to-end encryption fields: ``device_unused_fallback_key_types`` is ``None``
    when the server did not report it (older servers), which is not the same as an
    empty list ("the fallback key was used")."""

    next_batch: str
    rooms: Rooms = msgspec.field(default_factory=Rooms)
    account_data: EventBlock = msgspec.field(default_factory=EventBlock)
    to_device: ToDevice = msgspec.field(default_factory=ToDevice)
    device_lists: DeviceLists = msgspec.field(default_factory=DeviceLists)
    device_one_time_keys_count: dict[str, int] = {}
    device_unused_fallback_key_types: list[str] | None = None


class MessagesResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /rooms/{id}/messages``. ``end`` is absent when there is no more
    history in that direction (Synapse: only on the page *after* the one
    holding ``m.room.create``)."""

    chunk: list[ClientEvent]
    start: str
    end: str | None = None
    state: list[ClientEvent] = []


class RelationsResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /rooms/{id}/relations/{eid}``. ``recursion_depth`` is set only when
    ``recurse=true`` was honoured (Synapse reports 3 whatever the real depth)."""

    chunk: list[ClientEvent]
    next_batch: str | None = None
    prev_batch: str | None = None
    recursion_depth: int | None = None


class ContextResponse(msgspec.Struct, frozen=True, kw_only=True):
    event: ClientEvent
    events_before: list[ClientEvent] = []
    events_after: list[ClientEvent] = []
    start: str | None = None
    end: str | None = None
    state: list[ClientEvent] = []


class LoginResponse(msgspec.Struct, frozen=True, kw_only=True):
    user_id: str
    access_token: str
    device_id: str
    expires_in_ms: int | None = None
    refresh_token: str | None = None

    def __repr__(self) -> str:  # never print the token
        return f"LoginResponse(user_id={self.user_id!r}, device_id={self.device_id!r})"


class RegisterResponse(msgspec.Struct, frozen=True, kw_only=True):
    user_id: str
    access_token: str | None = None
    device_id: str | None = None

    def __repr__(self) -> str:
        return f"RegisterResponse(user_id={self.user_id!r}, device_id={self.device_id!r})"


class WhoAmIResponse(msgspec.Struct, frozen=True, kw_only=True):
    user_id: str
    device_id: str | None = None
    is_guest: bool = False


class SendResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``PUT .../send`` and ``.../redact``: the ID the server gave the event."""

    event_id: str


class CreateRoomResponse(msgspec.Struct, frozen=True, kw_only=True):
    room_id: str


class JoinResponse(msgspec.Struct, frozen=True, kw_only=True):
    room_id: str


class RoomMember(msgspec.Struct, frozen=True, kw_only=True):
    display_name: str | None = None
    avatar_url: str | None = None


class JoinedMembersResponse(msgspec.Struct, frozen=True, kw_only=True):
    joined: dict[str, RoomMember] = {}


class UploadResponse(msgspec.Struct, frozen=True, kw_only=True):
    content_uri: str


class KeysUploadResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /keys/upload``: how many unclaimed one-time keys the server holds, per algorithm."""

    one_time_key_counts: dict[str, int] = {}


class KeysQueryResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /keys/query``.

    Key objects stay raw JSON objects: their signatures cover every field the signer
    sent, including ones this code does not know, so they are verified as received.
    ``device_keys`` is ``{user: {device: signed device keys}}``; the cross-signing maps
    are ``{user: signed key}``; ``failures`` maps unreachable servers to an error.
    """

    device_keys: dict[str, dict[str, dict[str, Any]]] = {}
    master_keys: dict[str, dict[str, Any]] = {}
    self_signing_keys: dict[str, dict[str, Any]] = {}
    user_signing_keys: dict[str, dict[str, Any]] = {}
    failures: dict[str, Any] = {}


class KeysClaimResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /keys/claim``: ``{user: {device: {"algorithm:key_id": signed key}}}``.

    A device with no key left (and no fallback key) is simply absent."""

    one_time_keys: dict[str, dict[str, dict[str, Any]]] = {}
    failures: dict[str, Any] = {}


class KeysChangesResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /keys/changes``: device list changes between two sync tokens."""

    changed: list[str] = []
    left: list[str] = []


class EmptyResponse(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint whose success body is ``{}`` (or carries nothing we use)."""


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    errcode: str | None = None
    error: str | None = None
    retry_after_ms: int | None = None
    soft_logout: Any = False  # any JSON: a malformed flag must not hide the errcode


T = TypeVar("T")


def parse(body: bytes, response_type: type[T], *, what: str = "response") -> T:
    """Decode ``body`` as ``response_type`` or raise `MatrixProtocolError`.

    ``response_type`` may also be ``dict`` (any JSON object) for endpoints
    whose body is free-form (state content, account data).

    Bounds: integers beyond 64 bits are an unexpected shape; nesting is bounded by
    the decoder's recursion guard (the interpreter's recursion limit, 1,000 frames by
    default), and a body nested deeper is refused like any other malformed body.
    The body size is bounded before this, by the client's ``max_response_bytes``.
    """
    try:
        return msgspec.json.decode(body, type=response_type)
    except msgspec.ValidationError as exc:
        raise MatrixProtocolError(f"{what}: unexpected shape: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise MatrixProtocolError(f"{what}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise MatrixProtocolError(f"{what}: JSON nested too deeply") from None


def parse_error(status: int, body: bytes, retry_after_header: str | None = None) -> MatrixHTTPError:
    """Turn an error answer into the matching `MatrixHTTPError` subclass.

    A non-JSON error body (a proxy's HTML page) still yields an error with
    ``errcode=None``; the ``Retry-After`` header (seconds) backs up
    ``retry_after_ms``.
    """
    info = ErrorBody()
    try:
        decoded = msgspec.json.decode(body, type=ErrorBody)
        info = decoded
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass  # keep the status; the body was not a Matrix error object
    retry_after_ms = info.retry_after_ms
    if retry_after_ms is None and retry_after_header:
        try:
            retry_after_ms = int(float(retry_after_header) * 1000)
        except (ValueError, OverflowError):  # "soon", "nan", "inf", "1e400"
            retry_after_ms = None
    return error_for_status(
        status, info.errcode, info.error, retry_after_ms, soft_logout=info.soft_logout is True
    )
